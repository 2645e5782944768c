//! Device memory as the layer tracks it: which ranges are live, and what keeps them alive.
//!
//! Every allocation (and every program global a caller has looked up) is a [`Region`] held by
//! an `Arc`. The device's table holds one reference; every copy or launch that touches a region
//! holds another (its [`Hold`]) from the moment it is accepted until it has run. `free` only
//! removes the table's reference, so memory is returned to the backend when the last piece of
//! work using it has finished, never under it: a buffer freed (or dropped) while a queued
//! launch still reads it stays alive until that launch is done, and its address cannot be
//! handed out again before then.
//!
//! Each region also has a lock that the layer takes while an operation runs, in address order,
//! on backends whose operations touch the memory from host threads (the host:
//! `DeviceBackend::locks_regions`): two operations on the same memory never run at the same
//! time, so safe calls on any number of threads never race on it. GPUs order their work with
//! their streams instead; holding a lock across GPU work would serialise kernels that only
//! read a buffer.
//!
//! And each counts the queued operations that use it and have not finished: a synchronous
//! operation on a region first waits for those ([`Hold::wait_queued`]), so a read right after
//! a queued launch that writes the buffer sees what the launch wrote, never the memory before
//! it. Work queued on several queues keeps its own order per queue; across queues, only events
//! order it.

use offload_core::{DevicePtr, Error, MemoryKind, Result};
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Returns a region's memory to the backend when the last reference to it is gone.
pub type Release = Box<dyn FnOnce(DevicePtr, u64) + Send + Sync>;

/// A live range of device memory.
pub struct Region {
    /// Start.
    pub ptr: DevicePtr,
    /// Size in bytes.
    pub size: u64,
    /// What it is.
    pub kind: RegionKind,
    release: Mutex<Option<Release>>,
    access: Mutex<()>,
    /// Queued operations using the region that have not finished.
    queued: Mutex<u64>,
    idle: Condvar,
}

/// What a region is.
#[derive(Clone)]
pub enum RegionKind {
    /// An allocation of this kind of memory.
    Allocation(MemoryKind),
    /// A global variable of a loaded program (the `Arc` keeps the program loaded).
    Global(Arc<dyn Any + Send + Sync>),
}

impl std::fmt::Debug for RegionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegionKind::Allocation(k) => write!(f, "Allocation({k:?})"),
            RegionKind::Global(_) => f.write_str("Global"),
        }
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            RegionKind::Allocation(k) => format!("{k:?} allocation"),
            RegionKind::Global(_) => "program global".into(),
        };
        write!(f, "Region({}, {} bytes, {kind})", self.ptr, self.size)
    }
}

impl Region {
    /// A region that `release` returns to the backend when it dies.
    pub fn new(ptr: DevicePtr, size: u64, kind: RegionKind, release: Option<Release>) -> Self {
        Region {
            ptr,
            size,
            kind,
            release: Mutex::new(release),
            access: Mutex::new(()),
            queued: Mutex::new(0),
            idle: Condvar::new(),
        }
    }

    fn end(&self) -> u64 {
        self.ptr.0.saturating_add(self.size)
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let release = self
            .release
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(release) = release {
            release(self.ptr, self.size);
        }
    }
}

/// What keeps the memory and the program an operation uses alive until it has run.
#[derive(Default)]
pub struct Hold {
    regions: Vec<Arc<Region>>,
    keep: Vec<Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold")
            .field("regions", &self.regions)
            .field("keep", &self.keep.len())
            .finish()
    }
}

impl Hold {
    /// Also keeps `object` alive (a program, a kernel).
    pub fn keep(&mut self, object: Arc<dyn Any + Send + Sync>) {
        self.keep.push(object);
    }

    /// Pins `region`.
    pub fn pin(&mut self, region: Arc<Region>) {
        if !self.regions.iter().any(|r| Arc::ptr_eq(r, &region)) {
            self.regions.push(region);
        }
    }

    /// Counts the pinned regions as used by queued work until the mark is dropped (when the
    /// work has run, or is dropped unrun).
    pub fn mark_queued(&self) -> QueuedMark {
        for r in &self.regions {
            *offload_core::sync::lock(&r.queued) += 1;
        }
        QueuedMark(self.regions.clone())
    }

