//! Pipelined clients (AMQP 1.0 §2.4.1, §5.3.2): SASL header and init, AMQP header, open,
//! begin, attach and the first transfer (or, for a receiver, one credit) go out in one write, so
//! on a resumed QUIC connection they all ride in 0-RTT. These are paper 003's "one message per
//! connection" clients, and the frame handling here is ours: fe2o3-amqp's client waits for each
//! answer before the next step, and its engines busy-loop while waiting for the peer's end and
//! close, which also stops virtual time on the simulated network.
use std::time::Duration;
// tokio's clock: the same code measures real time on sockets and virtual time on netsim.
use tokio::time::Instant;

use bytes::{Buf, BytesMut};
use fe2o3_amqp::types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp::types::messaging::{Accepted, DeliveryState, Source, Target};
use fe2o3_amqp::types::performatives::{
    Attach, Begin, Close, Detach, Disposition, End, Flow, Performative, Transfer,
};
use fe2o3_amqp::types::primitives::{Binary, Symbol};
use fe2o3_amqp::types::sasl::{SaslCode, SaslInit, SaslOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::broker::{encode, AmqpMessage};
use crate::client::{ClientError, Connector, Report};
use crate::wire::{amqp_frame as amqp, frame};

/// SASL header and init, AMQP header, open and begin: what every pipelined client writes first.
fn preamble(sasl: Option<(&str, &str)>, container: &str) -> Vec<u8> {
    let mut out = b"AMQP\x03\x01\x00\x00".to_vec();
    let init = match sasl {
        Some((u, p)) => SaslInit {
            mechanism: Symbol::from("PLAIN"),
            initial_response: Some(Binary::from(format!("\0{u}\0{p}").into_bytes())),
            hostname: None,
        },
        None => SaslInit {
            mechanism: Symbol::from("ANONYMOUS"),
            initial_response: None,
            hostname: None,
        },
    };
    out.extend(frame(
        1,
        0,
        &serde_amqp::to_vec(&init).expect("encodes"),
        &[],
    ));
    out.extend_from_slice(b"AMQP\x00\x01\x00\x00");
    out.extend(amqp(&crate::wire::open(container, FRAME_MAX), &[]));
    out.extend(amqp(
        &Performative::Begin(Begin {
            remote_channel: None,
            next_outgoing_id: 0,
            incoming_window: 64,
            outgoing_window: 64,
            handle_max: 1.into(),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }),
        &[],
    ));
    out
}

fn attach(container: &str, role: Role, address: &str, settled: bool) -> Vec<u8> {
    let sender = role == Role::Sender;
    let (source, target) = if sender {
        (
            Source::builder().build(),
            Target::builder().address(address).build(),
        )
    } else {
        (
            Source::builder().address(address).build(),
            Target::builder().build(),
        )
    };
    amqp(
        &Performative::Attach(Attach {
            name: format!("{container}-{}", if sender { "out" } else { "in" }),
            handle: 0.into(),
            role,
            snd_settle_mode: if settled {
                SenderSettleMode::Settled
            } else {
                SenderSettleMode::Unsettled
            },
            rcv_settle_mode: Default::default(),
            source: Some(Box::new(source)),
            target: Some(Box::new(target.into())),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: sender.then_some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }),
        &[],
    )
}

fn transfer(id: u32, msg: &AmqpMessage, settled: bool) -> Vec<u8> {
    amqp(
        &Performative::Transfer(Transfer {
            handle: 0.into(),
            delivery_id: Some(id),
            delivery_tag: Some(Binary::from(id.to_be_bytes().to_vec())),
            message_format: Some(0),
            settled: Some(settled),
            more: false,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        }),
        &encode(msg),
    )
}

/// The largest frame a pipelined client announces in its open.
const FRAME_MAX: u32 = 65_536;
/// The largest body it sends: one transfer frame minus room for the frame header, the
/// transfer performative and the message sections around the body.
const MAX_BODY: u64 = FRAME_MAX as u64 - 1024;

/// Every byte a one-message sender writes before it hears anything.
pub fn opening(
    address: &str,
    sasl: Option<(&str, &str)>,
    msg: &AmqpMessage,
    settled: bool,
    container: &str,
) -> Vec<u8> {
    let mut out = preamble(sasl, container);
    out.extend(attach(container, Role::Sender, address, settled));
    out.extend(transfer(0, msg, settled));
    out
}

/// What came back. Short-lived, one at a time: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Heard {
    Sasl(SaslOutcome),
    Amqp(Performative),
}

