//! What a daemon answers on `/api/…`: the [`Api`] trait and its request and error types.

use futures_util::future::BoxFuture;
use http::{Method, StatusCode};
use serde_json::Value;

/// One JSON API request.
#[derive(Debug)]
pub struct Call<'a> {
    /// `GET` reads, `POST` acts.
    pub method: &'a Method,
    /// The path after `/api/`, split at `/` (empty segments dropped).
    pub path: Vec<&'a str>,
    /// The query string, if any (`limit=N` bounds list answers).
    pub query: Option<&'a str>,
    /// The JSON body of a `POST` (`Null` when empty).
    pub body: Value,
}

/// Rows a list answers with when the query gives no `limit`.
pub const DEFAULT_LIST_LIMIT: usize = 1000;

impl Call<'_> {
    /// `limit=N` from the query, else [`DEFAULT_LIST_LIMIT`].
    pub fn limit(&self) -> Result<usize, ApiError> {
        let Some(q) = self.query else {
            return Ok(DEFAULT_LIST_LIMIT);
        };
        for kv in q.split('&') {
            if let Some(v) = kv.strip_prefix("limit=") {
                return v
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("limit '{v}' is not a count")));
            }
        }
        Ok(DEFAULT_LIST_LIMIT)
    }

    /// The body's string field `name`.
    pub fn str_field(&self, name: &str) -> Result<&str, ApiError> {
        self.body
            .get(name)
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad_request(format!("the body needs a string field '{name}'")))
    }

    /// The answer for a path the daemon does not have.
    pub fn no_route(&self) -> ApiError {
        ApiError::not_found(format!(
            "no route {} /api/{} (GET /api lists them)",
            self.method,
            self.path.join("/")
        ))
    }
}

/// A route, as `GET /api` lists it.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// `GET` or `POST`.
    pub method: &'static str,
    /// The path, with `{name}` for a parameter.
    pub path: &'static str,
    /// What it does.
    pub about: &'static str,
}

/// A refused or failed request: a status and a message for the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, and what to do.
    pub message: String,
}

impl ApiError {
    /// 404.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// 409: the request is valid but the daemon's state does not allow it.
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::CONFLICT,
            message: message.into(),
        }
    }
}

/// A JSON answer or an error.
pub type Reply = Result<Value, ApiError>;

/// A daemon's JSON API.
pub trait Api: Send + Sync + 'static {
    /// Every route, for `GET /api` and the `/` index.
    fn routes(&self) -> Vec<Route>;

    /// Answer one request (`GET` reads, `POST` acts); [`Call::no_route`] for unknown paths.
    fn call<'a>(&'a self, call: Call<'a>) -> BoxFuture<'a, Reply>;

    /// `GET /health`: `Err(reason)` while the daemon cannot do its job.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
}
