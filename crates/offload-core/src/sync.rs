//! Locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also when a thread panicked while holding it: the state offload keeps behind
/// its mutexes (caches, tables, counters) is updated in single steps, so a poisoned lock holds
/// consistent data, and the panic itself is reported where it happened (every ABI entry point
/// catches it).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
