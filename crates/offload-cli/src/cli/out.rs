//! Standard output of the commands: a write that fails (a full disk, a closed pipe) is an error
//! of the command, never a panic; errors go to standard error, where a failure is ignored.

use super::Failure;
use std::io::Write;

/// Writes one line to standard output.
pub fn line(args: std::fmt::Arguments<'_>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(Failure::Output)
}

/// Flushes standard output (at the end of a command).
pub fn flush() -> Result<(), Failure> {
    std::io::stdout().flush().map_err(Failure::Output)
}

/// Writes one line to standard error; there is nowhere left to report a failure to.
pub fn error_line(text: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// `println!` for the commands: `outln!("...", args)?`-free, returns early with
/// [`Failure::Output`] when standard output cannot be written.
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::cli::out::line(format_args!($($t)*))?
    };
}
pub(crate) use outln;
