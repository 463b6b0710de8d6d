//! One direction's bytes, sans IO: framing checks, the attach rename, and the hold of early
//! transfers until the broker grants credit.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{BufMut, BytesMut};
use fe2o3_amqp::types::definitions::{self, AmqpError, ConnectionError, ErrorCondition, Role};
use fe2o3_amqp::types::performatives::{Close, Performative};

/// Appended to the names of links on which the broker sends.
pub const SUFFIX: &str = "\u{1f}qgate-out";

const FRAME_AMQP: u8 = 0;
const FRAME_SASL: u8 = 1;

/// Which way bytes flow through a [`Rewriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Peer → broker.
    Inbound,
    /// Broker → peer.
    Outbound,
}

/// Bytes that are not valid AMQP framing; the message says what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Not an AMQP protocol header where one was due.
    #[error("expected an AMQP protocol header, got {0:02x?}")]
    BadHeader(Vec<u8>),
    /// The frame size field is impossible.
    #[error("frame size {size} outside 8..={max}")]
    Size {
        /// The size field.
        size: u32,
        /// The largest accepted.
        max: u32,
    },
    /// The data offset is impossible.
    #[error("data offset {doff} (×4 bytes) does not fit a {size}-byte frame")]
    Offset {
        /// The DOFF field.
        doff: u8,
        /// The frame size.
        size: u32,
    },
    /// A frame type that is neither AMQP (0) nor SASL (1).
    #[error("unknown frame type {0}")]
    Type(u8),
    /// An attach performative that does not decode.
    #[error("malformed attach: {0}")]
    Attach(String),
    /// A performative or message whose encoded lengths do not fit.
    #[error("{0}")]
    Encoding(String),
    /// More pipelined data than the broker holds before granting credit.
    #[error("more than {0} bytes pipelined before the broker granted credit")]
    Pipelined(usize),
    /// A session frame on a channel the peer has not begun a session on (AMQP 1.0 §2.5.1:
    /// a channel carries a session's frames only between its begin and its end).
    #[error("frame on channel {0}, which has no session")]
    NoSession(u16),
    /// A begin on a channel already in use, or beyond the sessions a connection may have.
    #[error("begin on channel {channel}: {why}")]
    Begin {
        /// The channel.
        channel: u16,
        /// What is wrong.
        why: String,
    },
}

impl FrameError {
    /// The close condition that names this error to the peer.
    pub fn condition(&self) -> ErrorCondition {
        match self {
            // What fe2o3-amqp itself answers for a frame on an unknown channel.
            FrameError::NoSession(_) => AmqpError::NotFound.into(),
            _ => ConnectionError::FramingError.into(),
        }
    }
}

/// The largest frame either side may send before the open frames have settled the
/// connection's max-frame-size (AMQP 1.0 §2.7.1).
pub const MIN_MAX_FRAME_SIZE: u32 = 512;

/// Parses one direction's byte stream into protocol headers and frames, renaming attaches.
#[derive(Debug)]
pub struct Rewriter {
    dir: Direction,
    max_frame: u32,
    /// A protocol header is due (at the start, and after SASL succeeds).
    header_due: bool,
    /// Last protocol id seen (0 AMQP, 3 SASL); a SASL outcome makes a new header due.
    sasl: bool,
    /// An AMQP open frame has passed.
    opened: bool,
    /// Multi-frame deliveries under way, per (channel, handle): a copy of the payload so far,
    /// checked whole before its last frame is passed on (decision M11).
    partial: HashMap<(u16, u32), BytesMut>,
    /// Bytes in `partial` (at most [`MAX_PARTIAL`]).
    partial_bytes: usize,
    /// Early transfers (inbound) and credit grants (outbound), shared by both directions.
    pipeline: Option<Arc<Mutex<Pipeline>>>,
    /// Inbound frames held, unprocessed, until the broker grants credit (decision M9). Every
    /// byte here has passed the inbound checks.
    held: BytesMut,
    /// Bytes at the front of the input that were checked before they were held: released
    /// frames pass without a second check, which would count a session's end, a begin or a
    /// multi-frame delivery's pieces twice (decision M27).
    prechecked: usize,
    /// Inbound: channels the peer has begun a session on and not ended (decision M17).
    sessions: HashSet<u16>,
    /// Inbound: most sessions at once.
    max_sessions: usize,
    /// Outbound: the idle-time-out (ms) the broker's open announces (AMQP 1.0 §2.4.5).
    announce_idle: Option<u32>,
    /// A close frame has passed.
    closed: bool,
    /// Attaches renamed so far (for tests and metrics).
    pub renamed: u64,
}

