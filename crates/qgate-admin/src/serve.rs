//! The admin HTTP server: hyper's HTTP/1.1 under per-connection bounds (decision O2).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use qgate_core::metrics::{self, Collector, Registry};
use qgate_core::quota::Quota;
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::api::{Api, Call, Route};
use crate::auth::Token;

/// Bounds on what one peer of the admin port may hold.
#[derive(Debug, Clone, Copy)]
pub struct AdminLimits {
    /// Connections served at once; more are closed on accept (and counted).
    pub max_connections: usize,
    /// Of those, from one client (an address, or an IPv6 /64): the slots are taken before any
    /// token is checked, so one unauthenticated peer must not hold them all (decision S10).
    pub max_connections_per_client: usize,
    /// A request's headers must arrive within this.
    pub header_timeout: Duration,
    /// A request, body and answer included, must be done within this.
    pub request_timeout: Duration,
    /// A connection is closed after this, keep-alive or not (a scraper reconnects).
    pub connection_lifetime: Duration,
    /// Largest request head, bytes (hyper's floor is 8 KiB).
    pub max_head: usize,
    /// Largest request body, bytes.
    pub max_body: usize,
}

impl Default for AdminLimits {
    fn default() -> Self {
        AdminLimits {
            max_connections: 64,
            max_connections_per_client: 8,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            connection_lifetime: Duration::from_secs(60),
            max_head: 16 * 1024,
            max_body: 64 * 1024,
        }
    }
}

/// Why the admin port could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No token, and an address others can reach.
    #[error("the admin port on {0} is reachable from other hosts: give it a token (--admin-token-file, [admin] token_file or QGATE_ADMIN_TOKEN), or bind it to 127.0.0.1")]
    NeedsToken(SocketAddr),
    /// The address could not be bound.
    #[error("cannot listen on {0} for the admin port: {1}")]
    Bind(SocketAddr, std::io::Error),
}

/// The admin port's entry point.
pub struct Admin;

impl Admin {
    /// A builder with no metrics, no API and no token.
    pub fn builder() -> AdminBuilder {
        AdminBuilder {
            registry: Registry::default(),
            api: None,
            token: None,
            limits: AdminLimits::default(),
        }
    }
}

/// Assembles an admin port.
pub struct AdminBuilder {
    registry: Registry,
    api: Option<Arc<dyn Api>>,
    token: Option<Token>,
    limits: AdminLimits,
}

impl AdminBuilder {
    /// Add a collector to the daemon's registry.
    pub fn metrics(mut self, collector: impl Collector) -> Self {
        self.registry.register_collector(Box::new(collector));
        self
    }

    /// The daemon's JSON API.
    pub fn api(mut self, api: impl Api) -> Self {
        self.api = Some(Arc::new(api));
        self
    }

    /// Require this bearer token on every route but `/health`.
    pub fn token(mut self, token: Option<Token>) -> Self {
        self.token = token;
        self
    }

