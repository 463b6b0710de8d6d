//! A watch on the HTTP/3 frames a peer sends on one stream, read from the frame headers as the
//! bytes pass, so that a frame too long to hold is refused when it is announced, not after it
//! has been buffered (decision T12).
//!
//! Why: h3 holds every frame other than DATA whole before it decodes it (HEADERS, SETTINGS, a
//! reserved or unknown type), however long the frame says it is, and keeps reading — and
//! granting flow-control credit — until it has it all. One request stream announcing a
//! 2^40-byte HEADERS frame and sending filler grew a server by ~1.2 × the bytes sent. DATA is
//! streamed to the application, whose own limits (the body size, the server's byte budget)
//! apply to it.
//!
//! Sans-IO: [`FrameGuard::scan`] takes the bytes in any cuts and says whether they are still
//! within the limit; the stream wrapper ([`super::Guarded`]) calls it on every chunk it hands h3.

/// HTTP/3 frame type DATA (RFC 9114 §7.2.1): streamed, not held, so never too long here.
const DATA: u64 = 0x00;
/// Unidirectional stream type of the control stream (RFC 9114 §6.2.1): frames follow.
const CONTROL: u64 = 0x00;

/// What kind of stream is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// A request (bidirectional) stream: frames from its first byte.
    Request,
    /// A unidirectional stream: its type first; only the control stream carries frames (QPACK
    /// streams carry instructions h3 does not read here, other types it stops at once).
    Unidirectional,
}

/// A frame other than DATA announced longer than the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLong {
    /// Its frame type.
    pub frame_type: u64,
    /// The length it announced.
    pub length: u64,
    /// The limit it broke.
    pub limit: u64,
}

impl std::fmt::Display for TooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "HTTP/3 frame of type {:#x} announced {} bytes, over the {}-byte limit for frames held whole",
            self.frame_type, self.length, self.limit
        )
    }
}

impl std::error::Error for TooLong {}

/// What a run of a stream's bytes is ([`FrameGuard::segment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    /// This many bytes of a DATA frame's payload.
    Data(usize),
    /// This many bytes h3 holds; `complete` once they end a frame (or a DATA frame's header);
    /// `empty_data` when what they completed is a DATA frame with nothing in it.
    Held {
        len: usize,
        complete: bool,
        empty_data: bool,
    },
}

/// A QUIC variable-length integer read a byte at a time (RFC 9000 §16).
#[derive(Debug, Clone, Copy, Default)]
struct Varint {
    /// Bytes it has in all (1, 2, 4 or 8), known from its first byte; 0 before that.
    len: u8,
    /// Bytes read so far.
    read: u8,
    value: u64,
}

impl Varint {
    /// Take one byte; the value once it is complete.
    fn push(&mut self, b: u8) -> Option<u64> {
        if self.read == 0 {
            self.len = 1 << (b >> 6);
            self.value = u64::from(b & 0x3f);
        } else {
            self.value = (self.value << 8) | u64::from(b);
        }
        self.read += 1;
        (self.read == self.len).then_some(self.value)
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// A unidirectional stream's type.
    StreamType(Varint),
    FrameType(Varint),
    FrameLength {
        frame_type: u64,
        length: Varint,
    },
    /// Inside a frame's payload: this many bytes left; whether the frame is DATA.
    Payload {
        left: u64,
        data: bool,
    },
    /// A stream that carries no frames, or one already refused: nothing more to check.
    Unframed,
}

/// The watch on one stream.
#[derive(Debug, Clone)]
pub struct FrameGuard {
    state: State,
    limit: u64,
    stream_type: Option<u64>,
}

impl FrameGuard {
    /// Watch a stream of `kind`, refusing a frame other than DATA longer than `limit` bytes.
    pub fn new(kind: StreamKind, limit: u64) -> FrameGuard {
        let state = match kind {
            StreamKind::Request => State::FrameType(Varint::default()),
            StreamKind::Unidirectional => State::StreamType(Varint::default()),
        };
        FrameGuard {
            state,
            limit,
            stream_type: None,
        }
    }

    /// A unidirectional stream's type, once read.
    pub fn stream_type(&self) -> Option<u64> {
        self.stream_type
    }

    /// Read a unidirectional stream's type from the start of `bytes`: how many of them it
    /// took if it is complete now (0 if it was before: the rest is to be
    /// [`scan`](Self::scan)ned), `None` if all of them were part of it and more is to come.
    pub fn take_stream_type(&mut self, bytes: &[u8]) -> Option<usize> {
        for (i, &b) in bytes.iter().enumerate() {
            let State::StreamType(v) = &mut self.state else {
                return Some(i);
            };
            if let Some(t) = v.push(b) {
                self.stream_type = Some(t);
                self.state = if t == CONTROL {
                    State::FrameType(Varint::default())
                } else {
                    State::Unframed
                };
                return Some(i + 1);
            }
        }
        match self.state {
            State::StreamType(_) => None,
            _ => Some(0),
        }
    }

