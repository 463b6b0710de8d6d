//! A frame-level shim between a peer's byte stream and fe2o3-amqp's broker side.
//!
//! fe2o3-amqp's session keys links by name alone, so a peer that gives its sender and its
//! receiver on one session the same name — python-qpid-proton does by default — gets
//! `DuplicatedLinkName` and hangs, although AMQP 1.0 §2.6.1 only asks names to be unique per
//! direction (decision M3). The shim renames, on the way in, every attach whose sender is the
//! broker (the peer's role is receiver) by appending [`SUFFIX`], and strips the suffix from the
//! broker's answering attach on the way out, so the peer never sees it. Everything else passes
//! through byte for byte.
//!
//! It is also the first code that touches untrusted bytes, so it checks the framing (AMQP 1.0
//! §2.3.1): a size below 8 or above the broker's maximum frame size, a data offset below 2 or
//! past the frame, or bytes that are not an AMQP protocol header where one is due end the
//! connection with `amqp:connection:framing-error`.
//!
//! Two parts: `rewrite`, the sans-IO checks and renaming of one direction's bytes (what the fuzz
//! target drives), and `pump`, the two tasks that run both directions of a connection with
//! their deadlines. The pump's log events keep the target `qgate_amqp::shim` that log filters
//! and collectors name.

mod pump;
mod rewrite;

pub use pump::{shim, Deadline, Replayed, ShimConfig, Watch};
pub use rewrite::{
    error_close, framing_error_close, Direction, FrameError, Pipeline, Rewriter,
    DEFAULT_MAX_SESSIONS, MAX_HELD, MAX_PARTIAL, MIN_MAX_FRAME_SIZE, SUFFIX,
};