    /// Bounds other than the defaults.
    pub fn limits(mut self, limits: AdminLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Listen on `addr` and serve (on the current tokio runtime) until the returned handle is
    /// dropped.
    pub async fn bind(self, addr: SocketAddr) -> Result<RunningAdmin, AdminError> {
        if self.token.is_none() && !addr.ip().is_loopback() {
            return Err(AdminError::NeedsToken(addr));
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| AdminError::Bind(addr, e))?;
        Ok(self.serve(listener))
    }

    /// Serve on `listener` (its address is not checked: the caller chose it).
    pub fn serve(mut self, listener: TcpListener) -> RunningAdmin {
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        let refused = prometheus_client::metrics::counter::Counter::<u64>::default();
        self.registry.register(
            "qgate_admin_connections_refused",
            "admin port connections closed on accept: every slot was taken",
            refused.clone(),
        );
        let shared = Arc::new(Shared {
            registry: self.registry,
            api: self.api,
            token: self.token,
            limits: self.limits,
            refused,
        });
        let task = tokio::spawn(accept_loop(listener, shared.clone()));
        RunningAdmin { addr, task, shared }
    }
}

/// A serving admin port; dropping it stops the accept loop.
pub struct RunningAdmin {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    shared: Arc<Shared>,
}

impl RunningAdmin {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections closed on accept because every slot was taken.
    pub fn refused(&self) -> u64 {
        self.shared.refused.get()
    }
}

impl Drop for RunningAdmin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Shared {
    registry: Registry,
    api: Option<Arc<dyn Api>>,
    token: Option<Token>,
    limits: AdminLimits,
    refused: prometheus_client::metrics::counter::Counter<u64>,
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let slots = Quota::new(
        shared.limits.max_connections,
        shared.limits.max_connections_per_client,
    );
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of descriptors, say: wait instead of spinning.
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.take(peer.ip()) else {
            shared.refused.inc();
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let l = shared.limits;
            let svc = hyper::service::service_fn(move |req| {
                let shared = shared.clone();
                async move {
                    let answer = tokio::time::timeout(l.request_timeout, handle(&shared, req))
                        .await
                        .unwrap_or_else(|_| {
                            error(StatusCode::REQUEST_TIMEOUT, "the request took too long")
                        });
                    Ok::<_, Infallible>(answer)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(l.header_timeout)
                .max_buf_size(l.max_head.max(8192))
                .serve_connection(TokioIo::new(tcp), svc);
            let _ = tokio::time::timeout(l.connection_lifetime, conn).await;
            drop(slot);
        });
    }
}

type Answer = Response<Full<Bytes>>;

/// The browser dashboard (issue 17 item 4): one page and its script, served as they are.
const DASHBOARD_HTML: &str = include_str!("dashboard/index.html");
const DASHBOARD_JS: &str = include_str!("dashboard/dashboard.js");

/// A static dashboard file, allowed to load only what comes from this port.
fn page(content_type: &str, body: &'static str) -> Answer {
    let mut a = answer(StatusCode::OK, content_type, body);
    a.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        http::HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self'",
        ),
    );
    a
}

fn answer(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Answer {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .header(header::CACHE_CONTROL, "no-store")
        .body(Full::new(body.into()))
        .expect("valid response")
}

fn json_answer(status: StatusCode, v: &Value) -> Answer {
    let mut body = serde_json::to_vec(v).expect("a Value always serializes");
    body.push(b'\n');
    answer(status, "application/json", body)
}

/// 405 with the methods the route takes (RFC 9110 §15.5.6).
fn not_allowed(allow: &'static str) -> Answer {
    let mut a = error(
        StatusCode::METHOD_NOT_ALLOWED,
        &format!("this route takes {allow}"),
    );
    a.headers_mut()
        .insert(header::ALLOW, http::HeaderValue::from_static(allow));
    a
}

fn error(status: StatusCode, message: &str) -> Answer {
    json_answer(status, &json!({ "error": message }))
}

async fn handle(shared: &Shared, req: Request<Incoming>) -> Answer {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if path == "/health" {
        if method != Method::GET {
            return not_allowed("GET");
        }
        return match shared.api.as_ref().map_or(Ok(()), |a| a.health()) {
            Ok(()) => answer(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
            Err(why) => answer(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                format!("{why}\n"),
            ),
        };
    }
    if let Err(why) = same_origin(&req, shared.token.is_some()) {
        return error(StatusCode::FORBIDDEN, why);
    }
    // The dashboard's page and script are static: a browser loads them, then asks for the
    // token the API needs.
    let wants_html = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/html"));
    match (&method, path.as_str()) {
        (&Method::GET, "/") if wants_html => {
            return page("text/html; charset=utf-8", DASHBOARD_HTML)
        }
        (&Method::GET, "/dashboard.js") => {
            return page("text/javascript; charset=utf-8", DASHBOARD_JS)
        }
        _ => {}
    }
    if let Some(t) = &shared.token {
        if !t.admits(
            req.headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
        ) {
            let mut a = error(
                StatusCode::UNAUTHORIZED,
                "this admin port needs 'Authorization: Bearer TOKEN' (qgate ctl --token-file FILE, or QGATE_ADMIN_TOKEN)",
            );
            a.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer realm=\"qgate\""),
            );
            return a;
        }
    }
    let routes = shared.api.as_ref().map(|a| a.routes()).unwrap_or_default();
    match (&method, path.as_str()) {
        (&Method::GET, "/metrics") => answer(
            StatusCode::OK,
            metrics::CONTENT_TYPE,
            metrics::encode(&shared.registry),
        ),
        (&Method::GET, "/") => answer(StatusCode::OK, "text/plain; charset=utf-8", index(&routes)),
        (&Method::GET, "/api" | "/api/") => json_answer(
            StatusCode::OK,
            &Value::Array(
                routes
                    .iter()
                    .map(|r| json!({ "method": r.method, "path": r.path, "about": r.about }))
                    .collect(),
            ),
        ),
        (m, p) if p.starts_with("/api/") => {
            let Some(api) = shared.api.clone() else {
                return error(StatusCode::NOT_FOUND, "this daemon has no JSON API");
            };
            if m != Method::GET && m != Method::POST {
                return not_allowed("GET, POST");
            }
            // A browser cannot send this type across origins without asking first.
            let json_type = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().starts_with("application/json"));
            if m == Method::POST && !json_type {
                return error(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "send POST requests with 'Content-Type: application/json' (an empty body is fine)",
                );
            }
            let query = req.uri().query().map(str::to_string);
            let body = match read_json(req, shared.limits.max_body).await {
                Ok(v) => v,
                Err(e) => return e,
            };
            let segments: Option<Vec<String>> = p["/api/".len()..]
                .split('/')
                .filter(|s| !s.is_empty())
                .map(percent_decode)
                .collect();
            let Some(segments) = segments else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "the path has a bad %-escape or is not UTF-8",
                );
            };
            let call = Call {
                method: &method,
                path: segments.iter().map(String::as_str).collect(),
                query: query.as_deref(),
                body,
            };
            match api.call(call).await {
                Ok(v) => json_answer(StatusCode::OK, &v),
                Err(e) => error(e.status, &e.message),
            }
        }
        (_, "/metrics" | "/") => not_allowed("GET"),
        _ => error(
            StatusCode::NOT_FOUND,
            &format!("no route {path}: GET / lists the routes"),
        ),
    }
}

