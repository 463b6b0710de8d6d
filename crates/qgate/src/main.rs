//! The `qgate` binary: the command line of [`qgate::run`].

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: per-thread free lists without the arena lock contention that
/// showed up in the gateway profile; built not to ask the kernel for transparent huge pages, which
/// cost memory per idle connection (decision G7).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    qgate::run()
}