    /// Waits until no queued work uses a pinned region (for a synchronous operation).
    pub fn wait_queued(&self) {
        for r in &self.regions {
            let mut n = offload_core::sync::lock(&r.queued);
            while *n > 0 {
                n = offload_core::sync::wait(&r.idle, n);
            }
        }
    }

    /// Exclusive access to every pinned region for as long as the guards live, taken in address
    /// order so that two operations never wait for each other.
    pub fn lock(&self) -> Vec<MutexGuard<'_, ()>> {
        let mut regions: Vec<&Arc<Region>> = self.regions.iter().collect();
        regions.sort_by_key(|r| r.ptr);
        regions
            .into_iter()
            .map(|r| offload_core::sync::lock(&r.access))
            .collect()
    }
}

/// Queued work's use of regions ([`Hold::mark_queued`]); dropping it ends the use.
#[derive(Debug)]
pub struct QueuedMark(Vec<Arc<Region>>);

impl Drop for QueuedMark {
    fn drop(&mut self) {
        for r in &self.0 {
            let mut n = offload_core::sync::lock(&r.queued);
            *n = n.saturating_sub(1);
            if *n == 0 {
                r.idle.notify_all();
            }
        }
    }
}

/// The live regions of one device.
#[derive(Debug, Default)]
pub struct Regions {
    map: Mutex<BTreeMap<u64, Arc<Region>>>,
}

impl Regions {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Region>>> {
        offload_core::sync::lock(&self.map)
    }

    /// Adds a region (an allocation, or a global looked up by a caller).
    pub fn insert(&self, region: Region) -> Arc<Region> {
        let region = Arc::new(region);
        self.lock().insert(region.ptr.0, region.clone());
        region
    }

