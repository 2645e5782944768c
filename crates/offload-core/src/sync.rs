//! Locking that survives a panic elsewhere.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Locks `m`, also when a thread panicked while holding it: the state offload keeps behind
/// its mutexes (caches, tables, counters) is updated in single steps, so a poisoned lock holds
/// consistent data, and the panic itself is reported where it happened (every ABI entry point
/// catches it).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Waits on `cv` with `guard`, as [`lock`] locks: a poisoned mutex is taken as it is.
pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    cv.wait(guard).unwrap_or_else(|p| p.into_inner())
}

/// [`wait`] for at most `timeout`; also says whether it timed out.
pub fn wait_timeout<'a, T>(
    cv: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: Duration,
) -> (MutexGuard<'a, T>, bool) {
    let (g, t) = cv
        .wait_timeout(guard, timeout)
        .unwrap_or_else(|p| p.into_inner());
    (g, t.timed_out())
}
