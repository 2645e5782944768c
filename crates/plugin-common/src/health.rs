//! Whether a device can still be used, and the memory that failed operations may still touch.
//!
//! Every operation ends in one of three ways, as its backend reports it: it finished; it failed
//! and is *settled* (the device no longer touches its memory: the work completed, never
//! started, or was reported lost); or it failed *unsettled* ([`Error::Unsettled`]: a wait gave
//! up while the copy or kernel may still run). What an operation holds (its regions, its
//! program, a backend's staging buffers) is released on the first two. On the third it goes
//! to the device's quarantine, which never drops it: the memory is never freed and its
//! addresses are never handed out again, so no later allocation can be written by the work
//! that may still run. The device is then failed for good: every later operation is an error
//! that names the unsettled one, since nothing it runs could be trusted to be ordered after
//! that work, and it frees nothing more (its allocations are left as they are: a driver's free
//! may wait for the work that did not settle).

use crate::memory::{Hold, QueuedMark};
use offload_core::{Error, Result};
use std::any::Any;
use std::sync::{Mutex, OnceLock};

/// See the module docs.
#[derive(Default)]
pub struct Health {
    failed: OnceLock<Error>,
    quarantine: Mutex<Vec<Box<dyn Any + Send>>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("failed", &self.failed.get())
            .field(
                "quarantined",
                &offload_core::sync::lock(&self.quarantine).len(),
            )
            .finish()
    }
}

impl Health {
    /// An error if an unsettled failure has failed the device (`device` names it).
    pub fn check(&self, device: &str) -> Result<()> {
        match self.failed.get() {
            None => Ok(()),
            Some(e) => Err(Error::DeviceFailure(format!(
                "{device} is failed for good by an operation that did not settle ({}); the \
                 memory it used is quarantined, never freed or reused, and the device runs \
                 nothing more in this process",
                e.message()
            ))),
        }
    }

    /// Whether the device is failed for good.
    pub fn is_failed(&self) -> bool {
        self.failed.get().is_some()
    }

    /// Ends an operation: `held` is released unless `result` is unsettled, when it is
    /// quarantined and the device failed.
    pub fn end<T, H: Any + Send>(&self, result: Result<T>, held: H) -> Result<T> {
        match &result {
            // Boxed only here: the common path costs no allocation.
            Err(e) if e.is_unsettled() => self.quarantine(vec![Box::new(held)], e),
            _ => drop(held),
        }
        result
    }

    /// Keeps `items` for good and fails the device with `why`. The layer's own holds are taken
    /// apart first: their regions and programs stay, their marks of queued use go (so that a
    /// synchronous operation waiting for that work stops waiting, and finds the device failed).
    pub fn quarantine(&self, items: Vec<Box<dyn Any + Send>>, why: &Error) {
        let _ = self.failed.set(why.clone());
        let mut kept = offload_core::sync::lock(&self.quarantine);
        for item in items {
            match item.downcast::<(Hold, QueuedMark)>() {
                Ok(pair) => {
                    let (hold, mark) = *pair;
                    kept.push(Box::new(hold));
                    drop(mark);
                }
                Err(item) => kept.push(item),
            }
        }
    }
}

impl Drop for Health {
    fn drop(&mut self) {
        // The device is going, but the work may still run: what it uses is never released.
        let kept = std::mem::take(self.quarantine.get_mut().unwrap_or_else(|p| p.into_inner()));
        std::mem::forget(kept);
    }
}

/// What an operation holds while a hook runs: released or quarantined by
/// [`PanicQuarantine::end`] as [`Health::end`] says. If the hook panics instead (the unwinding
/// drops it), it is quarantined on a device whose work outlives the call (a GPU's: the work the
/// hook had started may still run), and released on one whose work does not (the host's).
pub struct PanicQuarantine<'h, H: Any + Send> {
    health: &'h Health,
    held: Option<H>,
    quarantine_on_panic: bool,
}

impl<H: Any + Send> std::fmt::Debug for PanicQuarantine<'_, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PanicQuarantine")
            .field("held", &self.held.is_some())
            .field("quarantine_on_panic", &self.quarantine_on_panic)
            .finish()
    }
}

impl<'h, H: Any + Send> PanicQuarantine<'h, H> {
    /// Holds `held` for an operation of the device `health` watches.
    pub fn new(health: &'h Health, held: H, quarantine_on_panic: bool) -> Self {
        PanicQuarantine {
            health,
            held: Some(held),
            quarantine_on_panic,
        }
    }

    /// What it holds.
    pub fn held(&self) -> &H {
        self.held.as_ref().expect("held until the operation ends")
    }

    /// The operation returned `result`: see [`Health::end`].
    pub fn end<T>(mut self, result: Result<T>) -> Result<T> {
        match self.held.take() {
            Some(held) => self.health.end(result, held),
            None => result,
        }
    }
}

impl<H: Any + Send> Drop for PanicQuarantine<'_, H> {
    fn drop(&mut self) {
        // Only reached without `end`: a hook panicked.
        if let Some(held) = self.held.take()
            && self.quarantine_on_panic
        {
            let why = Error::PluginPanic(
                "a backend hook panicked during an operation on a device whose work outlives \
                 the call"
                    .into(),
            )
            .unsettled();
            self.health.quarantine(vec![Box::new(held)], &why);
        }
    }
}
