//! Counted runs: send or receive messages on one link and report what was measured.

use std::time::Duration;
// tokio's clock: the same code measures real time on sockets and virtual time on netsim.
use tokio::time::Instant;

use fe2o3_amqp::types::messaging::{Body, Data, Message, MessageId, Outcome, Properties};
use fe2o3_amqp::types::primitives::{Binary, Value};
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::connection::{quic_closed, Client};
use super::connector::Connector;
use super::error::ClientError;

/// What to send.
#[derive(Debug, Clone)]
pub struct SendSpec {
    /// Queue address.
    pub address: String,
    /// Pre-settled (at-most-once) instead of waiting for the broker's accept.
    pub settled: bool,
    /// Most unsettled messages in flight.
    pub window: usize,
    /// Messages per second (None: as fast as credit allows).
    pub rate: Option<f64>,
    /// Link name.
    pub link_name: String,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Messages sent and accepted (or received).
    pub messages: u64,
    /// Body bytes.
    pub bytes: u64,
    /// Messages the broker rejected.
    pub rejected: u64,
    /// Connection start → first message written (paper 003's startup latency).
    pub startup: Duration,
    /// Connection start → last outcome (or message) in.
    pub total: Duration,
    /// The stream came up with 0-RTT.
    pub zero_rtt: bool,
    /// The transport's smoothed RTT at the end (QUIC only).
    pub rtt: Option<Duration>,
    /// Packets QUIC declared lost while this AMQP connection was open (pipelined clients on
    /// QUIC only).
    pub lost_packets: Option<u64>,
    /// The first rejection's reason.
    pub first_error: Option<String>,
}

impl Report {
    /// Messages per second over the whole run.
    pub fn rate(&self) -> f64 {
        self.messages as f64 / self.total.as_secs_f64().max(1e-9)
    }
}

/// A message with a data body and a numeric message-id.
pub fn message(id: u64, body: Vec<u8>) -> Message<Body<Value>> {
    message_with_id(MessageId::Ulong(id), body)
}

/// A message with a data body and `id`.
pub fn message_with_id(id: MessageId, body: Vec<u8>) -> Message<Body<Value>> {
    Message::builder()
        .properties(Properties {
            message_id: Some(id),
            ..Default::default()
        })
        .body(Body::Data(vec![Data(Binary::from(body))].into()))
        .build()
}

/// A random 64-bit run id: message-ids `RUN-N` are unique across runs, so the broker's 0-RTT
/// replay guard (which keys on message-id and bytes) never mistakes a new run for a replay.
pub fn run_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// Open a connection and send every body `bodies` yields on one link; the report's clock starts
/// before the connection is opened.
pub async fn send(
    connector: &Connector,
    spec: &SendSpec,
    bodies: impl IntoIterator<Item = Vec<u8>>,
) -> Result<Report, ClientError> {
    let mut report = Report::default();
    send_into(connector, spec, bodies, &mut report).await?;
    Ok(report)
}

/// [`send`], counting into `report` as outcomes arrive: when it fails (or its future is
/// dropped), `report` still says how many messages the broker accepted (decision M20).
pub async fn send_into(
    connector: &Connector,
    spec: &SendSpec,
    bodies: impl IntoIterator<Item = Vec<u8>>,
    report: &mut Report,
) -> Result<(), ClientError> {
    let start = Instant::now();
    let (mut client, info) = connector.open().await?;
    let mut sender = client
        .sender(&spec.link_name, &spec.address, spec.settled)
        .await?;
    report.zero_rtt = info.zero_rtt;
    let mut pace = spec.rate.filter(|r| *r > 0.0).map(|r| {
        let mut t = tokio::time::interval(Duration::from_secs_f64(1.0 / r));
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        t
    });
    let mut inflight = FuturesUnordered::new();
    let mut first = true;
    let run = run_id();
    let quic = info.quic.as_ref();
    for (i, body) in bodies.into_iter().enumerate() {
        if let Some(p) = pace.as_mut() {
            p.tick().await;
        }
        while inflight.len() >= spec.window.max(1) {
            if let Some(r) = unless_closed(&client, quic, &spec.address, inflight.next()).await? {
                tally(report, r).map_err(|e| link_gone(&spec.address, e))?;
                report.total = start.elapsed();
            }
        }
        let len = body.len() as u64;
        let send = sender.send_batchable(message_with_id(
            MessageId::String(format!("{run:016x}-{i}")),
            body,
        ));
        let fut = unless_closed(&client, quic, &spec.address, send)
            .await?
            .map_err(|e| ClientError::Link(format!("sending: {e}")))?;
        if first {
            report.startup = start.elapsed();
            first = false;
        }
        inflight.push(async move { (len, fut.await) });
    }
    while let Some(r) = unless_closed(&client, quic, &spec.address, inflight.next()).await? {
        tally(report, r).map_err(|e| link_gone(&spec.address, e))?;
        report.total = start.elapsed();
    }
    report.total = start.elapsed();
    report.rtt = info.rtt();
    let _ = sender.close().await;
    client.close().await;
    Ok(())
}