/// Parse complete items (protocol headers skipped) off the front of `buf`. A transfer's
/// payload is skipped: these clients count messages, they do not read them.
fn next(buf: &mut BytesMut) -> Result<Option<Heard>, ClientError> {
    loop {
        if buf.len() >= 8 && &buf[..4] == b"AMQP" {
            buf.advance(8);
            continue;
        }
        if buf.len() < 8 {
            return Ok(None);
        }
        let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let doff = buf[4] as usize * 4;
        if size < 8 || doff < 8 || doff > size || size > 1 << 20 {
            return Err(ClientError::Link(format!(
                "bad frame from the broker (size {size})"
            )));
        }
        if buf.len() < size {
            return Ok(None);
        }
        let f = buf.split_to(size);
        let body = &f[doff..];
        if body.is_empty() {
            continue; // heartbeat
        }
        let bad = |e: String| ClientError::Link(format!("undecodable frame: {e}"));
        let n = crate::wire::check_first(body).map_err(|e| bad(e.to_string()))?;
        return match f[5] {
            1 => match serde_amqp::from_slice::<SaslOutcome>(&body[..n]) {
                Ok(o) => Ok(Some(Heard::Sasl(o))),
                Err(_) => continue, // sasl-mechanisms
            },
            _ => serde_amqp::from_slice::<Performative>(&body[..n])
                .map(|p| Some(Heard::Amqp(p)))
                .map_err(|e| bad(e.to_string())),
        };
    }
}

/// One pipelined conversation: the stream, what came back so far, and the run's clocks.
struct Conversation {
    io: crate::transport::BoxStream,
    buf: BytesMut,
    info: crate::client::StreamInfo,
    start: Instant,
    timeout: Duration,
    /// Packets the QUIC connection had declared lost when this conversation began (quic-mux
    /// shares one connection among conversations).
    lost_before: u64,
}

impl Conversation {
    async fn open(connector: &Connector, timeout: Duration) -> Result<Self, ClientError> {
        let start = Instant::now();
        let (io, info) = tokio::time::timeout(timeout, connector.stream())
            .await
            .map_err(|_| ClientError::Link(format!("not connected within {timeout:?}")))??;
        // A new connection's handshake losses are this conversation's own.
        let lost_before = if info.reused {
            info.lost_packets().unwrap_or(0)
        } else {
            0
        };
        Ok(Conversation {
            io,
            buf: BytesMut::with_capacity(4096),
            info,
            start,
            timeout,
            lost_before,
        })
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        let io_err = |e: std::io::Error| ClientError::Link(format!("writing: {}", with_causes(&e)));
        self.io.write_all(bytes).await.map_err(io_err)?;
        self.io.flush().await.map_err(io_err)
    }

    /// Read until `pick` returns Some (or an error, or the timeout).
    async fn until<T>(
        &mut self,
        address: &str,
        mut pick: impl FnMut(&Performative) -> Option<T>,
    ) -> Result<T, ClientError> {
        let (io, buf) = (&mut self.io, &mut self.buf);
        tokio::time::timeout(self.timeout, async {
            loop {
                while let Some(h) = next(buf)? {
                    let p = match h {
                        Heard::Sasl(o) if o.code != SaslCode::Ok => {
                            return Err(ClientError::Open(format!("SASL {:?}", o.code)))
                        }
                        Heard::Sasl(_) => continue,
                        Heard::Amqp(p) => p,
                    };
                    if let Some(t) = pick(&p) {
                        return Ok(t);
                    }
                    match p {
                        Performative::Detach(d) if d.error.is_some() => {
                            return Err(ClientError::Attach {
                                address: address.to_string(),
                                msg: format!("{:?}", d.error),
                            })
                        }
                        Performative::Close(c) => {
                            return Err(ClientError::Open(format!("closed: {:?}", c.error)))
                        }
                        Performative::End(e) if e.error.is_some() => {
                            return Err(ClientError::Begin(format!("{:?}", e.error)))
                        }
                        _ => {}
                    }
                }
                let n = io
                    .read_buf(buf)
                    .await
                    .map_err(|e| ClientError::Link(format!("reading: {}", with_causes(&e))))?;
                if n == 0 {
                    return Err(ClientError::Link("the broker closed the connection".into()));
                }
            }
        })
        .await
        .map_err(|_| ClientError::Link(format!("no answer within {:?}", self.timeout)))?
    }

