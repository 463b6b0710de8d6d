//! The server's answer to one forwarded record, typed: however the record travelled (a request
//! of its own, or an entry of a batch), the forwarding shell sees one [`Answer`] and renders it
//! to the device once. The batch's answer is no longer turned into a stand-in HTTP response and
//! read back (decision W5).

use bytes::Bytes;
use http::{Response, StatusCode};
use qgate_forward::batch;
use qgate_forward::protocol::PATH_HEADER;
use qgate_transport::http3::H3Response;

/// What the server said about one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// Its status.
    pub status: StatusCode,
    /// When to try again, seconds, if the server said (a busy server or a queue that is down,
    /// decision S5).
    pub retry_after: Option<u16>,
    /// The server's body, passed on to the device as it is.
    pub body: Bytes,
}

impl Answer {
    /// The answer to a record sent as a request of its own (`Retry-After` read once, here).
    pub fn of_response(r: H3Response) -> Answer {
        let retry_after = r
            .headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        Answer {
            status: r.status,
            retry_after,
            body: r.body,
        }
    }

    /// The answer to one entry of a batch whose whole answer is `all` (its body a view of
    /// `all`'s, not a copy).
    pub fn of_result(all: &Bytes, o: &batch::Outcome<'_>) -> Answer {
        Answer {
            // A status the server cannot have meant is the backhaul's failure, not the device's.
            status: StatusCode::from_u16(o.status).unwrap_or(StatusCode::BAD_GATEWAY),
            retry_after: o.retry_after,
            body: all.slice_ref(o.body),
        }
    }

    /// The response the device gets: the server's status, body and `Retry-After`, and the
    /// backhaul path that carried it (`qgate-path`).
    pub fn to_response(&self, path: usize) -> Response<Bytes> {
        let mut r = Response::builder()
            .status(self.status)
            .header(PATH_HEADER, path);
        if let Some(s) = self.retry_after {
            r = r.header(http::header::RETRY_AFTER, s);
        }
        r.body(self.body.clone()).expect("valid response")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_answer_and_a_batch_entry_render_alike() {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::RETRY_AFTER, http::HeaderValue::from(3));
        let single = Answer::of_response(H3Response {
            status: StatusCode::SERVICE_UNAVAILABLE,
            headers,
            body: Bytes::from_static(b"busy\n"),
        });
        let all = Bytes::from_static(b"..busy\n..");
        let entry = Answer::of_result(
            &all,
            &batch::Outcome {
                status: 503,
                retry_after: Some(3),
                body: &all[2..7],
            },
        );
        assert_eq!(single, entry);
        let r = entry.to_response(2);
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[http::header::RETRY_AFTER], "3");
        assert_eq!(r.headers()[PATH_HEADER], "2");
        assert_eq!(r.body(), &Bytes::from_static(b"busy\n"));
        // The entry's body is a view of the batch's answer.
        assert_eq!(entry.body.as_ptr(), all[2..].as_ptr());
    }

    #[test]
    fn a_status_out_of_range_is_the_backhauls_failure() {
        let all = Bytes::from_static(b"x");
        let a = Answer::of_result(
            &all,
            &batch::Outcome {
                status: 17,
                retry_after: None,
                body: &all[..],
            },
        );
        assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    }
}
