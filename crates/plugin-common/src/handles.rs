//! Handles bound to their owner.
//!
//! A handle is `(device + 1) << 48 | kind << 40 | serial`: the device that issued it, what it
//! names (program, kernel, queue, event) and a serial number that is never reused on that
//! device. So a kernel handle used as a program, a program of device 0 used on device 1, and any
//! handle after its unload or destroy are each a clear error, never another object.

use offload_core::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a handle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A loaded image.
    Program = 1,
    /// A kernel of a loaded image.
    Kernel = 2,
    /// An in-order queue.
    Queue = 3,
    /// An event.
    Event = 4,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Program => "program",
            Kind::Kernel => "kernel",
            Kind::Queue => "queue",
            Kind::Event => "event",
        }
    }

    fn from_bits(v: u64) -> Option<Kind> {
        Some(match v {
            1 => Kind::Program,
            2 => Kind::Kernel,
            3 => Kind::Queue,
            4 => Kind::Event,
            _ => return None,
        })
    }

    /// What happened to an object of this kind that is gone.
    fn gone(self) -> &'static str {
        match self {
            Kind::Program => "its program was unloaded",
            Kind::Kernel => "its program was unloaded",
            Kind::Queue => "the queue was destroyed",
            Kind::Event => "the event was destroyed",
        }
    }
}

const SERIAL_BITS: u32 = 40;
const SERIAL_MASK: u64 = (1 << SERIAL_BITS) - 1;

/// The objects of one kind on one device, by handle.
#[derive(Debug)]
pub struct Table<T> {
    device: usize,
    plugin: &'static str,
    kind: Kind,
    next: AtomicU64,
    map: Mutex<HashMap<u64, T>>,
}

impl<T: Clone> Table<T> {
    /// An empty table for `kind` objects of device `device` of `plugin`.
    pub fn new(plugin: &'static str, device: usize, kind: Kind) -> Self {
        Table {
            device,
            plugin,
            kind,
            next: AtomicU64::new(1),
            map: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, T>> {
        offload_core::sync::lock(&self.map)
    }

    /// Stores `value` under a new handle.
    pub fn insert(&self, value: T) -> Result<u64> {
        let serial = self.next.fetch_add(1, Ordering::Relaxed);
        if serial > SERIAL_MASK {
            return Err(Error::OutOfMemory(format!(
                "{}:{} has issued every {} handle it can",
                self.plugin,
                self.device,
                self.kind.name()
            )));
        }
        let handle =
            ((self.device as u64 + 1) << 48) | ((self.kind as u64) << SERIAL_BITS) | serial;
        self.lock().insert(handle, value);
        Ok(handle)
    }

    /// Explains why `handle` names nothing here.
    fn explain(&self, handle: u64) -> Error {
        let what = self.kind.name();
        if handle == 0 {
            return Error::InvalidArgument(format!("{what} handle 0 is the null handle"));
        }
        let device = (handle >> 48).checked_sub(1);
        let kind = Kind::from_bits((handle >> SERIAL_BITS) & 0xff);
        let serial = handle & SERIAL_MASK;
        let (plugin, me) = (self.plugin, self.device);
        match (device, kind) {
            (Some(d), Some(k)) if k != self.kind => Error::InvalidArgument(format!(
                "handle {handle:#x} is a {} handle (of {plugin}:{d}), not a {what} handle",
                k.name()
            )),
            (Some(d), Some(_)) if d as usize != me => Error::InvalidArgument(format!(
                "{what} handle {handle:#x} belongs to device {plugin}:{d}, not {plugin}:{me}"
            )),
            (Some(_), Some(_)) if serial != 0 && serial < self.next.load(Ordering::Relaxed) => {
                Error::NotFound(format!(
                    "{what} handle {handle:#x} on {plugin}:{me} is no longer valid: {}",
                    self.kind.gone()
                ))
            }
            _ => Error::NotFound(format!(
                "{what} handle {handle:#x} was never issued by {plugin}:{me}"
            )),
        }
    }

    /// The object `handle` names, or an error saying why there is none.
    pub fn get(&self, handle: u64) -> Result<T> {
        let found = self.lock().get(&handle).cloned();
        found.ok_or_else(|| self.explain(handle))
    }

    /// Removes and returns the object `handle` names.
    pub fn remove(&self, handle: u64) -> Result<T> {
        let found = self.lock().remove(&handle);
        found.ok_or_else(|| self.explain(handle))
    }

    /// Removes every object for which `f` is true.
    pub fn remove_where(&self, f: impl Fn(&T) -> bool) -> Vec<T> {
        let mut map = self.lock();
        let doomed: Vec<u64> = map.iter().filter(|(_, v)| f(v)).map(|(k, _)| *k).collect();
        doomed.into_iter().filter_map(|k| map.remove(&k)).collect()
    }

    /// Every object (for shutdown).
    pub fn drain(&self) -> Vec<T> {
        self.lock().drain().map(|(_, v)| v).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misuse_is_explained() {
        let programs: Table<u32> = Table::new("t", 0, Kind::Program);
        let kernels: Table<u32> = Table::new("t", 0, Kind::Kernel);
        let other: Table<u32> = Table::new("t", 1, Kind::Program);
        let p = programs.insert(7).unwrap();
        let k = kernels.insert(8).unwrap();
        assert_eq!(programs.get(p).unwrap(), 7);
        let e = programs.get(k).unwrap_err().to_string();
        assert!(
            e.contains("is a kernel handle") && e.contains("not a program handle"),
            "{e}"
        );
        let e = other.get(p).unwrap_err().to_string();
        assert!(e.contains("belongs to device t:0, not t:1"), "{e}");
        programs.remove(p).unwrap();
        let e = programs.get(p).unwrap_err().to_string();
        assert!(
            e.contains("no longer valid: its program was unloaded"),
            "{e}"
        );
        let e = programs.get(p + 5).unwrap_err().to_string();
        assert!(e.contains("never issued"), "{e}");
        assert!(
            programs
                .get(0)
                .unwrap_err()
                .to_string()
                .contains("null handle")
        );
        assert!(
            programs
                .get(12345)
                .unwrap_err()
                .to_string()
                .contains("never issued")
        );
        let again = programs.insert(9).unwrap();
        assert_ne!(again, p, "handles are never reused");
    }
}
