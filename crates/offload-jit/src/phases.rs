//! The phases of the compile running on this thread, reported with its result (the JIT client
//! puts them on the worker's track of a profile, `OFFLOAD_PROFILE`).

use std::cell::RefCell;
use std::time::Instant;

/// A phase: name, start and duration in nanoseconds from the compile's start.
type Phase = (String, u64, u64);

/// The compile's start, the last mark, and the phases so far.
type Recording = Option<(Instant, Instant, Vec<Phase>)>;

thread_local! {
    static PHASES: RefCell<Recording> = const { RefCell::new(None) };
}

/// Starts recording a compile's phases on this thread.
pub fn begin() {
    let now = Instant::now();
    PHASES.with(|p| *p.borrow_mut() = Some((now, now, Vec::new())));
}

/// Ends the phase `name`: the time since the previous mark (or the start).
pub fn mark(name: &str) {
    PHASES.with(|p| {
        if let Some((start, last, list)) = p.borrow_mut().as_mut() {
            let now = Instant::now();
            list.push((
                name.to_string(),
                last.duration_since(*start).as_nanos() as u64,
                now.duration_since(*last).as_nanos() as u64,
            ));
            *last = now;
        }
    });
}

/// The phases recorded since [`begin`] (and stops recording).
pub fn take() -> Vec<Phase> {
    PHASES.with(|p| p.borrow_mut().take().map(|(_, _, l)| l).unwrap_or_default())
}
