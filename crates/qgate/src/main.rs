//! The `qgate` binary: the command line of [`qgate::run`].

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: per-thread free lists without the arena lock contention that
/// showed up in the gateway profile (decision G7).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    qgate::run()
}
