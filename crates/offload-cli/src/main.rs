//! The `offload` command: `info`, `run`, `demo`.
//!
//! Exit status: 0 on success, 2 for a usage error (bad arguments, unreadable input files,
//! detected before any device is touched), 1 for a failure at run time (an image no plugin
//! can load, an unknown kernel, a failed launch, a demo result that does not verify).

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    cli::main()
}