/// Count one outcome. Err when the link itself is gone (the broker closed it, e.g. an unknown
/// address refused just after the attach): that is the run's failure, not one rejection.
fn tally(
    report: &mut Report,
    (len, r): (u64, Result<Outcome, fe2o3_amqp::link::SendError>),
) -> Result<(), String> {
    use fe2o3_amqp::link::SendError;
    match r {
        Ok(Outcome::Accepted(_)) => {
            report.messages += 1;
            report.bytes += len;
        }
        Ok(Outcome::Rejected(rej)) => {
            report.rejected += 1;
            if report.first_error.is_none() {
                report.first_error = Some(
                    rej.error
                        .map(|e| {
                            format!("{:?}: {}", e.condition, e.description.unwrap_or_default())
                        })
                        .unwrap_or_else(|| "rejected".into()),
                );
            }
        }
        Ok(other) => {
            report.rejected += 1;
            report
                .first_error
                .get_or_insert_with(|| format!("{other:?}"));
        }
        Err(e @ (SendError::LinkStateError(_) | SendError::Detached(_))) => {
            return Err(e.to_string())
        }
        Err(e) => {
            report.rejected += 1;
            report.first_error.get_or_insert_with(|| e.to_string());
        }
    }
    Ok(())
}

/// `fut`, unless the QUIC connection under the link closes first: fe2o3 leaves a delivery's
/// outcome pending for ever when its transport dies (found by `qgate-lab faults`), so a sender
/// would hang on a dead broker with messages in flight (decision M20).
async fn unless_closed<T>(
    client: &Client,
    quic: Option<&quinn::Connection>,
    address: &str,
    fut: impl std::future::Future<Output = T>,
) -> Result<T, ClientError> {
    tokio::select! {
        biased;
        r = fut => Ok(r),
        e = quic_closed(quic) => Err(link_gone(address, format!("the QUIC connection closed: {e}"))),
        _ = client.ended() => Err(link_gone(address, "the broker closed the connection".into())),
    }
}

fn link_gone(address: &str, e: String) -> ClientError {
    ClientError::Link(format!("sending to '{address}': the link ended: {e}"))
}

/// What to receive.
#[derive(Debug, Clone)]
pub struct RecvSpec {
    /// Queue address.
    pub address: String,
    /// Ask for pre-settled delivery.
    pub settled: bool,
    /// Stop after this many (None: until `idle` passes without a message).
    pub count: Option<u64>,
    /// Give up waiting after this long without a message.
    pub idle: Duration,
    /// Link credit.
    pub credit: u32,
    /// Link name.
    pub link_name: String,
}

/// Open a connection and receive from `spec.address`, calling `each` with every body.
pub async fn receive(
    connector: &Connector,
    spec: &RecvSpec,
    mut each: impl FnMut(&[u8]),
) -> Result<Report, ClientError> {
    let start = Instant::now();
    let (mut client, info) = connector.open().await?;
    let mut receiver = client
        .receiver(&spec.link_name, &spec.address, spec.settled, spec.credit)
        .await?;
    let mut report = Report {
        zero_rtt: info.zero_rtt,
        startup: start.elapsed(),
        ..Default::default()
    };
    while spec.count.is_none_or(|n| report.messages < n) {
        let d = match tokio::time::timeout(spec.idle, receiver.recv::<Body<Value>>()).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => {
                // fe2o3 says only that its session stopped; the QUIC close says why.
                let why = match info.quic.as_ref().and_then(|c| c.close_reason()) {
                    Some(reason) => format!("the connection closed: {reason}"),
                    None => e.to_string(),
                };
                return Err(ClientError::Link(format!(
                    "receiving from '{}': {why}",
                    spec.address
                )));
            }
            Err(_) => break,
        };
        let mut len = 0;
        if let Body::Data(batch) = d.body() {
            for data in batch.iter() {
                len += data.0.len();
                each(&data.0);
            }
        }
        receiver
            .accept(&d)
            .await
            .map_err(|e| ClientError::Link(format!("accepting: {e}")))?;
        report.messages += 1;
        report.bytes += len as u64;
        report.total = start.elapsed();
    }
    report.rtt = info.rtt();
    let _ = receiver.close().await;
    client.close().await;
    Ok(report)
}
