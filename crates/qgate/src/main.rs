//! The `qgate` binary: the command line of [`qgate::run`].

use std::process::ExitCode;

/// mimalloc instead of glibc malloc: per-thread free lists without the arena lock contention that
/// showed up in the gateway profile; built not to ask the kernel for transparent huge pages, which
/// cost memory per idle connection (decision G7). The tally around it lets the lab charge a receiver's
/// allocations to an account (decision U14); unused, it costs a thread-local read per allocation
/// and an atomic load per free.
#[global_allocator]
static ALLOC: qgate_tally::Tally<mimalloc::MiMalloc> = qgate_tally::Tally(mimalloc::MiMalloc);

fn main() -> ExitCode {
    qgate::run()
}
