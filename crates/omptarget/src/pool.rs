//! Reuse of the device memory that mappings free, as upstream's plugins keep freed blocks
//! (`MemoryManagerTy`): a target region that maps the same arrays as the one before it gets
//! the same blocks back instead of a fresh allocation (which the host device zeroes and the
//! kernel then faults in page by page), and each free is a push onto a list.
//!
//! Sizes are rounded up to a class (a power of two from 256 bytes to 1 MiB, then whole MiB);
//! a freed block waits on its class's list, newest first, for the next request of the class.
//! At most a cap of bytes wait (1 GiB, or an eighth of the machine's memory if that is less); a free beyond it goes back to the device, and so does
//! every waiting block when an allocation fails (then the allocation is tried once more) and
//! when the pool is dropped. Blocks come back as they were left: device memory has no
//! defined contents in OpenMP.
//!
//! `LIBOMPTARGET_MEMORY_MANAGER_THRESHOLD` (upstream's variable): only requests of at most
//! that many bytes are pooled; 0 turns the pool off. Unset: every size, up to the cap.

use crate::messages;
use offload_core::sync::lock;
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Smallest class (also the host device's alignment).
const MIN_CLASS: u64 = 256;
/// Classes are powers of two up to here, then multiples of it.
const POW2_LIMIT: u64 = 1 << 20;
/// Most bytes waiting in one device's pool by default (less on a machine with less than
/// 8 GiB: an eighth of its memory).
const DEFAULT_CAP: u64 = 1 << 30;

/// The class a request of `size` bytes is served from.
pub fn class_of(size: u64) -> u64 {
    let size = size.max(MIN_CLASS);
    if size <= POW2_LIMIT {
        size.next_power_of_two()
    } else {
        size.div_ceil(POW2_LIMIT).saturating_mul(POW2_LIMIT)
    }
}

/// What the pool needs of a device.
pub trait Backing {
    /// `size` bytes, or why not.
    fn alloc_raw(&self, size: u64) -> Result<u64, String>;
    /// Gives back a block [`Backing::alloc_raw`] returned.
    fn free_raw(&self, ptr: u64);
}

#[derive(Debug, Default)]
struct State {
    /// Waiting blocks by class, newest last.
    free: BTreeMap<u64, Vec<u64>>,
    /// Bytes waiting.
    waiting: u64,
    /// Class of every block handed out and not yet freed.
    live: HashMap<u64, u64>,
}

/// One device's pool.
#[derive(Debug)]
pub struct Pool {
    state: Mutex<State>,
    /// Largest request pooled (`None`: any).
    threshold: Option<u64>,
    /// Most bytes waiting.
    cap: u64,
}

impl Pool {
    /// A pool with upstream's threshold variable applied (a bad value is reported and the
    /// default kept).
    pub fn from_env() -> Pool {
        let threshold = offload_core::env::size_in_range(
            &["LIBOMPTARGET_MEMORY_MANAGER_THRESHOLD"],
            0,
            u64::MAX,
        )
        .unwrap_or_else(|e| {
            messages::error(&format!("{e}; pooling every size"));
            None
        });
        let cap = DEFAULT_CAP.min(offload_core::fs::physical_memory() / 8);
        Pool::new(threshold, cap)
    }

    /// A pool for requests of at most `threshold` bytes (`None`: any, `Some(0)`: none) holding
    /// at most `cap` waiting bytes.
    pub fn new(threshold: Option<u64>, cap: u64) -> Pool {
        Pool {
            state: Mutex::default(),
            threshold,
            cap,
        }
    }

    /// An empty pool with this one's settings.
    pub fn like(&self) -> Pool {
        Pool::new(self.threshold, self.cap)
    }

    fn pooled(&self, size: u64) -> bool {
        self.threshold.is_none_or(|t| size <= t) && class_of(size) <= self.cap
    }

    /// `size` bytes (`size > 0`) from the pool, else from `dev`.
    pub fn alloc(&self, dev: &dyn Backing, size: u64) -> Result<u64, String> {
        if !self.pooled(size) {
            return match dev.alloc_raw(size) {
                Err(_) if self.release(dev) > 0 => dev.alloc_raw(size),
                r => r,
            };
        }
        let class = class_of(size);
        {
            let mut st = lock(&self.state);
            if let Some(p) = st.free.get_mut(&class).and_then(Vec::pop) {
                st.waiting -= class;
                st.live.insert(p, class);
                return Ok(p);
            }
        }
        let p = match dev.alloc_raw(class) {
            Ok(p) => p,
            Err(_) if self.release(dev) > 0 => dev.alloc_raw(class)?,
            Err(e) => return Err(e),
        };
        lock(&self.state).live.insert(p, class);
        Ok(p)
    }

    /// Takes back `ptr` from [`Pool::alloc`] (it waits, or goes back to `dev`).
    pub fn free(&self, dev: &dyn Backing, ptr: u64) {
        let mut st = lock(&self.state);
        let Some(class) = st.live.remove(&ptr) else {
            drop(st);
            // Not the pool's (unpooled size): the device's own.
            return dev.free_raw(ptr);
        };
        if st.waiting + class <= self.cap {
            st.waiting += class;
            st.free.entry(class).or_default().push(ptr);
        } else {
            drop(st);
            dev.free_raw(ptr);
        }
    }

    /// Gives every waiting block back to `dev`; how many there were.
    pub fn release(&self, dev: &dyn Backing) -> usize {
        let blocks: Vec<u64> = {
            let mut st = lock(&self.state);
            st.waiting = 0;
            std::mem::take(&mut st.free)
                .into_values()
                .flatten()
                .collect()
        };
        let n = blocks.len();
        for p in blocks {
            dev.free_raw(p);
        }
        n
    }

    /// Bytes waiting now.
    #[cfg(test)]
    pub fn waiting(&self) -> u64 {
        lock(&self.state).waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// A device that counts: allocations get fresh addresses; `limit` makes them fail.
    #[derive(Default)]
    struct Counting {
        next: RefCell<u64>,
        live: RefCell<HashMap<u64, u64>>,
        allocs: RefCell<u32>,
        limit: RefCell<Option<u64>>,
    }
    impl Backing for Counting {
        fn alloc_raw(&self, size: u64) -> Result<u64, String> {
            let used: u64 = self.live.borrow().values().sum();
            if self.limit.borrow().is_some_and(|l| used + size > l) {
                return Err(format!("{size} bytes: out of memory"));
            }
            *self.allocs.borrow_mut() += 1;
            let mut n = self.next.borrow_mut();
            *n += 1 << 32;
            self.live.borrow_mut().insert(*n, size);
            Ok(*n)
        }
        fn free_raw(&self, ptr: u64) {
            assert!(self.live.borrow_mut().remove(&ptr).is_some(), "double free");
        }
    }

    #[test]
    fn classes_cover_the_request_and_waste_at_most_half_below_a_mib() {
        let mut seq = offload_core::rand::XorShift(0x2545_f491_4f6c_dd1d);
        for _ in 0..20_000 {
            let rng = seq.next_u64();
            let size = 1 + rng % (1 << (rng % 31));
            let c = class_of(size);
            assert!(c >= size && c >= MIN_CLASS, "{size} -> {c}");
            if size > MIN_CLASS && size <= POW2_LIMIT {
                assert!(c < 2 * size, "{size} -> {c}");
            }
            if size > POW2_LIMIT {
                assert!(c - size < POW2_LIMIT, "{size} -> {c}");
            }
        }
        assert_eq!(class_of(1), 256);
        assert_eq!(class_of(257), 512);
        assert_eq!(class_of(64 << 20), 64 << 20);
        assert_eq!(class_of((64 << 20) + 1), 65 << 20);
    }

    #[test]
    fn a_freed_block_comes_back_for_the_next_request_of_its_class() {
        let dev = Counting::default();
        let pool = Pool::new(None, 1 << 30);
        let a = pool.alloc(&dev, 8).unwrap();
        pool.free(&dev, a);
        assert_eq!(pool.waiting(), 256);
        // Same class, newest first; another class gets its own block.
        assert_eq!(pool.alloc(&dev, 200).unwrap(), a);
        let b = pool.alloc(&dev, 4096).unwrap();
        assert_ne!(a, b);
        assert_eq!(*dev.allocs.borrow(), 2);
        pool.free(&dev, a);
        pool.free(&dev, b);
        assert_eq!(pool.release(&dev), 2);
        assert!(dev.live.borrow().is_empty());
    }

    #[test]
    fn the_cap_the_threshold_and_a_failing_device_are_honoured() {
        let dev = Counting::default();
        // At most 1 KiB waits: the second 1 KiB block goes back at once.
        let pool = Pool::new(None, 1024);
        let (a, b) = (
            pool.alloc(&dev, 1000).unwrap(),
            pool.alloc(&dev, 1000).unwrap(),
        );
        pool.free(&dev, a);
        pool.free(&dev, b);
        assert_eq!(pool.waiting(), 1024);
        assert_eq!(dev.live.borrow().len(), 1);
        // Larger than the cap: never pooled.
        let big = pool.alloc(&dev, 4096).unwrap();
        assert_eq!(dev.live.borrow()[&big], 4096);
        pool.free(&dev, big);
        assert_eq!(dev.live.borrow().len(), 1);
        // Threshold 0: the pool is off.
        let off = Pool::new(Some(0), 1 << 30);
        let p = off.alloc(&dev, 8).unwrap();
        assert_eq!(dev.live.borrow()[&p], 8);
        off.free(&dev, p);
        assert_eq!(off.waiting(), 0);
        // A device that is full: the waiting blocks go back and the request is tried again.
        let (dev, pool) = (Counting::default(), Pool::new(None, 1 << 30));
        let x = pool.alloc(&dev, 300).unwrap();
        pool.free(&dev, x);
        assert_eq!(pool.waiting(), 512);
        *dev.limit.borrow_mut() = Some(1024);
        let c = pool.alloc(&dev, 600).unwrap();
        assert_eq!(pool.waiting(), 0);
        assert_eq!(*dev.live.borrow(), HashMap::from([(c, 1024)]));
        assert!(pool.alloc(&dev, 600).unwrap_err().contains("out of memory"));
    }
}
