//! A client of the admin port (`qgate ctl`): one request per connection, bounded in time and
//! in the size of the answer.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;

use crate::auth::Token;

/// Largest answer read (a metrics page of a big broker fits many times over).
const MAX_ANSWER: usize = 64 << 20;

/// A request (connection included) not answered within this fails.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Why a request to the admin port failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The address is not `HOST:PORT` or `http://HOST:PORT`.
    #[error("'{0}' is not an admin address: give HOST:PORT or http://HOST:PORT")]
    Address(String),
    /// Nothing answered.
    #[error(
        "cannot reach the admin port at {addr}: {why} (is the daemon running with --admin {addr}?)"
    )]
    Connect {
        /// Where.
        addr: String,
        /// The error.
        why: String,
    },
    /// The exchange failed or took too long.
    #[error("the admin port at {addr}: {why}")]
    Exchange {
        /// Where.
        addr: String,
        /// The error.
        why: String,
    },
}

/// Talks to one admin port.
#[derive(Debug, Clone)]
pub struct AdminClient {
    authority: String,
    token: Option<Token>,
    timeout: Duration,
}

impl AdminClient {
    /// A client of `addr` (`HOST:PORT`, `http://HOST:PORT` or `http://HOST:PORT/`); names are
    /// resolved when a request is made.
    pub fn new(addr: &str, token: Option<Token>) -> Result<AdminClient, ClientError> {
        let a = addr.trim();
        let rest = match a.split_once("://") {
            Some(("http", rest)) => rest,
            Some(_) => return Err(ClientError::Address(addr.into())),
            None => a,
        };
        let authority = rest.trim_end_matches('/');
        let valid = authority
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
            && !authority.contains('/');
        if !valid {
            return Err(ClientError::Address(addr.into()));
        }
        Ok(AdminClient {
            authority: authority.to_string(),
            token,
            timeout: REQUEST_TIMEOUT,
        })
    }

    /// `method path` with an optional JSON body; the status and the answer's bytes.
    pub async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        tokio::time::timeout(self.timeout, self.exchange(method, path, body))
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Exchange {
                    addr: self.authority.clone(),
                    why: format!("no answer within {:?}", self.timeout),
                })
            })
    }

    async fn exchange(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let fail = |why: String| ClientError::Exchange {
            addr: self.authority.clone(),
            why,
        };
        let tcp = tokio::net::TcpStream::connect(&self.authority)
            .await
            .map_err(|e| ClientError::Connect {
                addr: self.authority.clone(),
                why: e.to_string(),
            })?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let driver = tokio::spawn(conn);
        let bytes = body.map_or_else(Vec::new, |b| b.to_string().into_bytes());
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &self.authority)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(t) = &self.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {}", t.as_str()));
        }
        let req = req
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| fail(e.to_string()))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        driver.abort();
        Ok((status, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_port_or_an_http_url() {
        for ok in [
            "127.0.0.1:9464",
            "http://localhost:9464",
            "http://[::1]:1/",
            "gw.example:80",
        ] {
            assert!(AdminClient::new(ok, None).is_ok(), "{ok}");
        }
        for bad in [
            "9464",
            "https://x:1",
            "http://x",
            "x:port",
            "http://x:1/api",
            ":80",
        ] {
            assert!(AdminClient::new(bad, None).is_err(), "{bad}");
        }
    }
}
