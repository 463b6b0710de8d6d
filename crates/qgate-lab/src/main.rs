//! The `qgate-lab` binary: the command line of [`qgate_lab::cli::run`].

use std::process::ExitCode;

/// The product's allocator (decision G7) inside the tally, so a lab run can charge a receiver's
/// allocations to an account (decision U14). The product binary has no tally.
#[global_allocator]
static ALLOC: qgate_tally::Tally<mimalloc::MiMalloc> = qgate_tally::Tally(mimalloc::MiMalloc);

fn main() -> ExitCode {
    qgate_lab::cli::run()
}
