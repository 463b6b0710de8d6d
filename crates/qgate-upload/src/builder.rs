//! `UploadBuilder`: the one way to assemble and run an upload.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use qgate_chunks::{FileInfo, Planner, MAX_LANES};
use qgate_transport::http3::ALPN_H3;
use qgate_transport::{client_config, endpoint, Socket, TransportOptions, TrustRoots};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{
    Lane, LaneReport, Progress, Report, Source, Upload, UploadError, DEFAULT_REQUEST_TIMEOUT,
    MAX_IN_FLIGHT,
};

use crate::lane::{Paths, Shared, MAX_ROUNDS};

impl Upload {
    /// A builder; name, file, lanes and trust are required.
    pub fn builder() -> UploadBuilder {
        UploadBuilder {
            lanes: Vec::new(),
            server_name: "localhost".into(),
            trust: None,
            transport: TransportOptions::default(),
            name: None,
            file: None,
            seed: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            progress: Arc::new(Progress::default()),
            steal: true,
            failover_after: None,
        }
    }
}

/// Assembles an upload.
pub struct UploadBuilder {
    lanes: Vec<Lane>,
    server_name: String,
    trust: Option<TrustRoots>,
    transport: TransportOptions,
    name: Option<String>,
    file: Option<(FileInfo, Arc<dyn Source>)>,
    seed: Option<u64>,
    request_timeout: Duration,
    progress: Arc<Progress>,
    steal: bool,
    failover_after: Option<Duration>,
}

impl UploadBuilder {
    /// Move a lane to its backup interface when no chunk of it has been confirmed for this
    /// long while some are in flight [default: max(1 s, 8 × the connection's smoothed RTT),
    /// decision U7].
    pub fn failover_after(mut self, t: Duration) -> Self {
        self.failover_after = Some(t);
        self
    }

    /// Whether a lane with nothing left takes over the chunks another lane has queued where
    /// they meet (decision U6; default on). Off is paper 001's literal scheme.
    pub fn steal(mut self, on: bool) -> Self {
        self.steal = on;
        self
    }

    /// Add a lane (interface); lane 0 sends from the front of the file, lane 1 from the back.
    pub fn lane(mut self, lane: Lane) -> Self {
        self.lanes.push(lane);
        self
    }

    /// The name the server's certificate must carry.
    pub fn server_name(mut self, name: &str) -> Self {
        self.server_name = name.into();
        self
    }

    /// The certificate authorities to trust.
    pub fn trust(mut self, trust: TrustRoots) -> Self {
        self.trust = Some(trust);
        self
    }

    /// QUIC settings of every lane's connection (send fairness is turned off: a lane's chunks
    /// leave in order, decision U4).
    pub fn transport(mut self, transport: TransportOptions) -> Self {
        self.transport = transport;
        self
    }

    /// The file's name on the server.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The file: its description and where to read it.
    pub fn file(mut self, info: FileInfo, source: Arc<dyn Source>) -> Self {
        self.file = Some((info, source));
        self
    }

    /// Seed quinn's choices, so a simulation repeats.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Give a chunk back to the planner when its request takes longer than this.
    pub fn request_timeout(mut self, t: Duration) -> Self {
        self.request_timeout = t;
        self
    }

    /// The live counters (keep a clone before [`UploadBuilder::run`]).
    pub fn progress(&self) -> Arc<Progress> {
        self.progress.clone()
    }

