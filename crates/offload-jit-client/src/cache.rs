//! The content-addressed, single-flight cache of compiled images.
//!
//! - The key is a BLAKE3 hash over length-prefixed fields (see `key.rs`), never an
//!   address, so a freed image whose address is reused can never hit another program's entry.
//! - One compile per key: the first requester compiles while later requesters of the same key
//!   wait for its result; requesters of different keys compile in parallel (the lock is held
//!   only to look up and update the map, never across a compile).
//! - Bounded memory: past the capacity, least recently used entries are dropped, but only those
//!   no loaded program still holds (an entry is an `Arc`; a loaded program keeps a clone).
//! - A failed compile is not cached: its waiters get the error and the next request retries.
//!   The exception is a key whose compile killed the JIT worker (a crash, the time or memory
//!   limit): it is remembered as failed, so one bad image cannot kill worker after worker, and
//!   it is retried only when its inputs change (which changes the key).

pub use offload_core::JitStats;
use offload_core::jit::{CacheKey, CompileOutput, CompiledImage, Served};
use offload_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

type Outcome = std::result::Result<Arc<CompiledImage>, Error>;

#[derive(Debug, Default)]
struct Flight {
    result: Mutex<Option<Outcome>>,
    done: Condvar,
}

#[derive(Debug)]
enum Slot {
    Ready {
        image: Arc<CompiledImage>,
        last_use: u64,
    },
    InFlight(Arc<Flight>),
    /// The compile killed the worker; this is what every later request gets.
    Failed(Error),
}

/// Most remembered failures kept (they are small, but inputs are unbounded).
const MAX_FAILED: usize = 4096;

/// Why a compile failed, as the cache needs to know it.
#[derive(Debug, Clone)]
pub struct CompileError {
    /// The error for every requester.
    pub error: Error,
    /// Remember the key as failed (the compile killed the worker).
    pub remember: bool,
}

