//! Command-line front end of the runtime.

mod args;
mod cache;
mod demo;
mod info;
mod jit;
mod out;
mod progress;
mod run;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// How a command failed, which decides the exit status.
#[derive(Debug)]
pub enum Failure {
    /// Bad arguments or input files (exit 2).
    Usage(String),
    /// Failure at run time (exit 1).
    Runtime(String),
    /// Standard output could not be written (exit 1; quietly for a closed pipe).
    Output(std::io::Error),
}

impl From<offload::Error> for Failure {
    fn from(e: offload::Error) -> Self {
        Failure::Runtime(e.to_string())
    }
}

impl Failure {
    /// For errors reading the command's input files: a file that cannot be read is a usage
    /// error (exit 2), one too large for memory a run-time failure (exit 1).
    pub fn input(e: offload::Error) -> Failure {
        match e {
            offload::Error::InvalidArgument(m) => Failure::Usage(m),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "offload",
    version,
    about = "Load device code and run it on whatever device this machine has",
    after_help = "Environment: OFFLOAD_PLUGIN_PATH, OFFLOAD_PLUGINS, OFFLOAD_HOST_DEVICES, OFFLOAD_HOST_THREADS, OFFLOAD_HOST_WAIT, OFFLOAD_HOST_SPIN_US, OFFLOAD_JIT_*, OFFLOAD_CACHE* (see docs/configuration.md)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List plugins and devices.
    Info {
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Load an image, launch one kernel with the given arguments, and show the results.
    Run(run::RunArgs),
    /// Compile an LLVM bitcode/IR image for a target without running it (like llc), writing
    /// exactly what the plugin would load.
    Jit(jit::JitArgs),
    /// The JIT's disk cache: stats, list, clear, prune.
    #[command(subcommand)]
    Cache(cache::CacheCommand),
    /// Run a built-in saxpy kernel on the host backend and verify the result.
    Demo {
        /// Number of elements.
        #[arg(long, default_value_t = 1_000_003)]
        n: u32,
    },
}

/// SIGINT and SIGTERM end the command at once with one line and status 128 + the signal.
/// Nothing is left behind: images live in memory files that go with the process, and the JIT
/// worker and trial-load processes are bound to it (they get SIGKILL when it ends).
fn on_termination_signals() {
    extern "C" fn handler(sig: libc::c_int) {
        let msg: &[u8] = if sig == libc::SIGINT {
            b"offload: interrupted (SIGINT)\n"
        } else {
            b"offload: terminated (SIGTERM)\n"
        };
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::_exit(128 + sig);
        }
    }
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs an async-signal-safe handler.
        unsafe { libc::signal(sig, handler as *const () as libc::sighandler_t) };
    }
}

pub fn main() -> ExitCode {
    on_termination_signals();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            match e.kind() {
                // `--help`, `help`, `--version`: to standard output, exit 0.
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    let _ = e.print();
                    return ExitCode::SUCCESS;
                }
                // A bare `offload` is a usage error like any other: one line.
                ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    out::error_line(
                        "offload: error: a command is needed: info, run, jit, cache or demo (see 'offload --help')",
                    );
                    return ExitCode::from(2);
                }
                _ => {}
            }
            // clap explains over several lines; keep the explanation (up to the usage block)
            // on one line.
            let text = e.render().to_string();
            let message: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty() && !l.starts_with("Usage:"))
                .map(str::trim)
                .collect();
            let message = message.join(" ");
            let message = message.strip_prefix("error: ").unwrap_or(&message);
            out::error_line(&format!("offload: error: {message} (see 'offload --help')"));
            return ExitCode::from(2);
        }
    };
    let outcome = match cli.command {
        Command::Info { json } => info::info(json),
        Command::Run(args) => run::run(args),
        Command::Jit(args) => jit::jit(args),
        Command::Cache(c) => cache::cache(c),
        Command::Demo { n } => demo::demo(n),
    }
    .and_then(|()| out::flush());
    // Errors are one line, whatever the text a tool (LLVM, lld) or a plugin put in them, with
    // any other control characters escaped.
    let one_line = |m: &str| {
        let joined = m
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" | ");
        offload_core::text::printable(&joined).into_owned()
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(m)) => {
            out::error_line(&format!("offload: error: {}", one_line(&m)));
            ExitCode::from(2)
        }
        Err(Failure::Runtime(m)) => {
            out::error_line(&format!("offload: error: {}", one_line(&m)));
            ExitCode::from(1)
        }
        // A reader that went away (`offload info | head -1`) is no error to report.
        Err(Failure::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::from(1),
        Err(Failure::Output(e)) => {
            out::error_line(&format!(
                "offload: error: cannot write to standard output: {e}"
            ));
            ExitCode::from(1)
        }
    }
}

/// Milliseconds since `t`, for timing output.
pub fn ms_since(t: std::time::Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

pub use offload_core::text::human_bytes;