impl Rewriter {
    /// A rewriter for `dir` that accepts frames up to `max_frame` bytes.
    pub fn new(dir: Direction, max_frame: u32) -> Self {
        Rewriter {
            dir,
            max_frame,
            header_due: true,
            sasl: false,
            opened: false,
            partial: HashMap::new(),
            partial_bytes: 0,
            pipeline: None,
            held: BytesMut::new(),
            prechecked: 0,
            sessions: HashSet::new(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            announce_idle: None,
            closed: false,
            renamed: 0,
        }
    }

    /// Inbound: at most `n` sessions at once (a begin beyond is a framing error).
    pub fn with_max_sessions(mut self, n: usize) -> Self {
        self.max_sessions = n;
        self
    }

    /// Outbound: rewrite the broker's open to announce `ms` as its idle-time-out (0: none).
    pub fn with_announced_idle(mut self, ms: u32) -> Self {
        self.announce_idle = (ms > 0).then_some(ms);
        self
    }

    /// Whether a close frame has passed.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Bytes of inbound frames held for credit.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Share `pipeline` with the other direction's rewriter.
    pub fn with_pipeline(mut self, pipeline: Arc<Mutex<Pipeline>>) -> Self {
        self.pipeline = Some(pipeline);
        self
    }

    fn pipe(&self) -> Option<MutexGuard<'_, Pipeline>> {
        self.pipeline
            .as_ref()
            .map(|p| p.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Inbound: frames held for early transfers go back in front of `input` once nothing is
    /// blocked any more; returns whether it did.
    pub fn release_held(&mut self, input: &mut BytesMut) -> bool {
        if self.held.is_empty() || self.pipe().is_some_and(|p| p.blocked()) {
            return false;
        }
        let mut again = std::mem::take(&mut self.held);
        debug_assert_eq!(
            self.prechecked, 0,
            "release before the last one was processed"
        );
        self.prechecked = again.len();
        again.extend_from_slice(input);
        *input = again;
        true
    }

    /// Whether the connection is past SASL (AMQP frames may flow).
    pub fn in_amqp(&self) -> bool {
        !self.sasl && !self.header_due
    }

    /// Whether a protocol header has passed.
    pub fn sent_header(&self) -> bool {
        !self.header_due || self.sasl || self.opened
    }

    /// Whether an open frame has passed.
    pub fn opened(&self) -> bool {
        self.opened
    }

    /// Move every complete header and frame from `input` to `out`, renaming attaches. Bytes of
    /// an incomplete item stay in `input`.
    pub fn process(&mut self, input: &mut BytesMut, out: &mut BytesMut) -> Result<(), FrameError> {
        let r = self.process_frames(input, out);
        // Fail safe (M27): whatever was not consumed is checked if it is ever offered again.
        if r.is_err() {
            self.prechecked = 0;
        }
        debug_assert!(
            r.is_err() || self.prechecked == 0,
            "released frames left unprocessed"
        );
        r
    }

    fn process_frames(
        &mut self,
        input: &mut BytesMut,
        out: &mut BytesMut,
    ) -> Result<(), FrameError> {
        loop {
            if input.len() >= 4 && &input[..4] == b"AMQP" {
                if input.len() < 8 {
                    return Ok(());
                }
                let id = input[4];
                if input[5..8] != [1, 0, 0] || (id != 0 && id != 3) {
                    return Err(FrameError::BadHeader(input[..8].to_vec()));
                }
                self.sasl = id == 3;
                self.header_due = false;
                out.extend_from_slice(&input.split_to(8));
                continue;
            }
            if self.header_due {
                if input.len() >= 4 || (!input.is_empty() && !b"AMQP".starts_with(input)) {
                    let n = input.len().min(8);
                    return Err(FrameError::BadHeader(input[..n].to_vec()));
                }
                return Ok(());
            }
            if input.len() < 8 {
                return Ok(());
            }
            let size = u32::from_be_bytes([input[0], input[1], input[2], input[3]]);
            let (doff, kind) = (input[4], input[5]);
            // Until the open has passed no peer frame may exceed 512 bytes (AMQP 1.0 §2.7.1,
            // §5.3.1 for SASL frames): a peer cannot make the broker buffer a large frame
            // before it has even said who it is (decision M22).
            let max = if self.opened || self.dir == Direction::Outbound {
                self.max_frame
            } else {
                self.max_frame.min(MIN_MAX_FRAME_SIZE)
            };
            if size < 8 || size > max {
                return Err(FrameError::Size { size, max });
            }
            if doff < 2 || doff as u32 * 4 > size {
                return Err(FrameError::Offset { doff, size });
            }
            if kind != FRAME_AMQP && kind != FRAME_SASL {
                return Err(FrameError::Type(kind));
            }
            if input.len() < size as usize {
                // Grow toward the frame as its bytes arrive; never reserve a declared size up
                // front (found by the fuzz target: a 4 GiB size field meant a 4 GiB allocation).
                input.reserve((size as usize - input.len()).min(64 * 1024));
                return Ok(());
            }
            let frame = input.split_to(size as usize);
            let body = &frame[doff as usize * 4..];
            let checked = self.prechecked >= frame.len();
            self.prechecked = self.prechecked.saturating_sub(frame.len());
            // Inbound bytes are untrusted: every length inside the performative (and, for a
            // transfer, inside the message sections that fill the frame) must fit before
            // anything decodes them (decision M11) — once, on arrival (M27).
            if self.dir == Direction::Inbound && !body.is_empty() && !checked {
                let channel = u16::from_be_bytes([frame[6], frame[7]]);
                self.check_frame(kind, channel, body)?;
                if kind == FRAME_AMQP {
                    self.check_channel(channel, body)?;
                }
            }
            if kind == FRAME_SASL {
                // sasl-outcome (descriptor 0x44): the peer sends a new protocol header next.
                if is_described(body, 0x44, "amqp:sasl-outcome:list") {
                    self.header_due = true;
                }
                out.extend_from_slice(&frame);
                continue;
            }
            if is_described(body, 0x10, "amqp:open:list") {
                self.opened = true;
                if self.dir == Direction::Outbound {
                    if let Some(ms) = self.announce_idle {
                        let channel = u16::from_be_bytes([frame[6], frame[7]]);
                        let open = with_idle_time_out(body, ms).map_err(FrameError::Encoding)?;
                        out.extend_from_slice(&crate::wire::frame(FRAME_AMQP, channel, &open, &[]));
                        continue;
                    }
                }
            }
            if is_described(body, 0x18, "amqp:close:list") {
                self.closed = true;
            }
            if self.pipeline.is_some() {
                let channel = u16::from_be_bytes([frame[6], frame[7]]);
                if self.dir == Direction::Inbound {
                    if self.pipe().is_some_and(|p| p.blocked()) || !self.held.is_empty() {
                        if self.held.len() + frame.len() > MAX_HELD {
                            return Err(FrameError::Pipelined(MAX_HELD));
                        }
                        self.held.extend_from_slice(&frame);
                        continue;
                    }
                    if self.track_inbound(channel, body) {
                        self.held.extend_from_slice(&frame);
                        continue;
                    }
                } else {
                    self.track_outbound(channel, body);
                }
            }
            if is_described(body, 0x12, "amqp:attach:list") {
                if let Some(renamed) = self.rename(body)? {
                    let channel = u16::from_be_bytes([frame[6], frame[7]]);
                    out.put_u32(8 + renamed.len() as u32);
                    out.put_slice(&[2, FRAME_AMQP]);
                    out.put_u16(channel);
                    out.put_slice(&renamed);
                    self.renamed += 1;
                    continue;
                }
            }
            out.extend_from_slice(&frame);
        }
    }

    /// Inbound session frames must ride on a channel the peer has begun (AMQP 1.0 §2.5.1); a
    /// begin must take a free channel, within `max_sessions` (decision M17). fe2o3-amqp would
    /// refuse such a frame itself, but the shim may hold it first (an early transfer waiting
    /// for credit that can never come), so the shim refuses it on arrival.
    fn check_channel(&mut self, channel: u16, body: &[u8]) -> Result<(), FrameError> {
        // open 0x10, begin 0x11, end 0x17, close 0x18; the rest (attach 0x12, flow 0x13,
        // transfer 0x14, disposition 0x15, detach 0x16) belong to a session.
        let code = match body {
            [0x00, 0x53, c, ..] => *c,
            [0x00, 0x80, rest @ ..] if rest.len() >= 8 => rest[7],
            _ => {
                let named = [
                    (0x10, "amqp:open:list"),
                    (0x11, "amqp:begin:list"),
                    (0x12, "amqp:attach:list"),
                    (0x13, "amqp:flow:list"),
                    (0x14, "amqp:transfer:list"),
                    (0x15, "amqp:disposition:list"),
                    (0x16, "amqp:detach:list"),
                    (0x17, "amqp:end:list"),
                    (0x18, "amqp:close:list"),
                ];
                match named.iter().find(|(c, n)| is_described(body, *c, n)) {
                    Some((c, _)) => *c,
                    None => return Ok(()), // the decoder refuses it
                }
            }
        };
        match code {
            0x11 => {
                if self.sessions.contains(&channel) {
                    return Err(FrameError::Begin {
                        channel,
                        why: "the channel already has a session".into(),
                    });
                }
                if self.sessions.len() >= self.max_sessions {
                    return Err(FrameError::Begin {
                        channel,
                        why: format!("more than {} sessions", self.max_sessions),
                    });
                }
                self.sessions.insert(channel);
            }
            0x17 if !self.sessions.remove(&channel) => return Err(FrameError::NoSession(channel)),
            0x12..=0x16 if !self.sessions.contains(&channel) => {
                return Err(FrameError::NoSession(channel))
            }
            _ => {}
        }
        Ok(())
    }

    /// Check an inbound frame's encoding. A transfer's payload is checked when the frame holds
    /// a whole delivery; the pieces of a multi-frame delivery are not values on their own, so
    /// they are copied (bounded) and the whole is checked when its last frame arrives, before
    /// that frame goes on: the broker's decoder never sees a delivery we have not checked.
    fn check_frame(&mut self, kind: u8, channel: u16, body: &[u8]) -> Result<(), FrameError> {
        let n = crate::wire::check_first(body).map_err(|e| FrameError::Encoding(e.to_string()))?;
        if kind != FRAME_AMQP || !is_described(body, 0x14, "amqp:transfer:list") {
            return if n == body.len() {
                Ok(())
            } else {
                Err(FrameError::Encoding("bytes after the performative".into()))
            };
        }
        // transfer: handle is field 0, more field 5, aborted field 9 (AMQP 1.0 §2.7.5).
        let perf = &body[..n];
        let key = (channel, transfer_handle(perf));
        let more = transfer_more(perf);
        if crate::wire::list_field(perf, 9).is_some_and(|v| v == [0x41] || v == [0x56, 0x01]) {
            // Aborted: the delivery is void (§2.6.14), nothing of it is decoded.
            if let Some(p) = self.partial.remove(&key) {
                self.partial_bytes -= p.len();
            }
            return Ok(());
        }
        let payload = &body[n..];
        match (self.partial.remove(&key), more) {
            (None, false) => {
                crate::wire::check(payload).map_err(|e| FrameError::Encoding(e.to_string()))
            }
            (prior, true) => {
                let mut p = prior.unwrap_or_default();
                if self.partial_bytes + payload.len() > MAX_PARTIAL {
                    return Err(FrameError::Encoding(format!(
                        "multi-frame deliveries in progress exceed {MAX_PARTIAL} bytes"
                    )));
                }
                self.partial_bytes += payload.len();
                p.extend_from_slice(payload);
                self.partial.insert(key, p);
                Ok(())
            }
            (Some(mut p), false) => {
                self.partial_bytes -= p.len();
                p.extend_from_slice(payload);
                crate::wire::check(&p).map_err(|e| FrameError::Encoding(e.to_string()))
            }
        }
    }

    /// Inbound: note the peer's sending links; true when this frame is a transfer on one the
    /// broker has not granted credit on yet (it must wait).
    fn track_inbound(&mut self, channel: u16, body: &[u8]) -> bool {
        let attach = is_described(body, 0x12, "amqp:attach:list");
        let transfer = is_described(body, 0x14, "amqp:transfer:list");
        if !(attach || (transfer && self.pipe().is_some_and(|p| p.waiting()))) {
            return false;
        }
        let mut p = self.pipe().expect("pipeline");
        match decode_performative(body) {
            Ok(Performative::Attach(a)) if a.role == Role::Sender => {
                p.inbound_attach(channel, a.name, a.handle.0);
                false
            }
            Ok(Performative::Transfer(t)) => p.inbound_transfer(channel, t.handle.0),
            _ => false,
        }
    }

    /// Outbound: the broker's begin, attach, flow and detach tell which peer links may send.
    fn track_outbound(&mut self, channel: u16, body: &[u8]) {
        let begin = is_described(body, 0x11, "amqp:begin:list");
        let attach = is_described(body, 0x12, "amqp:attach:list");
        let later = is_described(body, 0x13, "amqp:flow:list")
            || is_described(body, 0x16, "amqp:detach:list");
        if !(begin || attach || (later && self.pipe().is_some_and(|p| p.waiting()))) {
            return;
        }
        let mut p = self.pipe().expect("pipeline");
        match decode_performative(body) {
            Ok(Performative::Begin(b)) => {
                if let Some(peer) = b.remote_channel {
                    p.outbound_begin(channel, peer);
                }
            }
            Ok(Performative::Attach(a)) if a.role == Role::Receiver => {
                p.outbound_attach(channel, a.handle.0, a.name)
            }
            Ok(Performative::Flow(f)) => {
                if let (Some(h), Some(c)) = (f.handle, f.link_credit) {
                    if c > 0 {
                        p.outbound_ready(channel, h.0);
                    }
                }
            }
            // A refused link: its held transfers go on, for the broker to refuse too.
            Ok(Performative::Detach(d)) => p.outbound_ready(channel, d.handle.0),
            _ => {}
        }
    }

    /// The re-encoded attach if this direction renames it.
    fn rename(&self, body: &[u8]) -> Result<Option<Vec<u8>>, FrameError> {
        let perf: Performative = decode_performative(body).map_err(FrameError::Attach)?;
        let Performative::Attach(mut a) = perf else {
            return Ok(None);
        };
        match (self.dir, &a.role) {
            (Direction::Inbound, Role::Receiver) => a.name.push_str(SUFFIX),
            (Direction::Outbound, Role::Sender) if a.name.ends_with(SUFFIX) => {
                a.name.truncate(a.name.len() - SUFFIX.len())
            }
            _ => return Ok(None),
        }
        serde_amqp::to_vec(&Performative::Attach(a))
            .map(Some)
            .map_err(|e| FrameError::Attach(e.to_string()))
    }
}

/// The `handle` field (0) of an encoded transfer performative; u32::MAX when unreadable (the
/// decoder then refuses the frame itself).
fn transfer_handle(perf: &[u8]) -> u32 {
    match crate::wire::list_field(perf, 0) {
        Some([0x43]) => 0,
        Some([0x52, b]) => *b as u32,
        Some([0x70, a, b, c, d]) => u32::from_be_bytes([*a, *b, *c, *d]),
        _ => u32::MAX,
    }
}

/// The `more` field of an encoded transfer performative (already checked by [`crate::wire`]):
/// descriptor, list constructor, then fields handle, delivery-id, delivery-tag,
/// message-format, settled, more.
fn transfer_more(perf: &[u8]) -> bool {
    crate::wire::list_field(perf, 5).is_some_and(|v| v == [0x41] || v == [0x56, 0x01])
}

/// Decode a performative from untrusted bytes. serde_amqp 0.18 can panic on some malformed
/// lists ("attempt to add with overflow" in its list-header accounting, found by our fuzz
/// target, with overflow checks on); a panic here is a malformed frame, not a dead task.
fn decode_performative(body: &[u8]) -> Result<Performative, String> {
    crate::wire::check_first(body).map_err(|e| e.to_string())?;
    std::panic::catch_unwind(|| serde_amqp::from_slice::<Performative>(body))
        .map_err(|_| "undecodable performative".to_string())?
        .map_err(|e| e.to_string())
}

/// Re-encode an open performative with `idle_time_out` = `ms`.
fn with_idle_time_out(body: &[u8], ms: u32) -> Result<Vec<u8>, String> {
    match decode_performative(body)? {
        Performative::Open(mut o) => {
            o.idle_time_out = Some(ms);
            serde_amqp::to_vec(&Performative::Open(o)).map_err(|e| e.to_string())
        }
        _ => Err("not an open".into()),
    }
}

/// Sessions per connection unless configured (fe2o3-amqp's own default allows 65 536).
pub const DEFAULT_MAX_SESSIONS: usize = 64;

/// Most bytes of unfinished multi-frame deliveries copied per connection (4 MiB); also the
/// max-message-size every broker link announces (decision M26).
pub const MAX_PARTIAL: usize = 4 << 20;

/// Most bytes held for early transfers per connection.
pub const MAX_HELD: usize = 256 * 1024;

/// Which of the peer's links may send yet. A peer that pipelines (AMQP 1.0 §2.4.1) — as a
/// 0-RTT sender does, with its open, begin, attach and first transfer in one flight — sends
/// transfers before the broker's attach and flow; fe2o3-amqp would refuse a transfer on a link
/// it has not finished attaching. The shim holds such a transfer, and every frame after it,
/// until the broker's flow grants that link credit (decision M9).
#[derive(Debug, Default)]
pub struct Pipeline {
    /// The peer's sending links still without credit: (peer channel, name) → peer handle.
    waiting: HashMap<(u16, String), u32>,
    /// Broker channel → peer channel.
    channels: HashMap<u16, u16>,
    /// (broker channel, broker handle) → (peer channel, link name).
    links: HashMap<(u16, u32), (u16, String)>,
    /// Peer links (channel, handle) with held transfers.
    blocked: HashSet<(u16, u32)>,
}

impl Pipeline {
    /// Some peer sending link has no credit yet.
    pub fn waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Transfers are held.
    pub fn blocked(&self) -> bool {
        !self.blocked.is_empty()
    }

    /// The peer attached a sending link.
    pub fn inbound_attach(&mut self, channel: u16, name: String, handle: u32) {
        if self.waiting.len() < 4096 {
            self.waiting.insert((channel, name), handle);
        }
    }

    /// A peer transfer on `handle`: true if it must wait for credit.
    pub fn inbound_transfer(&mut self, channel: u16, handle: u32) -> bool {
        let early = self
            .waiting
            .iter()
            .any(|((c, _), h)| *c == channel && *h == handle);
        if early {
            self.blocked.insert((channel, handle));
        }
        early
    }

    /// The broker began a session answering the peer's `peer_channel`.
    pub fn outbound_begin(&mut self, channel: u16, peer_channel: u16) {
        self.channels.insert(channel, peer_channel);
    }

    /// The broker attached its receiving end of the peer's link `name`.
    pub fn outbound_attach(&mut self, channel: u16, handle: u32, name: String) {
        if let Some(pc) = self.channels.get(&channel) {
            self.links.insert((channel, handle), (*pc, name));
        }
    }

    /// The broker granted credit on (or detached) its link `handle`: the peer's link may send.
    pub fn outbound_ready(&mut self, channel: u16, handle: u32) {
        if let Some((pc, name)) = self.links.remove(&(channel, handle)) {
            if let Some(ph) = self.waiting.remove(&(pc, name)) {
                self.blocked.remove(&(pc, ph));
            }
        }
    }
}

/// Whether `body` starts with a described type whose descriptor is `code` (as a small or full
/// ulong) or `name` (as a symbol).
fn is_described(body: &[u8], code: u8, name: &str) -> bool {
    match body {
        [0x00, 0x53, c, ..] => *c == code,
        [0x00, 0x80, rest @ ..] if rest.len() >= 8 => rest[..8] == [0, 0, 0, 0, 0, 0, 0, code],
        [0x00, 0xa3, n, rest @ ..] => rest.get(..*n as usize) == Some(name.as_bytes()),
        [0x00, 0xb3, rest @ ..] if rest.len() >= 4 => {
            let n = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            rest.get(4..4 + n) == Some(name.as_bytes())
        }
        _ => false,
    }
}

/// A close frame (channel 0) with `amqp:connection:framing-error` and `why`.
pub fn framing_error_close(why: &str) -> Vec<u8> {
    error_close(ConnectionError::FramingError.into(), why)
}

/// A close frame (channel 0) with `condition` and `why`.
pub fn error_close(condition: ErrorCondition, why: &str) -> Vec<u8> {
    let close = Performative::Close(Close {
        error: Some(definitions::Error {
            condition,
            description: Some(why.to_string()),
            info: None,
        }),
    });
    crate::wire::amqp_frame(&close, &[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use fe2o3_amqp::types::performatives::Attach;

    fn frame(perf: &Performative) -> Vec<u8> {
        crate::wire::frame(0, 3, &serde_amqp::to_vec(perf).unwrap(), &[])
    }

    fn attach(name: &str, role: Role) -> Performative {
        Performative::Attach(Attach {
            name: name.into(),
            handle: 1.into(),
            role,
            snd_settle_mode: Default::default(),
            rcv_settle_mode: Default::default(),
            source: None,
            target: None,
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: None,
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        })
    }

    /// An inbound rewriter whose peer has begun a session on channel 3 (the tests' frames).
    fn inbound() -> Rewriter {
        let mut rw = Rewriter::new(Direction::Inbound, 65536);
        rw.sessions.insert(3);
        rw
    }

    fn run(dir: Direction, bytes: &[u8]) -> Result<(Vec<u8>, Vec<u8>), FrameError> {
        let mut rw = match dir {
            Direction::Inbound => inbound(),
            Direction::Outbound => Rewriter::new(dir, 65536),
        };
        let mut input = BytesMut::from(bytes);
        let mut out = BytesMut::new();
        rw.process(&mut input, &mut out)?;
        Ok((out.to_vec(), input.to_vec()))
    }

    fn decode(f: &[u8]) -> Performative {
        serde_amqp::from_slice(&f[8..]).unwrap()
    }

    #[test]
    fn renames_the_brokers_sending_links_both_ways() {
        let mut s = b"AMQP\x00\x01\x00\x00".to_vec();
        s.extend(frame(&attach("link", Role::Receiver)));
        let (out, rest) = run(Direction::Inbound, &s).unwrap();
        assert!(rest.is_empty());
        let Performative::Attach(a) = decode(&out[8..]) else {
            panic!()
        };
        assert_eq!(a.name, format!("link{SUFFIX}"));
        assert_eq!(&out[14..16], &[0, 3], "channel kept");
        // The peer's sender link of the same name passes untouched.
        let mut s = b"AMQP\x00\x01\x00\x00".to_vec();
        let f = frame(&attach("link", Role::Sender));
        s.extend(&f);
        assert_eq!(run(Direction::Inbound, &s).unwrap().0[8..], f[..]);
        // The broker's answer loses the suffix.
        let mut s = b"AMQP\x00\x01\x00\x00".to_vec();
        s.extend(frame(&attach(&format!("link{SUFFIX}"), Role::Sender)));
        let (out, _) = run(Direction::Outbound, &s).unwrap();
        let Performative::Attach(a) = decode(&out[8..]) else {
            panic!()
        };
        assert_eq!(a.name, "link");
    }

    #[test]
    fn incomplete_input_waits_and_other_frames_pass_byte_for_byte() {
        let mut s = b"AMQP\x03\x01\x00\x00".to_vec();
        // A SASL frame whose body is a well-formed value passes untouched.
        s.extend_from_slice(&[0, 0, 0, 10, 2, 1, 0, 0, 0x52, 0x07]);
        s.extend_from_slice(&[0, 0, 0, 8, 2, 0]);
        let (out, rest) = run(Direction::Inbound, &s).unwrap();
        assert_eq!(out, s[..18]);
        assert_eq!(rest, s[18..]);
        // One whose body lies about its lengths does not.
        let mut bad = b"AMQP\x03\x01\x00\x00".to_vec();
        bad.extend_from_slice(&[0, 0, 0, 13, 2, 1, 0, 0, 0xb1, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(
            run(Direction::Inbound, &bad),
            Err(FrameError::Encoding(_))
        ));
        // Split anywhere: the same output.
        let mut s = b"AMQP\x00\x01\x00\x00".to_vec();
        s.extend(frame(&attach("x", Role::Receiver)));
        s.extend_from_slice(&[0, 0, 0, 8, 2, 0, 0, 0]);
        let whole = run(Direction::Inbound, &s).unwrap().0;
        for cut in 0..s.len() {
            let mut rw = inbound();
            let mut input = BytesMut::from(&s[..cut]);
            let mut out = BytesMut::new();
            rw.process(&mut input, &mut out).unwrap();
            input.extend_from_slice(&s[cut..]);
            rw.process(&mut input, &mut out).unwrap();
            assert_eq!(out.to_vec(), whole, "cut at {cut}");
        }
    }

    #[test]
    fn bad_framing_is_named() {
        assert!(matches!(
            run(Direction::Inbound, b"GET / HTTP/1.1\r\n"),
            Err(FrameError::BadHeader(_))
        ));
        assert!(matches!(
            run(Direction::Inbound, b"AMQP\x09\x01\x00\x00"),
            Err(FrameError::BadHeader(_))
        ));
        let h = b"AMQP\x00\x01\x00\x00".to_vec();
        let with = |f: &[u8]| [h.clone(), f.to_vec()].concat();
        // Before the open, no frame may exceed 512 bytes, whatever max-frame-size says.
        assert_eq!(
            run(Direction::Inbound, &with(&[0, 0, 0, 4, 2, 0, 0, 0])),
            Err(FrameError::Size { size: 4, max: 512 })
        );
        assert_eq!(
            run(Direction::Inbound, &with(&[0, 0, 3, 232, 2, 0, 0, 0])),
            Err(FrameError::Size {
                size: 1000,
                max: 512
            })
        );
        assert!(matches!(
            run(Direction::Inbound, &with(&[0, 2, 0, 0, 2, 0, 0, 0])),
            Err(FrameError::Size { .. })
        ));
        assert_eq!(
            run(Direction::Inbound, &with(&[0, 0, 0, 8, 1, 0, 0, 0])),
            Err(FrameError::Offset { doff: 1, size: 8 })
        );
        assert_eq!(
            run(Direction::Inbound, &with(&[0, 0, 0, 8, 2, 7, 0, 0])),
            Err(FrameError::Type(7))
        );
        // An attach descriptor with a broken list.
        assert!(matches!(
            run(
                Direction::Inbound,
                &with(&[0, 0, 0, 12, 2, 0, 0, 0, 0, 0x53, 0x12, 0xc0])
            ),
            Err(FrameError::Encoding(_))
        ));
        let close = framing_error_close("x");
        let Performative::Close(c) = decode(&close) else {
            panic!()
        };
        assert_eq!(
            c.error.unwrap().condition,
            ConnectionError::FramingError.into()
        );
    }

    #[test]
    fn an_attach_that_panics_the_decoder_is_a_malformed_frame() {
        // Found by the fuzz target (fuzz/artifacts, first byte = split point): a list header
        // that makes serde_amqp overflow while counting fields.
        let data: &[u8] = b"\x04\x00\x00\x00\x14\x02\x00\x00\x01\x00\x53\x12\xd0\x11\x43\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x42\x43\x00\x02\x00\x00";
        let rest = &data[1..];
        let mut rw = Rewriter::new(Direction::Inbound, 4096);
        let mut input = BytesMut::from(&b"AMQP\x00\x01\x00\x00"[..]);
        input.extend_from_slice(rest);
        let mut out = BytesMut::new();
        let r = rw.process(&mut input, &mut out);
        assert!(
            matches!(r, Err(FrameError::Encoding(_)) | Err(FrameError::Attach(_))),
            "{r:?}"
        );
    }

    #[test]
    fn a_string_longer_than_its_frame_never_reaches_the_decoder() {
        // Found by the fuzz target: serde_amqp allocated the declared ~3 GB before checking.
        let data: &[u8] = b"\x04\x00\x00\x00\x14\x02\x00\x00\x01\x00\x53\x12\xc0\xa3\xa3\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xb1\xf0\x51\x40\x5d\x51\x50\x02\x41";
        let mut rw = Rewriter::new(Direction::Inbound, 4096);
        let mut input = BytesMut::from(&b"AMQP\x00\x01\x00\x00"[..]);
        input.extend_from_slice(&data[1..]);
        let mut out = BytesMut::new();
        assert!(matches!(
            rw.process(&mut input, &mut out),
            Err(FrameError::Encoding(_))
        ));
    }

    #[test]
    fn session_frames_need_a_begun_channel() {
        use fe2o3_amqp::types::performatives::{Begin, End};
        let begin = Performative::Begin(Begin {
            remote_channel: None,
            next_outgoing_id: 0,
            incoming_window: 1,
            outgoing_window: 1,
            handle_max: 1.into(),
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        });
        let on = |ch: u16, p: &Performative| {
            crate::wire::frame(0, ch, &serde_amqp::to_vec(p).unwrap(), &[])
        };
        let feed = |rw: &mut Rewriter, bytes: &[u8]| {
            let mut input = BytesMut::from(bytes);
            rw.process(&mut input, &mut BytesMut::new())
        };
        let mut rw = Rewriter::new(Direction::Inbound, 65536).with_max_sessions(2);
        feed(&mut rw, b"AMQP\x00\x01\x00\x00").unwrap();
        feed(&mut rw, &on(5, &begin)).unwrap();
        assert_eq!(
            feed(&mut rw, &on(0, &attach("a", Role::Sender))),
            Err(FrameError::NoSession(0))
        );
        assert!(feed(&mut rw, &on(5, &attach("a", Role::Sender))).is_ok());
        assert!(matches!(
            feed(&mut rw, &on(5, &begin)),
            Err(FrameError::Begin { .. })
        ));
        feed(&mut rw, &on(6, &begin)).unwrap();
        assert!(
            matches!(feed(&mut rw, &on(7, &begin)), Err(FrameError::Begin { .. })),
            "limit 2"
        );
        feed(&mut rw, &on(6, &Performative::End(End { error: None }))).unwrap();
        feed(&mut rw, &on(7, &begin)).unwrap();
        assert_eq!(
            feed(&mut rw, &on(6, &Performative::End(End { error: None }))),
            Err(FrameError::NoSession(6))
        );
        assert_eq!(
            FrameError::NoSession(0).condition(),
            AmqpError::NotFound.into()
        );
    }

    /// A pipelining client's whole conversation: its transfer waits for credit, and its
    /// detach, end and close arrive while it waits. Released, the held frames must pass as
    /// they are: checked a second time, the transfer found its session already ended and the
    /// connection was closed (with pre-settled messages, as `qgate send --one-per-connection
    /// --settle` sends them, the message was lost: 1 in ~100 on loopback).
    #[test]
    fn frames_held_for_credit_are_checked_once() {
        use fe2o3_amqp::types::definitions::Handle;
        use fe2o3_amqp::types::performatives::{Begin, Close, Detach, End, Flow};
        let on = |ch: u16, p: &Performative, payload: &[u8]| {
            crate::wire::frame(0, ch, &serde_amqp::to_vec(p).unwrap(), payload)
        };
        let begin = |remote: Option<u16>| {
            Performative::Begin(Begin {
                remote_channel: remote,
                next_outgoing_id: 0,
                incoming_window: 10,
                outgoing_window: 10,
                handle_max: 1.into(),
                offered_capabilities: None,
                desired_capabilities: None,
                properties: None,
            })
        };
        let mut sender = attach("s", Role::Sender);
        let mut receiver = attach("s", Role::Receiver);
        if let (Performative::Attach(a), Performative::Attach(b)) = (&mut sender, &mut receiver) {
            a.handle = Handle(0);
            b.handle = Handle(0);
        }
        let pipeline = Arc::new(Mutex::new(Pipeline::default()));
        let mut rin = Rewriter::new(Direction::Inbound, 65536).with_pipeline(pipeline.clone());
        let mut rout = Rewriter::new(Direction::Outbound, 65536).with_pipeline(pipeline);
        let mut data = vec![0x00, 0x53, 0x75, 0xa0, 3];
        data.extend_from_slice(b"abc");
        let transfer = transfer_frame(false, &data);
        let mut transfer0 = transfer.clone();
        transfer0[6..8].copy_from_slice(&[0, 0]); // channel 0
        let mut input = BytesMut::from(&b"AMQP\x00\x01\x00\x00"[..]);
        input.extend_from_slice(&on(0, &begin(None), &[]));
        input.extend_from_slice(&on(0, &sender, &[]));
        input.extend_from_slice(&transfer0);
        let mut out = BytesMut::new();
        rin.process(&mut input, &mut out).unwrap();
        assert!(rin.held() > 0, "the transfer waits for credit");
        let bye = [
            on(
                0,
                &Performative::Detach(Detach {
                    handle: Handle(0),
                    closed: true,
                    error: None,
                }),
                &[],
            ),
            on(0, &Performative::End(End { error: None }), &[]),
            on(0, &Performative::Close(Close { error: None }), &[]),
        ]
        .concat();
        input.extend_from_slice(&bye);
        rin.process(&mut input, &mut out).unwrap();
        let before = out.len();
        // The broker begins, attaches its receiving end and grants credit.
        let flow = Performative::Flow(Flow {
            next_incoming_id: Some(0),
            incoming_window: 10,
            next_outgoing_id: 0,
            outgoing_window: 10,
            handle: Some(Handle(0)),
            delivery_count: Some(0),
            link_credit: Some(10),
            available: None,
            drain: false,
            echo: false,
            properties: None,
        });
        let mut broker = BytesMut::from(&b"AMQP\x00\x01\x00\x00"[..]);
        for p in [begin(Some(0)), receiver, flow] {
            broker.extend_from_slice(&on(0, &p, &[]));
        }
        rout.process(&mut broker, &mut BytesMut::new()).unwrap();
        assert!(rin.release_held(&mut input));
        rin.process(&mut input, &mut out)
            .expect("released frames pass");
        assert_eq!(rin.held(), 0);
        assert_eq!(out.len() - before, transfer0.len() + bye.len());
        // The session really is over: a new frame on channel 0 is still refused.
        let mut late = BytesMut::from(&transfer0[..]);
        assert_eq!(
            rin.process(&mut late, &mut out),
            Err(FrameError::NoSession(0))
        );
    }

    fn transfer_frame(more: bool, payload: &[u8]) -> Vec<u8> {
        use fe2o3_amqp::types::performatives::Transfer;
        let t = Performative::Transfer(Transfer {
            handle: 0.into(),
            delivery_id: Some(0),
            delivery_tag: Some(vec![0u8].into()),
            message_format: Some(0),
            settled: Some(false),
            more,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        });
        crate::wire::frame(0, 3, &serde_amqp::to_vec(&t).unwrap(), payload)
    }

    #[test]
    fn a_multi_frame_delivery_is_checked_whole_before_its_last_frame_passes() {
        let run2 = |payload: &[u8]| {
            let (a, b) = payload.split_at(payload.len() / 2);
            let first = transfer_frame(true, a);
            let last = transfer_frame(false, b);
            let mut rw = inbound();
            let mut input = BytesMut::from(&b"AMQP\x00\x01\x00\x00"[..]);
            input.extend_from_slice(&first);
            input.extend_from_slice(&last);
            let mut out = BytesMut::new();
            let r = rw.process(&mut input, &mut out);
            (r, out.len(), first.len(), last.len())
        };
        // A data section of 40 bytes, whole: both frames pass.
        let mut good = vec![0x00, 0x53, 0x75, 0xa0, 40];
        good.extend_from_slice(&[7u8; 40]);
        let (r, out, first, last) = run2(&good);
        assert!(r.is_ok());
        assert_eq!(out, 8 + first + last);
        // The same section declaring 4 GiB: each piece alone says nothing, the whole lies.
        let mut liar = vec![0x00, 0x53, 0x75, 0xb0, 0xff, 0xff, 0xff, 0xf0];
        liar.extend_from_slice(&[7u8; 40]);
        let (r, out, first, _) = run2(&liar);
        assert!(matches!(r, Err(FrameError::Encoding(_))), "{r:?}");
        assert_eq!(out, 8 + first, "the last frame never reached the broker");
    }

    #[test]
    fn unfinished_deliveries_are_bounded() {
        let mut rw = inbound();
        rw.opened = true; // frames beyond 512 bytes come after the open

        let mut input = BytesMut::from(&b"AMQP\x00\x01\x00\x00"[..]);
        let piece = transfer_frame(true, &[0u8; 60_000]);
        for _ in 0..(MAX_PARTIAL / 60_000 + 2) {
            input.extend_from_slice(&piece);
        }
        let mut out = BytesMut::new();
        let r = rw.process(&mut input, &mut out);
        assert!(
            matches!(r, Err(FrameError::Encoding(ref m)) if m.contains("exceed")),
            "{r:?}"
        );
    }

    #[test]
    fn a_huge_size_field_does_not_allocate_it() {
        // Found by the fuzz target: the outbound side trusts sizes up to u32::MAX.
        let mut rw = Rewriter::new(Direction::Outbound, u32::MAX);
        let mut input =
            BytesMut::from(&b"AMQP\x00\x01\x00\x00\xff\xff\xff\xf0\x02\x00\x00\x00"[..]);
        let mut out = BytesMut::new();
        rw.process(&mut input, &mut out).unwrap();
        assert_eq!(out.len(), 8);
        assert!(input.capacity() < 1 << 20, "{}", input.capacity());
    }

    proptest::proptest! {
        /// Arbitrary bytes after a valid header never panic, and whatever is emitted is a
        /// prefix-preserving sequence of whole items.
        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            for start in [&b"AMQP\x00\x01\x00\x00"[..], &b"AMQP\x03\x01\x00\x00"[..], &b""[..]] {
                let mut rw = Rewriter::new(Direction::Inbound, 512);
                let mut input = BytesMut::from([start, &tail[..]].concat().as_slice());
                let mut out = BytesMut::new();
                let _ = rw.process(&mut input, &mut out);
                proptest::prop_assert!(out.len() + input.len() <= start.len() + tail.len() + 64 * 1024);
            }
        }
    }
}
