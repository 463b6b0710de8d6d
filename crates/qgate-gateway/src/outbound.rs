//! How a device's request leaves the gateway for the server: as a single HTTP/3 request with
//! its [`Forwarded`] headers, at its urgency. Both the forwarding shell and the batcher send
//! through here, so a record's headers are written in one place.

use std::sync::Arc;

use http::{HeaderName, HeaderValue, Method, Request};
use qgate_forward::forwarded::Forwarded;

/// A forwarded record's facts as the gateway keeps them across attempts.
pub type Facts = Forwarded<Arc<str>>;

/// The urgency a forwarded request's backhaul stream is sent at: priority requests' bytes go
/// before best effort's on a shared connection (decision G24).
pub(crate) fn urgency(priority: bool) -> i32 {
    i32::from(priority)
}

/// The single request that carries `fwd` with `method` to the server named `authority`.
pub(crate) fn request(method: &Method, authority: &str, fwd: &Facts) -> Request<()> {
    let mut req = Request::builder()
        .method(method.clone())
        .uri(format!("https://{authority}{}", fwd.target))
        .body(())
        .expect("a target the device's request already had");
    let headers = req.headers_mut();
    fwd.emit_headers(|name, value| {
        // Names are ours (lowercase); values were checked when the gateway made them.
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    });
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use qgate_forward::scheduler::Priority;

    #[test]
    fn a_forwarded_request_parses_back_to_its_facts() {
        let fwd = Facts {
            target: "/ingest/t?x=1".into(),
            request_id: Some("gw-9".into()),
            device: Some("10.1.2.3:9".into()),
            path: Some(1),
            class: Some(Priority::Priority),
        };
        let req = request(&Method::POST, "server:4433", &fwd);
        assert_eq!(req.uri(), "https://server:4433/ingest/t?x=1");
        let target = req.uri().path_and_query().unwrap().as_str();
        let back = Forwarded::parse_headers(target, |n| req.headers().get(n).map(|v| v.as_bytes()))
            .unwrap();
        assert_eq!(back.target, "/ingest/t?x=1");
        assert_eq!(back.request_id, Some("gw-9"));
        assert_eq!(back.device, Some("10.1.2.3:9"));
        assert_eq!((back.path, back.class), (Some(1), Some(Priority::Priority)));
    }
}
