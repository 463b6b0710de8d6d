//! A device: registers with a gateway for a Hash ID (paper 000 Fig. 2 steps 4–6), then sends
//! records carrying it (step 10); or, returning on a resumed connection, sends its first
//! records in 0-RTT with its class instead, each under its own request id, and learns its Hash
//! ID from the first answer (decision G18). Used by `qgate device`, the demo and the
//! experiments.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use bytes::Bytes;
use qgate_transport::http3::{H3Client, H3Error};
use tokio::time::Instant;

use qgate_core::sync::lock;
use qgate_forward::protocol::{
    emit_device_request_id, emit_priority, parse_path, Registered, HASH_ID_HEADER, PATH_HEADER,
    PRIORITY_HEADER, REQUEST_ID_HEADER,
};
use qgate_forward::scheduler::Priority;
use qgate_forward::session::HashId;

/// Why a device operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The HTTP/3 exchange failed.
    #[error(transparent)]
    H3(#[from] H3Error),
    /// The gateway answered with an error.
    #[error("the gateway answered {status}: {body}")]
    Refused {
        /// Status.
        status: http::StatusCode,
        /// Its explanation.
        body: String,
        /// When to try again, if it said (`Retry-After` in seconds).
        retry_after: Option<Duration>,
    },
}

impl DeviceError {
    /// Worth sending the same record again later: the server's queue or every backhaul path was
    /// unavailable (503, 502), its disk had no room (507), or the exchange itself failed. Returns how long to wait first.
    pub fn retry_in(&self) -> Option<Duration> {
        match self {
            DeviceError::Refused {
                status,
                retry_after,
                ..
            } if *status == http::StatusCode::SERVICE_UNAVAILABLE
                || *status == http::StatusCode::BAD_GATEWAY
                // The server's disk room (S11): it frees as the disk is cleared.
                || *status == http::StatusCode::INSUFFICIENT_STORAGE =>
            {
                // Never sooner than 100 ms: `Retry-After: 0` must not make a busy loop.
                Some(
                    retry_after
                        .unwrap_or(Duration::from_secs(1))
                        .max(Duration::from_millis(100)),
                )
            }
            // Too early (RFC 8470): sent in 0-RTT without what the gateway needs to take it
            // then; again once the handshake is done.
            DeviceError::Refused { status, .. } if status.as_u16() == 425 => {
                Some(Duration::from_millis(100))
            }
            DeviceError::Refused { .. } => None,
            DeviceError::H3(H3Error::TimedOut(_)) => Some(Duration::from_secs(1)),
            DeviceError::H3(_) => None,
        }
    }
}

/// A record not answered within this long is given up (its stream cancelled): longer than the
/// gateway's whole retry budget (its attempts × its request timeout).
pub const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// A device on one HTTP/3 connection to a gateway.
pub struct Device {
    /// Shared by the sessions registered on one connection ([`Device::also`]).
    h3: Arc<H3Client>,
    /// Its Hash ID: from registration, or from the first answer to a device registered on
    /// first use; forgotten when the gateway no longer knows it (the device then registers on
    /// first use again).
    hash: Mutex<Option<String>>,
    priority: Priority,
    /// Where request ids come from, when the device names its requests.
    ids: Option<Mutex<ChaCha20Rng>>,
}

/// One record's outcome.
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    /// Request sent → response received.
    pub delay: Duration,
    /// The backhaul path the gateway used, if it said.
    pub path: Option<usize>,
}

impl Device {
    /// Register over `h3` with `priority` (true = class 1).
    pub async fn register(h3: H3Client, priority: bool) -> Result<Device, DeviceError> {
        Self::register_on(Arc::new(h3), priority, None).await
    }

    /// [`register`](Self::register) proving who it is with `token` (decision G33), for a
    /// gateway that takes device tokens: the connection keeps that identity from then on.
    pub async fn register_with_token(
        h3: H3Client,
        priority: bool,
        token: &str,
    ) -> Result<Device, DeviceError> {
        Self::register_on(Arc::new(h3), priority, Some(token)).await
    }

    /// Register another session, of class `priority`, on this device's connection: a device
    /// that sends both classes (paper 000 §4.1) holds one session per class.
    pub async fn also(&self, priority: bool) -> Result<Device, DeviceError> {
        Self::register_on(self.h3.clone(), priority, None).await
    }

    /// A device that registers on first use (decision G18): no exchange now; its first record
    /// carries its class, and the answer its Hash ID. Each record goes under a request id of
    /// 128 bits drawn from a generator seeded with `ids` ([`random_id_seed`] in deployment, the
    /// scenario's seed in simulation), so it may ride in 0-RTT and a copy of it is stored once.
    pub fn first_use(h3: Arc<H3Client>, priority: bool, ids: [u8; 32]) -> Device {
        Device {
            h3,
            hash: Mutex::new(None),
            priority: class(priority),
            ids: Some(Mutex::new(ChaCha20Rng::from_seed(ids))),
        }
    }

    /// Name every request from now on with ids drawn from a generator seeded with `ids` (see
    /// [`first_use`](Self::first_use)).
    pub fn with_request_ids(mut self, ids: [u8; 32]) -> Device {
        self.ids = Some(Mutex::new(ChaCha20Rng::from_seed(ids)));
        self
    }

