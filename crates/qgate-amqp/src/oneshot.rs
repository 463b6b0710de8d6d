//! A one-message sender that pipelines the whole conversation (AMQP 1.0 §2.4.1, §5.3.2): SASL
//! header and init, AMQP header, open, begin, attach and the transfer go out in one write, so on
//! a resumed QUIC connection they all ride in 0-RTT; then it waits for the broker's outcome and
//! closes. This is paper 003's "one message per connection" sender, and the frame handling here
//! is ours (fe2o3-amqp's client waits for each answer before the next step).

use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use fe2o3_amqp::types::definitions::{Role, SenderSettleMode};
use fe2o3_amqp::types::messaging::{DeliveryState, Source, Target};
use fe2o3_amqp::types::performatives::{
    Attach, Begin, Close, Detach, End, Open, Performative, Transfer,
};
use fe2o3_amqp::types::primitives::{Binary, Symbol};
use fe2o3_amqp::types::sasl::{SaslCode, SaslInit, SaslOutcome};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::broker::{encode, AmqpMessage};
use crate::client::{ClientError, Connector, Report};

fn frame(kind: u8, channel: u16, body: &[u8], payload: &[u8]) -> Vec<u8> {
    let size = 8 + body.len() + payload.len();
    let mut f = Vec::with_capacity(size);
    f.extend_from_slice(&(size as u32).to_be_bytes());
    f.extend_from_slice(&[2, kind]);
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(body);
    f.extend_from_slice(payload);
    f
}

fn amqp(perf: &Performative, payload: &[u8]) -> Vec<u8> {
    frame(0, 0, &serde_amqp::to_vec(perf).expect("encodes"), payload)
}

/// Every byte a one-message sender writes before it hears anything.
pub fn opening(
    address: &str,
    sasl: Option<(&str, &str)>,
    msg: &AmqpMessage,
    settled: bool,
    container: &str,
) -> Vec<u8> {
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
    out.extend(amqp(
        &Performative::Open(Open {
            container_id: container.to_string(),
            hostname: None,
            max_frame_size: 65_536.into(),
            channel_max: Default::default(),
            idle_time_out: None,
            outgoing_locales: None,
            incoming_locales: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }),
        &[],
    ));
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
    out.extend(amqp(
        &Performative::Attach(Attach {
            name: format!("{container}-oneshot"),
            handle: 0.into(),
            role: Role::Sender,
            snd_settle_mode: if settled {
                SenderSettleMode::Settled
            } else {
                SenderSettleMode::Unsettled
            },
            rcv_settle_mode: Default::default(),
            source: Some(Box::new(Source::builder().build())),
            target: Some(Box::new(Target::builder().address(address).build().into())),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: Some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }),
        &[],
    ));
    out.extend(amqp(
        &Performative::Transfer(Transfer {
            handle: 0.into(),
            delivery_id: Some(0),
            delivery_tag: Some(Binary::from(vec![0u8])),
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
    ));
    out
}

/// What came back. Short-lived, one at a time: boxing the large variant would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Heard {
    Sasl(SaslOutcome),
    Amqp(Performative),
}

/// Parse complete items (protocol headers skipped) off the front of `buf`.
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
        return match f[5] {
            1 => match serde_amqp::from_slice::<SaslOutcome>(body) {
                Ok(o) => Ok(Some(Heard::Sasl(o))),
                Err(_) => continue, // sasl-mechanisms
            },
            _ => serde_amqp::from_slice::<Performative>(body)
                .map(|p| Some(Heard::Amqp(p)))
                .map_err(|e| ClientError::Link(format!("undecodable frame: {e}"))),
        };
    }
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
    let start = Instant::now();
    let (mut io, info) = connector.stream().await?;
    let container = format!("qgate-{}", std::process::id());
    let creds = connector.sasl();
    let bytes = opening(
        address,
        creds.as_ref().map(|(u, p)| (u.as_str(), p.as_str())),
        msg,
        settled,
        &container,
    );
    let io_err = |e: std::io::Error| ClientError::Link(format!("writing: {e}"));
    io.write_all(&bytes).await.map_err(io_err)?;
    io.flush().await.map_err(io_err)?;
    let startup = start.elapsed();
    let mut buf = BytesMut::with_capacity(4096);
    let mut attached = false;
    let outcome = tokio::time::timeout(timeout, async {
        loop {
            while let Some(h) = next(&mut buf)? {
                match h {
                    Heard::Sasl(o) if o.code != SaslCode::Ok => {
                        return Err(ClientError::Open(format!("SASL {:?}", o.code)))
                    }
                    Heard::Sasl(_) => {}
                    Heard::Amqp(Performative::Attach(_)) => attached = true,
                    Heard::Amqp(Performative::Flow(_)) if settled && attached => return Ok(None),
                    Heard::Amqp(Performative::Disposition(d)) => return Ok(d.state),
                    Heard::Amqp(Performative::Detach(d)) => {
                        return Err(ClientError::Attach {
                            address: address.to_string(),
                            msg: format!("{:?}", d.error),
                        })
                    }
                    Heard::Amqp(Performative::Close(c)) => {
                        return Err(ClientError::Open(format!("closed: {:?}", c.error)))
                    }
                    Heard::Amqp(Performative::End(e)) if e.error.is_some() => {
                        return Err(ClientError::Begin(format!("{:?}", e.error)))
                    }
                    Heard::Amqp(_) => {}
                }
            }
            let n = io
                .read_buf(&mut buf)
                .await
                .map_err(|e| ClientError::Link(format!("reading: {e}")))?;
            if n == 0 {
                return Err(ClientError::Link("the broker closed the connection".into()));
            }
        }
    })
    .await
    .map_err(|_| ClientError::Link(format!("no outcome within {timeout:?}")))??;
    let mut report = Report {
        zero_rtt: info.zero_rtt,
        startup,
        ..Default::default()
    };
    match outcome {
        None | Some(DeliveryState::Accepted(_)) => {
            report.messages = 1;
            report.bytes = match &msg.body {
                fe2o3_amqp::types::messaging::Body::Data(b) => {
                    b.iter().map(|d| d.0.len() as u64).sum()
                }
                _ => 0,
            };
        }
        Some(other) => {
            report.rejected = 1;
            report.first_error = Some(format!("{other:?}"));
        }
    }
    // Orderly goodbye: detach, end, close; wait for the broker's close.
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
    if io.write_all(&bye).await.is_ok() {
        let _ = tokio::time::timeout(timeout, async {
            loop {
                while let Ok(Some(h)) = next(&mut buf) {
                    if let Heard::Amqp(Performative::Close(_)) = h {
                        return;
                    }
                }
                match io.read_buf(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
    let _ = io.shutdown().await;
    report.total = start.elapsed();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linkname::{Direction, Rewriter};

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
