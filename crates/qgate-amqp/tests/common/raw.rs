//! Raw AMQP peers for the broker's tests: frames built by hand with `qgate_amqp::wire`.
#![allow(dead_code)]

use fe2o3_amqp::types::definitions::Role;
use fe2o3_amqp::types::messaging::{Source, Target};
use fe2o3_amqp::types::performatives::{Attach, Begin, Performative, Transfer};
use qgate_amqp::wire;

pub fn frame(channel: u16, perf: &Performative, payload: &[u8]) -> Vec<u8> {
    wire::frame(0, channel, &serde_amqp::to_vec(perf).unwrap(), payload)
}

/// SASL header and ANONYMOUS init, AMQP header, and an open asking for `idle_ms`.
pub fn opening(idle_ms: Option<u32>) -> Vec<u8> {
    use fe2o3_amqp::types::primitives::Symbol;
    use fe2o3_amqp::types::sasl::SaslInit;
    let mut out = b"AMQP\x03\x01\x00\x00".to_vec();
    let init = SaslInit {
        mechanism: Symbol::from("ANONYMOUS"),
        initial_response: None,
        hostname: None,
    };
    out.extend(wire::frame(1, 0, &serde_amqp::to_vec(&init).unwrap(), &[]));
    out.extend_from_slice(b"AMQP\x00\x01\x00\x00");
    let mut open = wire::open("hostile", 65_536);
    if let Performative::Open(o) = &mut open {
        o.idle_time_out = idle_ms;
    }
    out.extend(frame(0, &open, &[]));
    out
}

pub fn begin() -> Performative {
    Performative::Begin(Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 100,
        outgoing_window: 100,
        handle_max: 10.into(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    })
}

pub fn sender_attach(address: &str) -> Performative {
    Performative::Attach(Attach {
        name: "s".into(),
        handle: 0.into(),
        role: Role::Sender,
        snd_settle_mode: Default::default(),
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
    })
}

pub fn transfer() -> Performative {
    Performative::Transfer(Transfer {
        handle: 0.into(),
        delivery_id: Some(0),
        delivery_tag: Some(vec![0u8].into()),
        message_format: Some(0),
        settled: Some(false),
        more: false,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    })
}

/// A message body: one data section.
pub fn payload() -> Vec<u8> {
    let msg = qgate_amqp::client::message(1, b"x".to_vec());
    qgate_amqp::broker::encode(&msg)
}

/// AMQP frames in a byte stream: (channel, performative or None for an empty frame).
pub fn frames(mut b: &[u8]) -> Vec<(u16, Option<Performative>)> {
    let mut out = Vec::new();
    while b.len() >= 8 {
        if &b[..4] == b"AMQP" {
            b = &b[8..];
            continue;
        }
        let size = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
        if b.len() < size {
            break;
        }
        let doff = b[4] as usize * 4;
        if b[5] == 0 {
            let channel = u16::from_be_bytes([b[6], b[7]]);
            let body = &b[doff..size];
            out.push((
                channel,
                (!body.is_empty()).then(|| serde_amqp::from_slice(body).unwrap()),
            ));
        }
        b = &b[size..];
    }
    out
}

pub fn close_condition(b: &[u8]) -> Option<String> {
    frames(b).into_iter().find_map(|(_, p)| match p {
        Some(Performative::Close(c)) => Some(format!("{:?}", c.error)),
        _ => None,
    })
}

/// Over `io`: open, begin, attach a sender to `queue`, wait for credit, send one unsettled
/// transfer of `message` (encoded sections) and wait for its disposition; returns it.
pub async fn send_one<S>(io: &mut S, queue: &str, message: &[u8]) -> Option<Performative>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    send_after(io, opening(None), queue, message).await
}

/// The plain AMQP header (no SASL layer) and an open.
pub fn plain_opening() -> Vec<u8> {
    let mut out = b"AMQP\x00\x01\x00\x00".to_vec();
    out.extend(frame(0, &wire::open("plain", 65_536), &[]));
    out
}

/// [`send_one`] after `opening` (headers and open) instead of SASL ANONYMOUS.
pub async fn send_after<S>(
    io: &mut S,
    opening: Vec<u8>,
    queue: &str,
    message: &[u8],
) -> Option<Performative>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut out = opening;
    out.extend(frame(0, &begin(), &[]));
    out.extend(frame(0, &sender_attach(queue), &[]));
    io.write_all(&out).await.ok()?;
    let mut buf = Vec::new();
    let mut sent = false;
    loop {
        let mut chunk = [0u8; 4096];
        let n = io.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        let fs = frames(&buf);
        if !sent
            && fs
                .iter()
                .any(|(_, p)| matches!(p, Some(Performative::Flow(_))))
        {
            io.write_all(&frame(0, &transfer(), message)).await.ok()?;
            sent = true;
        }
        if let Some(d) = fs.into_iter().find_map(|(_, p)| match p {
            Some(d @ Performative::Disposition(_)) => Some(d),
            _ => None,
        }) {
            return Some(d);
        }
    }
}