    async fn register_on(
        h3: Arc<H3Client>,
        priority: bool,
        token: Option<&str>,
    ) -> Result<Device, DeviceError> {
        let mut req = http::Request::post("https://gateway/register")
            .header(PRIORITY_HEADER, emit_priority(class(priority)));
        if let Some(t) = token {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req.body(()).expect("valid request");
        let r = h3.request(req, Bytes::new(), 4096).await?;
        let body = String::from_utf8_lossy(&r.body).to_string();
        if r.status != http::StatusCode::CREATED {
            return Err(DeviceError::Refused {
                status: r.status,
                body: body.trim().to_string(),
                retry_after: retry_after(&r.headers),
            });
        }
        let hash = Registered::parse(&r.body)
            .map_err(|e| DeviceError::Refused {
                status: r.status,
                body: e.to_string(),
                retry_after: None,
            })?
            .hash
            .to_string();
        Ok(Device {
            h3,
            hash: Mutex::new(Some(hash)),
            priority: class(priority),
            ids: None,
        })
    }

    /// The Hash ID the gateway issued, once known.
    pub fn hash_id(&self) -> Option<String> {
        lock(&self.hash).clone()
    }

    /// A new request id, if the device names its requests. Send a record again under the same
    /// id ([`send_as`](Self::send_as)) and the server stores it once.
    pub fn next_request_id(&self) -> Option<String> {
        self.ids
            .as_ref()
            .map(|g| emit_device_request_id(lock(g).random::<u128>()))
    }

    /// Send one record to `path` (e.g. `/ingest/sensors`) through the gateway, under a new
    /// request id if the device names its requests. To send a record again, use
    /// [`send_as`](Self::send_as) with the id it went under the first time: a new id would
    /// make a new record if the first one (or a copy of it) did arrive.
    pub async fn send(&self, path: &str, record: Bytes) -> Result<Sent, DeviceError> {
        let id = self.next_request_id();
        self.send_as(path, record, id.as_deref()).await
    }

    /// [`send`](Self::send) under request id `id` (from [`next_request_id`](Self::next_request_id)).
    pub async fn send_as(
        &self,
        path: &str,
        record: Bytes,
        id: Option<&str>,
    ) -> Result<Sent, DeviceError> {
        let mut req = http::Request::post(format!("https://gateway{path}"));
        let hash = self.hash_id();
        req = match &hash {
            Some(h) => req.header(HASH_ID_HEADER, h.as_str()),
            None => req.header(PRIORITY_HEADER, emit_priority(self.priority)),
        };
        if let Some(id) = id {
            req = req.header(REQUEST_ID_HEADER, id);
        }
        let req = req.body(()).expect("valid request");
        let t = Instant::now();
        let r = self
            .h3
            .request_within(req, record, 1 << 16, SEND_TIMEOUT)
            .await?;
        // A session made on first use: the answer names it (checked: 32 hex digits).
        if let Some(h) = r.headers.get(HASH_ID_HEADER) {
            if let Ok(h) = h.to_str().unwrap_or("").parse::<HashId>() {
                *lock(&self.hash) = Some(h.to_string());
            }
        }
        // The gateway no longer knows the session (it expired): a device that can register on
        // first use does so with its next record.
        if r.status == http::StatusCode::UNAUTHORIZED && self.ids.is_some() {
            let mut held = lock(&self.hash);
            if *held == hash {
                *held = None;
            }
        }
        if !r.status.is_success() {
            return Err(DeviceError::Refused {
                status: r.status,
                body: String::from_utf8_lossy(&r.body).trim().to_string(),
                retry_after: retry_after(&r.headers),
            });
        }
        Ok(Sent {
            delay: t.elapsed(),
            path: r
                .headers
                .get(PATH_HEADER)
                .and_then(|v| parse_path(v.as_bytes()).ok()),
        })
    }

    /// The HTTP/3 client underneath.
    pub fn client(&self) -> &H3Client {
        &self.h3
    }
}

/// A seed for a device's request ids, from the operating system.
pub fn random_id_seed() -> std::io::Result<[u8; 32]> {
    let mut b = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut b)?;
    Ok(b)
}

/// The class for a `priority` flag.
fn class(priority: bool) -> Priority {
    if priority {
        Priority::Priority
    } else {
        Priority::BestEffort
    }
}

/// `Retry-After` as a number of seconds (at most an hour); dates are not used here.
fn retry_after(h: &http::HeaderMap) -> Option<Duration> {
    h.get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s.min(3600)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_worth_retrying() {
        let refused = |status: u16, after: Option<u64>| DeviceError::Refused {
            status: http::StatusCode::from_u16(status).unwrap(),
            body: String::new(),
            retry_after: after.map(Duration::from_secs),
        };
        assert_eq!(
            refused(503, Some(3)).retry_in(),
            Some(Duration::from_secs(3))
        );
        assert_eq!(refused(503, None).retry_in(), Some(Duration::from_secs(1)));
        assert_eq!(
            refused(503, Some(0)).retry_in(),
            Some(Duration::from_millis(100))
        );
        assert_eq!(refused(502, None).retry_in(), Some(Duration::from_secs(1)));
        assert_eq!(
            refused(425, None).retry_in(),
            Some(Duration::from_millis(100))
        );
        for permanent in [400, 401, 413, 500] {
            assert_eq!(refused(permanent, Some(1)).retry_in(), None, "{permanent}");
        }
        let mut h = http::HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
        h.insert(http::header::RETRY_AFTER, "99999".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(3600)));
        h.insert(
            http::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&h), None);
    }
}