/// Web pages must not drive the admin port from an operator's browser (decision O2): a request
/// with an `Origin` must come from the port's own origin; without a token, the `Host` must be a
/// loopback name (a rebound DNS name is refused).
fn same_origin(req: &Request<Incoming>, has_token: bool) -> Result<(), &'static str> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        if origin.as_bytes() != format!("http://{host}").as_bytes() {
            return Err("requests from another origin (a web page) are refused");
        }
    }
    if !has_token && !is_loopback_host(host) {
        return Err("this admin port has no token: it answers only to a loopback Host (127.0.0.1, [::1], localhost)");
    }
    Ok(())
}

/// A path segment with its `%XX` escapes decoded (a queue may be named `a/b`); None if an
/// escape is bad or the result is not UTF-8.
pub fn percent_decode(segment: &str) -> Option<String> {
    let b = segment.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `segment` with every byte outside RFC 3986's unreserved set `%XX`-escaped.
pub fn percent_encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A request body as JSON: `Null` when empty; 413 past `max`, 400 when not JSON.
async fn read_json(req: Request<Incoming>, max: usize) -> Result<Value, Answer> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!("the body is larger than {max} bytes"),
        ));
    }
    let bytes = match Limited::new(req.into_body(), max).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("the body is larger than {max} bytes"),
            ))
        }
        Err(e) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                &format!("could not read the body: {e}"),
            ))
        }
    };
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            &format!("the body is not JSON: {e}"),
        )
    })
}

/// The `/` page: what a newcomer can do here.
fn index(routes: &[Route]) -> String {
    let mut s = String::from(
        "qgate admin port (open it in a browser for the dashboard)\n\nGET  /health   ok, or why not\nGET  /metrics  Prometheus metrics (OpenMetrics text)\nGET  /api      the routes below, as JSON\n",
    );
    for r in routes {
        s.push_str(&format!("{:<4} /api/{}  {}\n", r.method, r.path, r.about));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_round_trip_through_percent_escapes() {
        for name in [
            "a/b",
            "sp ace",
            "/topic/x",
            "ünï",
            "plain-name_1.2~",
            "100%",
        ] {
            let e = percent_encode(name);
            assert!(!e.contains('/') && !e.contains(' '), "{e}");
            assert_eq!(percent_decode(&e).as_deref(), Some(name));
        }
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("%ff"), None);
    }

    #[test]
    fn loopback_hosts_are_literal_loopback_or_localhost() {
        for ok in [
            "127.0.0.1:9464",
            "127.1.2.3",
            "[::1]:80",
            "[::1]",
            "localhost",
            "LocalHost:1",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "",
            "evil.example:9464",
            "10.0.0.1:80",
            "[::2]:1",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
