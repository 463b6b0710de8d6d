//! What became of one record, typed: stored (or already stored: a retried copy), or refused with
//! a status and why. It becomes HTTP once, at the edge: a request's answer
//! ([`Ingested::to_response`]) or an entry of a batch's answer ([`Ingested::emit_result`]), so
//! neither is built from the other and read back (decision W5).

use bytes::Bytes;
use http::{Response, StatusCode};
use qgate_forward::batch;

use crate::SinkError;

/// The outcome of storing one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingested {
    /// Stored under `id` (`duplicate`: earlier, by a copy with the same request id).
    Stored {
        /// Its id in the sink.
        id: u64,
        /// Its body's length.
        bytes: usize,
        /// A retried copy of a record already stored: answered, not stored again.
        duplicate: bool,
    },
    /// Not stored.
    Refused {
        /// The status the sender gets.
        status: StatusCode,
        /// Why, for the sender (one line).
        why: String,
        /// When to try again, seconds (a sink that is busy or full for now).
        retry_after: Option<u16>,
    },
}

impl Ingested {
    /// Refused with `status` for `why`.
    pub fn refused(status: StatusCode, why: impl Into<String>) -> Ingested {
        Ingested::Refused {
            status,
            why: why.into(),
            retry_after: None,
        }
    }

    /// Refused for the sink's reason; a sink that may take it later (503, 507) says when to try
    /// again.
    pub fn of_sink_error(e: &SinkError) -> Ingested {
        let status = e.status();
        let later = matches!(
            status,
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::INSUFFICIENT_STORAGE
        );
        Ingested::Refused {
            status,
            why: format!("{e}\n"),
            retry_after: later.then_some(1),
        }
    }

    /// Its HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Ingested::Stored { .. } => StatusCode::CREATED,
            Ingested::Refused { status, .. } => *status,
        }
    }

    /// Whether the sender is told it failed (its status is an error).
    pub fn is_error(&self) -> bool {
        let s = self.status();
        s.is_client_error() || s.is_server_error()
    }

    fn body(&self) -> Bytes {
        match self {
            Ingested::Stored {
                id,
                bytes,
                duplicate: false,
            } => Bytes::from(format!("{{\"id\":{id},\"bytes\":{bytes}}}")),
            Ingested::Stored {
                id,
                bytes,
                duplicate: true,
            } => Bytes::from(format!(
                "{{\"id\":{id},\"bytes\":{bytes},\"duplicate\":true}}"
            )),
            Ingested::Refused { why, .. } => Bytes::from(why.clone()),
        }
    }

    fn retry_after(&self) -> Option<u16> {
        match self {
            Ingested::Stored { .. } => None,
            Ingested::Refused { retry_after, .. } => *retry_after,
        }
    }

    /// The answer to a request that carried this record alone.
    pub fn to_response(&self) -> Response<Bytes> {
        let kind = match self {
            Ingested::Stored { .. } => "application/json",
            Ingested::Refused { .. } => "text/plain; charset=utf-8",
        };
        let mut r = Response::builder()
            .status(self.status())
            .header("content-type", kind);
        if let Some(s) = self.retry_after() {
            r = r.header(http::header::RETRY_AFTER, s);
        }
        r.body(self.body()).expect("valid response")
    }

    /// Its entry in a batch's answer.
    pub fn emit_result(&self, out: &mut Vec<u8>) {
        batch::emit_result(
            out,
            &batch::Outcome {
                status: self.status().as_u16(),
                retry_after: self.retry_after(),
                body: &self.body(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_and_a_batch_entry_carry_the_same_answer() {
        for i in [
            Ingested::Stored {
                id: 7,
                bytes: 3,
                duplicate: false,
            },
            Ingested::Stored {
                id: 7,
                bytes: 3,
                duplicate: true,
            },
            Ingested::of_sink_error(&SinkError::Unavailable("queue: down".into())),
            Ingested::refused(StatusCode::BAD_REQUEST, "bad\n"),
        ] {
            let r = i.to_response();
            let mut out = Vec::new();
            batch::start_results(&mut out);
            i.emit_result(&mut out);
            let o = batch::parse_results(&out, 1).unwrap()[0];
            assert_eq!(o.status, r.status().as_u16(), "{i:?}");
            assert_eq!(o.body, &r.body()[..], "{i:?}");
            let header = r
                .headers()
                .get(http::header::RETRY_AFTER)
                .map(|v| v.to_str().unwrap().parse::<u16>().unwrap());
            assert_eq!(o.retry_after, header, "{i:?}");
        }
        let busy = Ingested::of_sink_error(&SinkError::Full("nearly full".into()));
        assert_eq!(busy.status(), StatusCode::INSUFFICIENT_STORAGE);
        assert_eq!(busy.to_response().headers()[http::header::RETRY_AFTER], "1");
        assert!(busy.is_error());
    }
}