    /// Upload the file; returns when the server has confirmed it complete, verified and
    /// durable, or on the first refusal.
    pub async fn run(self) -> Result<Report, UploadError> {
        let name = self
            .name
            .ok_or(UploadError::Setup("the upload needs a name".into()))?;
        let (info, source) = self
            .file
            .ok_or(UploadError::Setup("the upload needs a file".into()))?;
        let trust = self
            .trust
            .ok_or(UploadError::Setup("the upload needs trust roots".into()))?;
        if self.lanes.is_empty() || self.lanes.len() > MAX_LANES {
            return Err(UploadError::Setup(format!(
                "an upload needs 1 to {MAX_LANES} interfaces, not {}",
                self.lanes.len()
            )));
        }
        let mut transport = self.transport;
        transport.send_fairness = false;
        let ccfg = client_config(&trust, &[ALPN_H3], &transport)
            .map_err(|e| UploadError::Setup(e.to_string()))?;
        let planner = Planner::new(info.layout, self.lanes.len())
            .map_err(|e| UploadError::Setup(e.to_string()))?;
        let chunk = info.layout.chunk_size().max(1) as usize;
        let shared = Arc::new(Shared {
            name,
            info,
            source,
            ccfg,
            transport: transport.clone(),
            server_name: self.server_name,
            planner: Mutex::new(planner),
            news: Notify::new(),
            stop: Mutex::new(None),
            confirmed: AtomicBool::new(false),
            confirmed_at: Mutex::new(None),
            first_announce: AtomicBool::new(true),
            busy_said: AtomicBool::new(false),
            progress: self.progress.clone(),
            request_timeout: self.request_timeout,
            in_flight: (transport.send_window as usize / chunk).clamp(2, MAX_IN_FLIGHT),
            chunk,
            steal: self.steal,
            failover_after: self.failover_after,
        });
        let start = Instant::now();
        let mut endpoints = Vec::new();
        let mut paths = Vec::new();
        for (i, lane) in self.lanes.into_iter().enumerate() {
            let setup = |e: qgate_transport::TransportError| {
                UploadError::Setup(format!("interface {}: {e}", i + 1))
            };
            let seed = self.seed.map(|s| s.wrapping_mul(31).wrapping_add(i as u64));
            let primary = lane.socket.into_async().map_err(setup)?;
            let backup = lane
                .backup
                .map(Socket::into_async)
                .transpose()
                .map_err(setup)?;
            let ep = endpoint(Socket::Abstract(primary.clone()), None, seed).map_err(setup)?;
            endpoints.push((ep, lane.server));
            paths.push(Paths { primary, backup });
        }
        // Rounds: the lanes send until every chunk is confirmed; if the server then does not
        // hold them all (it crashed and lost what it had not made durable), they send what it
        // lacks again.
        let mut rounds = 0;
        loop {
            let lanes = endpoints.iter().zip(paths.iter().cloned()).enumerate().map(
                |(i, ((ep, server), paths))| shared.clone().lane(i, ep.clone(), *server, paths),
            );
            futures_util::future::join_all(lanes).await;
            if let Some(e) = shared.stop.lock().expect("lock").take() {
                return Err(e);
            }
            if shared.confirmed.load(Ordering::Relaxed)
                || shared.confirm_complete(&endpoints).await?
            {
                break;
            }
            rounds += 1;
            if rounds >= MAX_ROUNDS {
                return Err(UploadError::Unconfirmed(format!(
                    "after {rounds} rounds the server still lacks chunks it had confirmed"
                )));
            }
        }
        for (ep, _) in &endpoints {
            ep.close(0u32.into(), b"done");
        }
        let p = &self.progress;
        // To the confirmation, not to when the last lane stopped (a lane in the middle of a
        // reconnection finishes its handshake first; U12).
        let confirmed_at = *shared.confirmed_at.lock().expect("lock");
        Ok(Report {
            elapsed: confirmed_at.map_or_else(|| start.elapsed(), |t| t.duration_since(start)),
            resumed_bytes: p.held_at_start(),
            lanes: (0..endpoints.len())
                .map(|i| {
                    let l = p.lane(i);
                    LaneReport {
                        chunks: l.chunks.load(Ordering::Relaxed),
                        bytes: l.bytes.load(Ordering::Relaxed),
                        failed: l.failed.load(Ordering::Relaxed),
                        connects: l.connects.load(Ordering::Relaxed),
                        migrations: l.migrations.load(Ordering::Relaxed),
                    }
                })
                .collect(),
        })
    }
}
