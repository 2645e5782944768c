//! What the diagnostics of one process share across its crates: the trace's time origin, and
//! the activities in progress (for `offload`'s progress line). The events themselves go
//! through `tracing` (targets `offload::<kind>`); the runtime's `diagnostics` module turns them
//! into the info and debug logs and the profile.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The time origin of this process's trace (the first time anything asked).
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Microseconds from [`epoch`] to `t` (0 for times before it).
pub fn micros(t: Instant) -> f64 {
    t.checked_duration_since(epoch())
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

static ACTIVITIES: Mutex<Vec<(u64, String, Instant)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Something long-running (a compile, a container's unpacking, a cache prune) that a progress
/// line may show; it ends when the guard is dropped.
#[derive(Debug)]
pub struct Activity(u64);

/// Starts an activity described by `what` ("compiling image 3f2a… for x86_64 znver3").
pub fn activity(what: String) -> Activity {
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    crate::sync::lock(&ACTIVITIES).push((id, what, Instant::now()));
    Activity(id)
}

impl Drop for Activity {
    fn drop(&mut self) {
        crate::sync::lock(&ACTIVITIES).retain(|(id, _, _)| *id != self.0);
    }
}

/// The oldest activity in progress: what it is and how long it has run.
pub fn current_activity() -> Option<(String, Duration)> {
    crate::sync::lock(&ACTIVITIES)
        .first()
        .map(|(_, what, since)| (what.clone(), since.elapsed()))
}