impl From<Error> for CompileError {
    fn from(error: Error) -> Self {
        CompileError {
            error,
            remember: false,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    map: HashMap<CacheKey, Slot>,
    tick: u64,
    stats: JitStats,
}

/// See the module docs.
#[derive(Debug)]
pub struct Cache {
    inner: Mutex<Inner>,
    capacity: u64,
}

use offload_core::sync::lock;

impl Cache {
    /// A cache holding at most `capacity` bytes of images that no program uses.
    pub fn new(capacity: u64) -> Self {
        Cache {
            inner: Mutex::default(),
            capacity,
        }
    }

    /// Current counters.
    pub fn stats(&self) -> JitStats {
        lock(&self.inner).stats
    }

    /// Returns the image for `key`, compiling it with `compile` if nobody has (or is).
    pub fn get_or_compile(
        &self,
        key: CacheKey,
        compile: impl FnOnce() -> std::result::Result<CompileOutput, CompileError>,
    ) -> Result<(Arc<CompiledImage>, Served)> {
        self.get_or_produce(key, || compile().map(|o| (o, Served::Compiled)))
    }

    /// [`get_or_compile`](Self::get_or_compile) with a producer that may find the image
    /// elsewhere: it says where ([`Served::Compiled`], or [`Served::DiskHit`] or
    /// [`Served::RemoteHit`], which are not counted as compiles).
    pub fn get_or_produce(
        &self,
        key: CacheKey,
        produce: impl FnOnce() -> std::result::Result<(CompileOutput, Served), CompileError>,
    ) -> Result<(Arc<CompiledImage>, Served)> {
        let flight = {
            let mut inner = lock(&self.inner);
            inner.tick += 1;
            let tick = inner.tick;
            match inner.map.get_mut(&key) {
                Some(Slot::Ready { image, last_use }) => {
                    *last_use = tick;
                    let image = image.clone();
                    inner.stats.memory_hits += 1;
                    return Ok((image, Served::MemoryHit));
                }
                Some(Slot::InFlight(f)) => {
                    let f = f.clone();
                    inner.stats.shared_waits += 1;
                    drop(inner);
                    return Self::wait(&f).map(|image| (image, Served::SharedCompile));
                }
                Some(Slot::Failed(e)) => {
                    let e = e.clone();
                    inner.stats.failures += 1;
                    return Err(e.context(format!(
                        "image {} failed before in this process and is not compiled again until \
                         its inputs change",
                        key.short()
                    )));
                }
                None => {
                    let f = Arc::new(Flight::default());
                    inner.map.insert(key, Slot::InFlight(f.clone()));
                    inner.stats.misses += 1;
                    inner.stats.in_flight += 1;
                    inner.stats.peak_in_flight =
                        inner.stats.peak_in_flight.max(inner.stats.in_flight);
                    f
                }
            }
        };

        // Compile without holding the lock. A panic in `compile` must not leave waiters
        // hanging, so it is turned into an error here.
        let started = Instant::now();
        let mut remember = false;
        let mut source = Served::Compiled;
        let outcome = offload_core::panic::catch(produce)
            .unwrap_or_else(|m| {
                Err(Error::CompileFailure(format!("the compiler panicked: {m}")).into())
            })
            .map_err(|e| {
                remember = e.remember;
                e.error
            })
            .map(|(out, from)| {
                source = from;
                Arc::new(CompiledImage {
                    key,
                    bytes: out.bytes,
                    signatures: out.signatures,
                    compile_time: started.elapsed(),
                })
            });

        {
            let mut inner = lock(&self.inner);
            inner.stats.in_flight -= 1;
            let from_disk = source != Served::Compiled;
            if !from_disk {
                inner.stats.compile_ns += started.elapsed().as_nanos() as u64;
            }
            match &outcome {
                Ok(image) => {
                    inner.tick += 1;
                    let tick = inner.tick;
                    if !from_disk {
                        inner.stats.compiles += 1;
                    }
                    inner.stats.entries += 1;
                    inner.stats.bytes += image.bytes.len() as u64;
                    inner.map.insert(
                        key,
                        Slot::Ready {
                            image: image.clone(),
                            last_use: tick,
                        },
                    );
                    self.evict(&mut inner);
                }
                Err(e) => {
                    inner.stats.failures += 1;
                    if remember {
                        let failed = inner
                            .map
                            .values()
                            .filter(|s| matches!(s, Slot::Failed(_)))
                            .count();
                        if failed >= MAX_FAILED {
                            inner.map.retain(|_, s| !matches!(s, Slot::Failed(_)));
                        }
                        inner.map.insert(key, Slot::Failed(e.clone()));
                    } else {
                        inner.map.remove(&key);
                    }
                }
            }
        }
        *lock(&flight.result) = Some(outcome.clone());
        flight.done.notify_all();
        outcome.map(|image| (image, source))
    }

    fn wait(flight: &Flight) -> Outcome {
        let mut result = lock(&flight.result);
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            result = offload_core::sync::wait(&flight.done, result);
        }
    }

    /// Drops least recently used entries that nobody else holds until under capacity.
    fn evict(&self, inner: &mut Inner) {
        while inner.stats.bytes > self.capacity {
            let victim = inner
                .map
                .iter()
                .filter_map(|(k, s)| match s {
                    Slot::Ready { image, last_use } if Arc::strong_count(image) == 1 => {
                        Some((*last_use, *k))
                    }
                    _ => None,
                })
                .min();
            let Some((_, key)) = victim else {
                // Everything left is in use by a loaded program; it is released later.
                return;
            };
            if let Some(Slot::Ready { image, .. }) = inner.map.remove(&key) {
                inner.stats.entries -= 1;
                inner.stats.bytes -= image.bytes.len() as u64;
                inner.stats.evictions += 1;
            }
        }
    }

    /// Re-applies the capacity (call after programs release images).
    pub fn trim(&self) {
        let mut inner = lock(&self.inner);
        self.evict(&mut inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyBuilder;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    fn key(n: u8) -> CacheKey {
        KeyBuilder::new().field("n", &[n]).finish()
    }

    fn out(bytes: Vec<u8>) -> CompileOutput {
        CompileOutput {
            bytes,
            signatures: Vec::new(),
        }
    }

    #[test]
    fn one_compile_per_key_under_contention() {
        let cache = Cache::new(1 << 20);
        let compiles = AtomicU32::new(0);
        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    let (img, _) = cache
                        .get_or_compile(key(1), || {
                            compiles.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50));
                            Ok(out(vec![7; 10]))
                        })
                        .unwrap();
                    assert_eq!(img.bytes, vec![7; 10]);
                });
            }
        });
        assert_eq!(compiles.load(Ordering::SeqCst), 1);
        let st = cache.stats();
        assert_eq!(st.compiles, 1);
        assert_eq!(st.misses, 1);
        assert_eq!(st.memory_hits + st.shared_waits, 15);
    }

    #[test]
    fn failures_reach_waiters_and_are_not_cached() {
        let cache = Cache::new(1 << 20);
        let e = cache
            .get_or_compile(key(2), || Err(Error::CompileFailure("bad".into()).into()))
            .unwrap_err();
        assert!(e.to_string().contains("bad"));
        let (_, served) = cache.get_or_compile(key(2), || Ok(out(vec![1]))).unwrap();
        assert_eq!(served, Served::Compiled);
        let e = cache.get_or_compile(key(3), || panic!("boom")).unwrap_err();
        assert!(e.to_string().contains("panicked"));
        assert_eq!(cache.stats().failures, 2);
        // A compile that killed the worker is remembered: no second compile.
        let killer = || {
            Err(CompileError {
                error: Error::CompileFailure("worker died".into()),
                remember: true,
            })
        };
        assert!(cache.get_or_compile(key(4), killer).is_err());
        let e = cache
            .get_or_compile(key(4), || panic!("must not compile again"))
            .unwrap_err();
        assert!(e.to_string().contains("failed before"), "{e}");
        assert!(e.to_string().contains("worker died"), "{e}");
        assert_eq!(cache.stats().failures, 4);
    }

    #[test]
    fn eviction_is_lru_and_spares_images_in_use() {
        let cache = Cache::new(25);
        let (held, _) = cache
            .get_or_compile(key(1), || Ok(out(vec![0; 10])))
            .unwrap();
        cache
            .get_or_compile(key(2), || Ok(out(vec![0; 10])))
            .unwrap();
        cache
            .get_or_compile(key(3), || Ok(out(vec![0; 10])))
            .unwrap();
        // 30 bytes > 25: key 1 is the oldest but held, so key 2 goes.
        let st = cache.stats();
        assert_eq!((st.entries, st.bytes, st.evictions), (2, 20, 1));
        assert_eq!(
            cache.get_or_compile(key(1), || Ok(out(vec![9]))).unwrap().1,
            Served::MemoryHit
        );
        assert_eq!(
            cache
                .get_or_compile(key(2), || Ok(out(vec![0; 10])))
                .unwrap()
                .1,
            Served::Compiled
        );
        drop(held);
        cache.trim();
        assert!(cache.stats().bytes <= 25);
    }
}
