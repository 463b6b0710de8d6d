//! The path probe's wire format (qgate_forward::probe) on arbitrary datagrams: decode never panics,
//! and whatever decodes encodes back to the same 9 bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qgate_forward::probe::ProbeMsg;

fuzz_target!(|data: &[u8]| {
    if let Ok(m) = ProbeMsg::decode(data) {
        assert_eq!(&m.encode()[..], data);
    }
});
