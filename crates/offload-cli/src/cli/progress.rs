//! A one-line progress indicator on stderr for long work (a compile, a container's unpacking,
//! a disk-cache prune) that has run for more than a second (`OFFLOAD_PROGRESS_AFTER_MS`, 0 to
//! 3600000): what is being done and for how long, redrawn every 100 ms and erased when the work
//! ends. Only when stderr is a terminal and the command is not printing JSON.

use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Shown after this long by default.
const AFTER_MS: u32 = 1000;

/// Draws while alive.
#[derive(Debug)]
pub struct Progress {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts the indicator unless `json` or stderr is not a terminal.
pub fn start(json: bool) -> Option<Progress> {
    if json || !std::io::stderr().is_terminal() {
        return None;
    }
    let after = match offload_core::env::u32_in_range(
        &["OFFLOAD_PROGRESS_AFTER_MS"],
        0,
        3_600_000,
        AFTER_MS,
    ) {
        Ok(ms) => Duration::from_millis(ms.into()),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "offload: warning: {e}; using {AFTER_MS}");
            Duration::from_millis(AFTER_MS.into())
        }
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("offload-progress".into())
        .spawn(move || {
            let frames = ['|', '/', '-', '\\'];
            let mut drawn = false;
            let mut n = 0usize;
            while !flag.load(Ordering::Relaxed) {
                // Every 100 ms once drawn; before, no later than the delay (10 ms at least).
                let tick = if drawn {
                    Duration::from_millis(100)
                } else {
                    after.clamp(Duration::from_millis(10), Duration::from_millis(100))
                };
                std::thread::sleep(tick);
                match offload_core::diag::current_activity() {
                    Some((what, elapsed)) if elapsed >= after => {
                        let line = format!(
                            "\r\x1b[K{} {} ({:.1} s)",
                            frames[n % frames.len()],
                            offload_core::text::printable(&what),
                            elapsed.as_secs_f64()
                        );
                        n += 1;
                        let _ = std::io::stderr().write_all(line.as_bytes());
                        drawn = true;
                    }
                    _ if drawn => {
                        let _ = std::io::stderr().write_all(b"\r\x1b[K");
                        drawn = false;
                    }
                    _ => {}
                }
            }
            if drawn {
                let _ = std::io::stderr().write_all(b"\r\x1b[K");
            }
        })
        .ok()?;
    Some(Progress {
        stop,
        thread: Some(thread),
    })
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
