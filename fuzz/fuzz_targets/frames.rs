//! The broker's frame shim on arbitrary bytes, in both directions and with the 0-RTT
//! pipeline shared between them: it must never panic, never emit a partial item, and never hold
//! more than its bound.
#![no_main]

use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use qgate_amqp::shim::{Direction, Pipeline, Rewriter, MAX_HELD};

fuzz_target!(|data: &[u8]| {
    // libfuzzer-sys aborts on any panic, even one the shim catches from serde_amqp on purpose;
    // the default hook keeps uncaught panics fatal (the harness still sees them).
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| drop(std::panic::take_hook()));
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let cut = (split as usize).min(rest.len());
    let pipeline = Arc::new(Mutex::new(Pipeline::default()));
    let mut inbound = Rewriter::new(Direction::Inbound, 4096).with_pipeline(pipeline.clone());
    let mut outbound = Rewriter::new(Direction::Outbound, u32::MAX).with_pipeline(pipeline);
    // Prefixes that get past the header checks, so the frame parser sees the rest.
    for prefix in [&b""[..], b"AMQP\x00\x01\x00\x00", b"AMQP\x03\x01\x00\x00"] {
        for rw in [&mut inbound, &mut outbound] {
            let mut input = BytesMut::from(prefix);
            input.extend_from_slice(&rest[..cut]);
            let mut out = BytesMut::new();
            if rw.process(&mut input, &mut out).is_err() {
                continue;
            }
            input.extend_from_slice(&rest[cut..]);
            let _ = rw.process(&mut input, &mut out);
            // Released frames are processed at once, as the broker's driver does.
            if rw.release_held(&mut input) {
                let _ = rw.process(&mut input, &mut out);
            }
            assert!(out.len() <= 2 * (prefix.len() + rest.len()) + 65_536);
            assert!(input.len() <= prefix.len() + rest.len() + MAX_HELD);
        }
    }
});