    /// The region of a program's global at `ptr` (its `owner` the program): the one already
    /// there if the global was looked up before, so every lookup shares one region, and a
    /// synchronous operation through a later lookup waits for queued work through an earlier
    /// one.
    pub fn insert_global(
        &self,
        ptr: DevicePtr,
        size: u64,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Arc<Region> {
        let mut map = self.lock();
        if let Some(r) = map.get(&ptr.0)
            && r.size == size
            && matches!(&r.kind, RegionKind::Global(o) if Arc::ptr_eq(o, &owner))
        {
            return r.clone();
        }
        let region = Arc::new(Region::new(ptr, size, RegionKind::Global(owner), None));
        map.insert(ptr.0, region.clone());
        region
    }

    /// Removes the allocation that starts at `ptr` (a free); its memory is released when the
    /// last operation holding it has run.
    pub fn free(&self, ptr: DevicePtr, device: &str) -> Result<()> {
        let mut map = self.lock();
        match map.get(&ptr.0).map(|r| &r.kind) {
            Some(RegionKind::Allocation(_)) => {
                let removed = map.remove(&ptr.0);
                // The last reference may release the memory (cuMemFree can wait for work in
                // flight): never under the table's lock, which every submission takes.
                drop(map);
                drop(removed);
                Ok(())
            }
            Some(RegionKind::Global(_)) => Err(Error::InvalidArgument(format!(
                "free of {ptr} on {device}: that is a program global, not an allocation"
            ))),
            None => Err(Error::InvalidArgument(format!(
                "free of {ptr} on {device}: not the start of a live allocation (double free, or \
                 a pointer from another device?)"
            ))),
        }
    }

    /// The region that holds `[ptr, ptr + len)` (`len` 0: the byte at `ptr`).
    pub fn find(&self, ptr: DevicePtr, len: u64, what: &str, device: &str) -> Result<Arc<Region>> {
        let map = self.lock();
        let end = ptr.0.checked_add(len.max(1));
        if let (Some((_, region)), Some(end)) = (map.range(..=ptr.0).next_back(), end)
            && end <= region.end()
        {
            return Ok(region.clone());
        }
        Err(Error::InvalidArgument(format!(
            "{what}: device range {ptr}..+{len} is not inside any live allocation of {device}"
        )))
    }

    /// Removes the globals registered for a program (matched by `is_program`).
    pub fn remove_globals(&self, is_program: impl Fn(&Arc<dyn Any + Send + Sync>) -> bool) {
        let mut removed = Vec::new();
        self.lock().retain(|_, r| match &r.kind {
            RegionKind::Global(p) if is_program(p) => {
                removed.push(r.clone());
                false
            }
            _ => true,
        });
        // Dropped after the table's lock, as in `free`.
        drop(removed);
    }

    /// Drops every region (device shutdown).
    pub fn clear(&self) {
        let all = std::mem::take(&mut *self.lock());
        drop(all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_lookup_of_a_global_shares_its_region() {
        let regions = Regions::default();
        let program: Arc<dyn std::any::Any + Send + Sync> = Arc::new(1u8);
        let a = regions.insert_global(DevicePtr(0x1000), 64, program.clone());
        let b = regions.insert_global(DevicePtr(0x1000), 64, program.clone());
        assert!(
            Arc::ptr_eq(&a, &b),
            "a second lookup must not replace the region"
        );
        // Another program at the same address (the first one unloaded) gets its own.
        let other: Arc<dyn std::any::Any + Send + Sync> = Arc::new(2u8);
        let c = regions.insert_global(DevicePtr(0x1000), 64, other);
        assert!(!Arc::ptr_eq(&a, &c));
    }
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn memory_is_released_outside_the_table_lock() {
        // A release that needs the table from another thread (as a submission on another
        // thread does while cuMemFree waits): it must not find the table locked.
        let regions = Arc::new(Regions::default());
        let found = Arc::new(AtomicU64::new(0));
        for (i, global) in [(0u64, false), (1, true)] {
            let (r, f) = (regions.clone(), found.clone());
            let release: Release = Box::new(move |_, _| {
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let _ = r.find(DevicePtr(1 << 20), 1, "t", "d");
                    let _ = tx.send(());
                });
                if rx.recv_timeout(std::time::Duration::from_secs(20)).is_ok() {
                    f.fetch_add(1, Ordering::SeqCst);
                }
            });
            let ptr = DevicePtr(4096 * (i + 1));
            let program: Arc<dyn Any + Send + Sync> = Arc::new(i);
            let kind = if global {
                RegionKind::Global(program.clone())
            } else {
                RegionKind::Allocation(MemoryKind::Device)
            };
            regions.insert(Region::new(ptr, 64, kind, Some(release)));
            if global {
                regions.remove_globals(|p| Arc::ptr_eq(p, &program));
            } else {
                regions.free(ptr, "d").unwrap();
            }
            assert_eq!(
                found.load(Ordering::SeqCst),
                i + 1,
                "{}",
                if global { "remove_globals" } else { "free" }
            );
        }
    }

    #[test]
    fn frees_wait_for_the_last_holder() {
        let released = Arc::new(AtomicU64::new(0));
        let regions = Regions::default();
        let r = released.clone();
        regions.insert(Region::new(
            DevicePtr(4096),
            100,
            RegionKind::Allocation(MemoryKind::Device),
            Some(Box::new(move |p, _| r.store(p.0, Ordering::SeqCst))),
        ));
        let pinned = regions.find(DevicePtr(4100), 10, "t", "d").unwrap();
        let mut hold = Hold::default();
        hold.pin(pinned);
        regions.free(DevicePtr(4096), "d").unwrap();
        assert_eq!(released.load(Ordering::SeqCst), 0, "still held");
        assert!(
            regions.find(DevicePtr(4100), 1, "t", "d").is_err(),
            "gone from the table"
        );
        assert!(
            regions
                .free(DevicePtr(4096), "d")
                .unwrap_err()
                .to_string()
                .contains("double free")
        );
        drop(hold);
        assert_eq!(
            released.load(Ordering::SeqCst),
            4096,
            "released by the last holder"
        );
        assert!(regions.find(DevicePtr(0), 1, "t", "d").is_err());
        assert!(regions.find(DevicePtr(u64::MAX), 5, "t", "d").is_err());
    }
}