    /// How many of the next bytes are a DATA frame's payload (handed on to the application,
    /// not held by h3).
    pub fn data_ahead(&self) -> u64 {
        match self.state {
            State::Payload { left, data: true } => left,
            _ => 0,
        }
    }

    /// What the next bytes of a framed stream are, as far as they are one kind: a DATA frame's
    /// payload (handed to the application), or bytes h3 holds (frame headers, other frames'
    /// payloads), up to where a frame or a DATA frame's header is complete. The shell hands
    /// h3 each held run whole, so h3 holds one chunk per frame however the peer cut them.
    pub fn segment(&mut self, bytes: &[u8]) -> Result<Segment, TooLong> {
        if let State::Payload { left, data: true } = &mut self.state {
            let n = (*left).min(bytes.len() as u64);
            *left -= n;
            if *left == 0 {
                self.state = State::FrameType(Varint::default());
            }
            return Ok(Segment::Data(n as usize));
        }
        if matches!(self.state, State::Unframed) {
            return Ok(Segment::Held {
                len: bytes.len(),
                complete: true,
                empty_data: false,
            });
        }
        let mut taken = 0;
        while taken < bytes.len() {
            let before = matches!(
                self.state,
                State::FrameLength {
                    frame_type: DATA,
                    ..
                }
            );
            let n = match self.state {
                // A non-DATA payload: as much as there is, at once.
                State::Payload { left, data: false } => (left as usize).min(bytes.len() - taken),
                _ => 1,
            };
            self.scan(&bytes[taken..taken + n])?;
            taken += n;
            match self.state {
                State::FrameType(Varint { read: 0, .. }) => {
                    // A frame is complete; an empty DATA frame (it ends a body in h3) is
                    // reported so that the shell drops it.
                    return Ok(Segment::Held {
                        len: taken,
                        complete: true,
                        empty_data: before,
                    });
                }
                State::Payload { data: true, .. } => {
                    return Ok(Segment::Held {
                        len: taken,
                        complete: true,
                        empty_data: false,
                    })
                }
                State::Unframed => {
                    return Ok(Segment::Held {
                        len: bytes.len(),
                        complete: true,
                        empty_data: false,
                    })
                }
                _ => {}
            }
        }
        Ok(Segment::Held {
            len: taken,
            complete: false,
            empty_data: false,
        })
    }