    /// Orderly goodbye: detach, end, close; wait (bounded) for the broker's close.
    async fn finish(mut self, mut report: Report) -> Report {
        let mut bye = amqp(
            &Performative::Detach(Detach {
                handle: 0.into(),
                closed: true,
                error: None,
            }),
            &[],
        );
        bye.extend(amqp(&Performative::End(End { error: None }), &[]));
        bye.extend(amqp(&Performative::Close(Close { error: None }), &[]));
        if self.write(&bye).await.is_ok() {
            let _ = self
                .until("", |p| matches!(p, Performative::Close(_)).then_some(()))
                .await;
        }
        let _ = self.io.shutdown().await;
        report.total = self.start.elapsed();
        report.rtt = self.info.rtt();
        report.lost_packets = self
            .info
            .lost_packets()
            .map(|n| n.saturating_sub(self.lost_before));
        report.zero_rtt = self.info.zero_rtt;
        report
    }
}

/// `e` and the errors under it ("connection lost: timed out"): an I/O error from a QUIC
/// stream names only the stream's failure, its cause says why the connection ended.
fn with_causes(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

fn body_len(msg: &AmqpMessage) -> u64 {
    match &msg.body {
        fe2o3_amqp::types::messaging::Body::Data(b) => b.iter().map(|d| d.0.len() as u64).sum(),
        _ => 0,
    }
}

/// This process's container id: fixed width, so the bytes a connection puts on the wire do
/// not depend on how many digits the process id has (the lab's numbers must not).
fn container_id() -> String {
    format!("qgate-{:010}", std::process::id())
}

/// Send one message on a fresh connection, pipelined (0-RTT when `connector` holds a ticket),
/// and wait for the broker's outcome (for a pre-settled message: its attach and flow).
pub async fn send_one(
    connector: &Connector,
    address: &str,
    msg: &AmqpMessage,
    settled: bool,
    timeout: Duration,
) -> Result<Report, ClientError> {
    send_in_turn(
        connector,
        address,
        std::slice::from_ref(msg),
        settled,
        timeout,
    )
    .await
}

/// Send `msgs` on one fresh connection, one at a time: the first pipelined with the opening
/// (0-RTT when a ticket is held), each next one once the broker has settled the one before
/// (for pre-settled messages: once the link has credit). Stops at the first refusal.
pub async fn send_in_turn(
    connector: &Connector,
    address: &str,
    msgs: &[AmqpMessage],
    settled: bool,
    timeout: Duration,
) -> Result<Report, ClientError> {
    let mut report = Report::default();
    send_in_turn_into(connector, address, msgs, settled, timeout, &mut report).await?;
    Ok(report)
}

/// [`send_in_turn`], counting into `report` as the broker settles each message: a connection
/// that fails part-way still tells how many were accepted before it did (as M20's
/// `client::send_into`).
pub async fn send_in_turn_into(
    connector: &Connector,
    address: &str,
    msgs: &[AmqpMessage],
    settled: bool,
    timeout: Duration,
    report: &mut Report,
) -> Result<(), ClientError> {
    let mut c = Conversation::open(connector, timeout).await?;
    let r = send_on(&mut c, connector, address, msgs, settled, report).await;
    forget_if_failed(connector, &c, r).await?;
    *report = c.finish(std::mem::take(report)).await;
    Ok(())
}

/// quic-mux: a conversation that failed may have found the shared connection dead although
/// its stream opened; the next one then starts a new connection (decision M25).
async fn forget_if_failed<T>(
    connector: &Connector,
    c: &Conversation,
    r: Result<T, ClientError>,
) -> Result<T, ClientError> {
    if let (Err(_), Some(q)) = (&r, &c.info.quic) {
        connector.forget_shared(q).await;
    }
    r
}

async fn send_on(
    c: &mut Conversation,
    connector: &Connector,
    address: &str,
    msgs: &[AmqpMessage],
    settled: bool,
    report: &mut Report,
) -> Result<(), ClientError> {
    let container = container_id();
    let creds = connector.sasl();
    for (i, msg) in msgs.iter().enumerate() {
        let id = i as u32;
        // Pipelined clients send every message in one transfer frame of the size they open
        // with; a larger one would be refused as a framing error.
        let body = body_len(msg);
        if body > MAX_BODY {
            return Err(ClientError::Link(format!(
                "a {body}-byte message does not fit one {FRAME_MAX}-byte frame; pipelined (one-per-connection) clients send at most {MAX_BODY} body bytes"
            )));
        }
        let bytes = if i == 0 {
            let mut b = preamble(
                creds.as_ref().map(|(u, p)| (u.as_str(), p.as_str())),
                &container,
            );
            b.extend(attach(&container, Role::Sender, address, settled));
            b.extend(transfer(id, msg, settled));
            b
        } else {
            transfer(id, msg, settled)
        };
        c.write(&bytes).await?;
        if i == 0 {
            report.startup = c.start.elapsed();
        }
        let outcome = if settled {
            // At most once: the broker's flow (credit for the next) is the signal to go on.
            c.until(address, |p| match p {
                Performative::Flow(f) if f.link_credit.unwrap_or(0) > 0 => Some(None),
                _ => None,
            })
            .await?
        } else {
            c.until(address, |p| match p {
                Performative::Disposition(d)
                    if d.first <= id && d.last.unwrap_or(d.first) >= id =>
                {
                    Some(d.state.clone())
                }
                _ => None,
            })
            .await?
        };
        match outcome {
            None | Some(DeliveryState::Accepted(_)) => {
                report.messages += 1;
                report.bytes += body_len(msg);
            }
            Some(other) => {
                report.rejected += 1;
                report.first_error = Some(format!("{other:?}"));
                break;
            }
        }
    }
    Ok(())
}

/// Receive one message on a fresh connection, pipelined: the opening, a receiver attach and
/// one credit go out in one flight (0-RTT when a ticket is held; a replayed copy can only take
/// a message that is redelivered when that copy's connection fails). The message is accepted
/// and settled at once.
pub async fn receive_one(
    connector: &Connector,
    address: &str,
    timeout: Duration,
) -> Result<Report, ClientError> {
    let mut c = Conversation::open(connector, timeout).await?;
    let r = take_one(&mut c, connector, address).await;
    let report = forget_if_failed(connector, &c, r).await?;
    Ok(c.finish(report).await)
}

async fn take_one(
    c: &mut Conversation,
    connector: &Connector,
    address: &str,
) -> Result<Report, ClientError> {
    let container = container_id();
    let creds = connector.sasl();
    let mut bytes = preamble(
        creds.as_ref().map(|(u, p)| (u.as_str(), p.as_str())),
        &container,
    );
    bytes.extend(attach(&container, Role::Receiver, address, false));
    bytes.extend(amqp(
        &Performative::Flow(Flow {
            next_incoming_id: None,
            incoming_window: 64,
            next_outgoing_id: 0,
            outgoing_window: 64,
            handle: Some(0.into()),
            delivery_count: Some(0),
            link_credit: Some(1),
            available: None,
            drain: false,
            echo: false,
            properties: None,
        }),
        &[],
    ));
    c.write(&bytes).await?;
    let mut report = Report {
        startup: c.start.elapsed(),
        ..Default::default()
    };
    let (id, was_settled) = c
        .until(address, |p| match p {
            Performative::Transfer(t) if !t.more => {
                Some((t.delivery_id.unwrap_or(0), t.settled.unwrap_or(false)))
            }
            _ => None,
        })
        .await?;
    report.messages = 1;
    if !was_settled {
        c.write(&amqp(
            &Performative::Disposition(Disposition {
                role: Role::Receiver,
                first: id,
                last: None,
                settled: true,
                state: Some(DeliveryState::Accepted(Accepted {})),
                batchable: false,
            }),
            &[],
        ))
        .await?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shim::{Direction, Rewriter};

    #[test]
    fn a_stream_error_names_why_the_connection_ended() {
        // quinn's shape: an I/O error around a read error around the connection's error.
        let lost = quinn::ReadError::ConnectionLost(quinn::ConnectionError::TimedOut);
        let e = std::io::Error::from(lost);
        assert_eq!(with_causes(&e), "connection lost: timed out");
    }

    #[test]
    fn the_opening_is_valid_framing_and_holds_every_step() {
        let msg = crate::client::message(7, b"hello".to_vec());
        let bytes = opening("q", Some(("u", "p")), &msg, false, "c");
        // Our own inbound checks accept it whole.
        let mut rw = Rewriter::new(Direction::Inbound, 65_536);
        let mut input = BytesMut::from(&bytes[..]);
        let mut out = BytesMut::new();
        rw.process(&mut input, &mut out).unwrap();
        assert!(input.is_empty());
        let mut buf = BytesMut::from(&bytes[..]);
        let mut kinds = Vec::new();
        while buf.len() >= 8 {
            if &buf[..4] == b"AMQP" {
                buf.advance(8);
                continue;
            }
            let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            let f = buf.split_to(size);
            if f[5] == 0 {
                let p: Performative = serde_amqp::from_slice(&f[8..]).unwrap();
                kinds.push(match p {
                    Performative::Open(_) => "open",
                    Performative::Begin(_) => "begin",
                    Performative::Attach(_) => "attach",
                    Performative::Transfer(_) => "transfer",
                    _ => "other",
                });
            } else {
                kinds.push("sasl");
            }
        }
        assert_eq!(kinds, ["sasl", "open", "begin", "attach", "transfer"]);
    }
}