    /// The next bytes of the stream, in order. An error is final: the stream must be stopped
    /// (later calls pass everything).
    pub fn scan(&mut self, mut bytes: &[u8]) -> Result<(), TooLong> {
        while let Some((&b, rest)) = bytes.split_first() {
            match &mut self.state {
                State::Unframed => return Ok(()),
                State::Payload { left, .. } => {
                    // Skip as much of the payload as this chunk holds, at once.
                    let n = (*left).min(bytes.len() as u64);
                    *left -= n;
                    bytes = &bytes[n as usize..];
                    if *left == 0 {
                        self.state = State::FrameType(Varint::default());
                    }
                    continue;
                }
                State::StreamType(v) => {
                    if let Some(t) = v.push(b) {
                        self.stream_type = Some(t);
                        self.state = if t == CONTROL {
                            State::FrameType(Varint::default())
                        } else {
                            State::Unframed
                        };
                    }
                }
                State::FrameType(v) => {
                    if let Some(frame_type) = v.push(b) {
                        self.state = State::FrameLength {
                            frame_type,
                            length: Varint::default(),
                        };
                    }
                }
                State::FrameLength { frame_type, length } => {
                    if let Some(len) = length.push(b) {
                        let frame_type = *frame_type;
                        if frame_type != DATA && len > self.limit {
                            self.state = State::Unframed;
                            return Err(TooLong {
                                frame_type,
                                length: len,
                                limit: self.limit,
                            });
                        }
                        self.state = if len == 0 {
                            State::FrameType(Varint::default())
                        } else {
                            State::Payload {
                                left: len,
                                data: frame_type == DATA,
                            }
                        };
                    }
                }
            }
            bytes = rest;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(v: u64) -> Vec<u8> {
        match v {
            0..=0x3f => vec![v as u8],
            0x40..=0x3fff => ((v as u16) | 0x4000).to_be_bytes().to_vec(),
            0x4000..=0x3fff_ffff => ((v as u32) | 0x8000_0000).to_be_bytes().to_vec(),
            _ => (v | 0xc000_0000_0000_0000).to_be_bytes().to_vec(),
        }
    }

    fn frame(ty: u64, payload_len: u64) -> Vec<u8> {
        let mut f = varint(ty);
        f.extend(varint(payload_len));
        f.extend(std::iter::repeat_n(0xab, payload_len as usize));
        f
    }

    /// Every way to cut `bytes` in two, and byte by byte: the same verdict each time.
    fn verdict(kind: StreamKind, limit: u64, bytes: &[u8]) -> Result<(), TooLong> {
        let whole = FrameGuard::new(kind, limit).scan(bytes);
        for cut in 0..=bytes.len() {
            let mut g = FrameGuard::new(kind, limit);
            let r = g.scan(&bytes[..cut]).and_then(|()| g.scan(&bytes[cut..]));
            assert_eq!(r, whole, "cut at {cut}");
        }
        let mut g = FrameGuard::new(kind, limit);
        let r = bytes
            .iter()
            .try_for_each(|b| g.scan(std::slice::from_ref(b)));
        assert_eq!(r, whole, "byte by byte");
        whole
    }

    #[test]
    fn frames_within_the_limit_pass_and_data_of_any_length_passes() {
        // HEADERS of the limit, an unknown type, an empty SETTINGS, DATA far over the limit
        // (its payload is not given: the guard must not need it).
        let mut s = frame(0x01, 100);
        s.extend(frame(0x21, 3));
        s.extend(frame(0x04, 0));
        s.extend(varint(DATA));
        s.extend(varint(1 << 40));
        assert_eq!(verdict(StreamKind::Request, 100, &s), Ok(()));
    }

    #[test]
    fn a_frame_announced_over_the_limit_is_refused_at_its_header() {
        for (ty, len) in [(0x01, 101), (0x01, 1 << 40), (0x21, 5000), (0x04, 1 << 20)] {
            let mut s = frame(0x01, 10);
            s.extend(frame(DATA, 500));
            s.extend(varint(ty));
            s.extend(varint(len));
            // Nothing of the payload yet: refused from the header alone.
            assert_eq!(
                verdict(StreamKind::Request, 100, &s),
                Err(TooLong {
                    frame_type: ty,
                    length: len,
                    limit: 100
                })
            );
        }
    }

    #[test]
    fn every_varint_width_is_read() {
        for len in [
            0u64,
            63,
            64,
            16383,
            16384,
            (1 << 30) - 1,
            1 << 30,
            (1 << 62) - 1,
        ] {
            let mut s = varint(0x01);
            s.extend(varint(len));
            let want = if len > 1000 {
                Err(TooLong {
                    frame_type: 1,
                    length: len,
                    limit: 1000,
                })
            } else {
                Ok(())
            };
            assert_eq!(verdict(StreamKind::Request, 1000, &s), want, "{len}");
        }
        // A frame type of every width too.
        for ty in [0x21u64, 0x4021, 0x4000_0021, 0x4000_0000_0021] {
            let mut s = varint(ty);
            s.extend(varint(2000));
            assert!(verdict(StreamKind::Request, 1000, &s).is_err(), "{ty:#x}");
        }
    }

    #[test]
    fn only_the_control_stream_is_framed_among_unidirectional_ones() {
        let mut control = varint(CONTROL);
        control.extend(frame(0x04, 6));
        control.extend(varint(0x21));
        control.extend(varint(1 << 30));
        assert!(verdict(StreamKind::Unidirectional, 1000, &control).is_err());
        // QPACK encoder (0x02) and decoder (0x03) streams, and a reserved type: not frames.
        for ty in [0x02u64, 0x03, 0x21] {
            let mut s = varint(ty);
            s.extend([0xff; 64]);
            assert_eq!(verdict(StreamKind::Unidirectional, 10, &s), Ok(()));
        }
    }

    #[test]
    fn the_stream_type_is_taken_first_and_data_ahead_is_known() {
        // A control stream: type 0x00 in one byte, then SETTINGS and a DATA frame (not allowed
        // there, but the guard only measures).
        let mut g = FrameGuard::new(StreamKind::Unidirectional, 100);
        let mut s = varint(CONTROL);
        s.extend(frame(0x04, 2));
        assert_eq!(g.take_stream_type(&s), Some(1));
        assert_eq!(g.stream_type(), Some(CONTROL));
        assert_eq!(g.take_stream_type(&s[1..]), Some(0), "already read");
        g.scan(&s[1..]).unwrap();
        g.scan(&[0x00, 0x05]).unwrap();
        assert_eq!(g.data_ahead(), 5);
        g.scan(&[1, 2]).unwrap();
        assert_eq!(g.data_ahead(), 3);
        // A type of several bytes, cut: None until it is whole.
        let mut g = FrameGuard::new(StreamKind::Unidirectional, 100);
        let t = varint(0x1002);
        assert_eq!(g.take_stream_type(&t[..1]), None);
        assert_eq!(g.take_stream_type(&[t[1], 9, 9]), Some(1));
        assert_eq!(g.stream_type(), Some(0x1002));
        // HEADERS payload is not DATA ahead.
        let mut g = FrameGuard::new(StreamKind::Request, 100);
        g.scan(&[0x01, 10]).unwrap();
        assert_eq!(g.data_ahead(), 0);
    }

    /// A seeded xorshift64 sequence for the randomized cases.
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The shell's use of [`FrameGuard::segment`]: DATA payload passed on, held bytes gathered
    /// until complete, empty DATA frames dropped. What h3 gets, chunk by chunk.
    fn handed(g: &mut FrameGuard, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let (mut out, mut held) = (Vec::new(), Vec::new());
        for c in chunks {
            let mut rest = *c;
            while !rest.is_empty() {
                match g.segment(rest).unwrap() {
                    Segment::Data(n) => {
                        out.push(rest[..n].to_vec());
                        rest = &rest[n..];
                    }
                    Segment::Held {
                        len,
                        complete,
                        empty_data,
                    } => {
                        held.extend_from_slice(&rest[..len]);
                        rest = &rest[len..];
                        if complete {
                            let h = std::mem::take(&mut held);
                            if !empty_data {
                                out.push(h);
                            }
                        }
                    }
                }
            }
        }
        assert!(held.is_empty(), "a frame left incomplete");
        out
    }

    #[test]
    fn held_bytes_reach_h3_one_frame_at_a_time_however_they_were_cut() {
        // HEADERS (30), DATA (10), an empty DATA, an unknown frame (5), DATA (3).
        let mut s = frame(0x01, 30);
        let data1 = frame(DATA, 10);
        s.extend(&data1);
        s.extend(frame(DATA, 0));
        s.extend(frame(0x21, 5));
        s.extend(frame(DATA, 3));
        let whole = handed(&mut FrameGuard::new(StreamKind::Request, 100), &[&s]);
        // Byte by byte: the same frames, HEADERS whole in one chunk, not 32.
        let bytes: Vec<&[u8]> = s.chunks(1).collect();
        let cut = handed(&mut FrameGuard::new(StreamKind::Request, 100), &bytes);
        let joined = |v: &[Vec<u8>]| v.concat();
        assert_eq!(joined(&whole), joined(&cut));
        assert_eq!(cut[0], frame(0x01, 30), "HEADERS in one chunk");
        assert_eq!(cut.iter().filter(|c| c.len() > 1).count(), 4, "{cut:?}");
        // The empty DATA frame is gone, nothing else.
        let mut want = frame(0x01, 30);
        want.extend(&data1);
        want.extend(frame(0x21, 5));
        want.extend(frame(DATA, 3));
        assert_eq!(joined(&cut), want);
        // Random cuts of random streams: always the input without its empty DATA frames.
        let mut next = xorshift(0x2545_f491_4f6c_dd1du64);
        for _ in 0..300 {
            let (mut s, mut want) = (Vec::new(), Vec::<u8>::new());
            for _ in 0..(next() % 6) {
                let ty = [DATA, DATA, 0x01, 0x21][(next() % 4) as usize];
                let len = next() % 40;
                let f = frame(ty, len);
                if !(ty == DATA && len == 0) {
                    want.extend(&f);
                }
                s.extend(f);
            }
            let mut chunks = Vec::new();
            let mut rest = &s[..];
            while !rest.is_empty() {
                let n = ((next() % 7) as usize + 1).min(rest.len());
                chunks.push(&rest[..n]);
                rest = &rest[n..];
            }
            let got = handed(&mut FrameGuard::new(StreamKind::Request, 64), &chunks);
            assert_eq!(got.concat(), want);
        }
    }

    #[test]
    fn random_streams_agree_however_they_are_cut() {
        // A seeded mix of frames, some over the limit: the verdict names the first of those.
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15u64);
        for _ in 0..300 {
            let mut s = Vec::new();
            let mut first_bad = None;
            for _ in 0..(next() % 6) {
                let ty = [0x00, 0x01, 0x04, 0x21, 0x1f * 7 + 0x21][(next() % 5) as usize];
                let len = next() % 120;
                if ty != DATA && len > 64 && first_bad.is_none() {
                    first_bad = Some(TooLong {
                        frame_type: ty,
                        length: len,
                        limit: 64,
                    });
                }
                s.extend(frame(ty, len));
            }
            let got = verdict(StreamKind::Request, 64, &s);
            assert_eq!(got, first_bad.map_or(Ok(()), Err));
        }
    }
}
