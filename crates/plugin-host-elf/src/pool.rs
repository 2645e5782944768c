//! The host backend's worker threads, and how they wait between launches.
//!
//! A launch runs on the calling thread and on up to `threads - 1` workers. Between launches a
//! worker waits by the policy `OFFLOAD_HOST_WAIT`:
//!
//! - `spin`: it polls for the next launch and never sleeps (the lowest latency; a core per
//!   worker stays busy for as long as the process lives);
//! - `park`: it sleeps at once, and each launch wakes it (a futex wake-up per worker, tens of
//!   microseconds before the worker joins);
//! - `auto` (the default): it polls for `OFFLOAD_HOST_SPIN_US` microseconds after its last
//!   work (default 2000), then sleeps. Launches in a row find the workers awake, as OpenMP's
//!   do within its `KMP_BLOCKTIME` (200 ms by default); an idle process burns nothing after
//!   the spin time.

use offload_core::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Variable that sets how idle workers wait.
pub const ENV_WAIT: &str = "OFFLOAD_HOST_WAIT";
/// Variable that sets, for `auto`, how long idle workers poll before they sleep.
pub const ENV_SPIN_US: &str = "OFFLOAD_HOST_SPIN_US";
/// The default of [`ENV_SPIN_US`].
pub const DEFAULT_SPIN_US: u32 = 2000;

/// How an idle worker waits for the next launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Poll, never sleep.
    Spin,
    /// Sleep at once.
    Park,
    /// Poll for this long after the last work, then sleep.
    Auto(Duration),
}

impl Wait {
    /// The policy the environment sets.
    pub fn from_env() -> Result<Wait> {
        let spin = Duration::from_micros(u64::from(offload_core::env::u32_in_range(
            &[ENV_SPIN_US],
            0,
            10_000_000,
            DEFAULT_SPIN_US,
        )?));
        let Some((name, value)) = offload_core::env::raw(&[ENV_WAIT])? else {
            return Ok(Wait::Auto(spin));
        };
        match value.trim() {
            "spin" => Ok(Wait::Spin),
            "park" => Ok(Wait::Park),
            "auto" => Ok(Wait::Auto(spin)),
            _ => Err(Error::InvalidArgument(format!(
                "environment variable {name}='{value}' is not valid: expected spin, park or auto"
            ))),
        }
    }
}

/// The work of one launch, as the workers see it: a closure on the caller's stack, which the
/// caller keeps alive until every worker taking part is done with it.
type Work = dyn Fn() + Sync;

struct Shared {
    wait: Wait,
    /// The launch: a number bumped for each (high bits) and how many workers take part in it
    /// (the low 16 bits), read as one so that a worker never mixes two launches.
    launch: AtomicU64,
    /// The launch's work (a `*const &Work`).
    work: AtomicPtr<&'static Work>,
    /// Workers done with the launch, and whether one of them panicked.
    done: AtomicUsize,
    panicked: AtomicBool,
    /// Workers asleep; they sleep on `wake` under `lock`.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The calling thread and `threads - 1` workers.
pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// One launch at a time uses the workers.
    one: Mutex<()>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("threads", &self.threads)
            .field("wait", &self.shared.wait)
            .finish()
    }
}

impl Pool {
    /// Starts `threads - 1` workers (named `offload-host-N`) waiting by `wait`.
    pub fn new(threads: usize, wait: Wait) -> Result<Pool> {
        let threads = threads.clamp(1, 1 << 15);
        let shared = Arc::new(Shared {
            wait,
            launch: AtomicU64::new(0),
            work: AtomicPtr::new(std::ptr::null_mut()),
            done: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        for index in 0..threads.saturating_sub(1) {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("offload-host-{index}"))
                .spawn(move || worker(&shared, index))
                .map_err(|e| {
                    Error::System(format!("cannot start {threads} host worker threads: {e}"))
                })?;
        }
        Ok(Pool {
            shared,
            threads,
            one: Mutex::new(()),
        })
    }

    /// The calling thread and the workers.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `work` on the calling thread and on `helpers` workers (at most `threads - 1`) at
    /// once, and returns when all of them have returned from it.
    pub fn run(&self, helpers: usize, work: &(dyn Fn() + Sync)) {
        let helpers = helpers.min(self.threads - 1);
        if helpers == 0 {
            return work();
        }
        let _one = offload_core::sync::lock(&self.one);
        let s = &*self.shared;
        // SAFETY: only the lifetime is extended. `work` lives until this function returns, and
        // it returns only once every worker taking part has counted itself done, after its
        // last use of `work`; the next launch replaces the pointer before it publishes itself.
        let work: &'static Work =
            unsafe { std::mem::transmute::<&(dyn Fn() + Sync), &'static Work>(work) };
        let slot: &&'static Work = &work;
        s.done.store(0, Ordering::Relaxed);
        s.work
            .store(slot as *const _ as *mut &'static Work, Ordering::Relaxed);
        let next = ((s.launch.load(Ordering::Relaxed) >> 16) + 1) << 16 | helpers as u64;
        s.launch.store(next, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = offload_core::sync::lock(&s.lock);
            s.wake.notify_all();
        }
        let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let mut polls = 0u32;
        while s.done.load(Ordering::Acquire) < helpers {
            polls = polls.saturating_add(1);
            if polls < 4096 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        let worker_panicked = s.panicked.swap(false, Ordering::Relaxed);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if worker_panicked {
            panic!("a host worker thread panicked while running a launch");
        }
    }
}

/// Worker `index`: waits for each launch and takes part if the launch asks for it.
fn worker(s: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        seen = next_launch(s, seen);
        if index as u64 >= seen & 0xffff {
            continue;
        }
        let slot = s.work.load(Ordering::Relaxed);
        // SAFETY: set by `run` before it published the launch (which this thread acquired),
        // and alive until this worker counts itself done below: the next launch cannot start
        // before then.
        let work = unsafe { *slot };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        s.done.fetch_add(1, Ordering::Release);
    }
}

/// Waits, by the pool's policy, for a launch after `seen`, and returns it.
fn next_launch(s: &Shared, seen: u64) -> u64 {
    let deadline = match s.wait {
        Wait::Spin => None,
        Wait::Park => Some(Instant::now()),
        Wait::Auto(d) => Some(Instant::now() + d),
    };
    let mut polls = 0u32;
    loop {
        let g = s.launch.load(Ordering::Acquire);
        if g != seen {
            return g;
        }
        polls = polls.wrapping_add(1);
        if polls % 256 == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        std::hint::spin_loop();
    }
    let mut guard = offload_core::sync::lock(&s.lock);
    s.sleepers.fetch_add(1, Ordering::SeqCst);
    loop {
        let g = s.launch.load(Ordering::SeqCst);
        if g != seen {
            s.sleepers.fetch_sub(1, Ordering::SeqCst);
            return g;
        }
        guard = offload_core::sync::wait(&s.wake, guard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_runs_each_launch_on_the_caller_and_the_helpers_asked_for() {
        for wait in [
            Wait::Spin,
            Wait::Park,
            Wait::Auto(Duration::from_micros(50)),
        ] {
            let pool = Pool::new(4, wait).unwrap();
            for launch in 0..300usize {
                let helpers = launch % 5;
                let ran = AtomicUsize::new(0);
                pool.run(helpers, &|| {
                    ran.fetch_add(1, Ordering::Relaxed);
                });
                assert_eq!(
                    ran.into_inner(),
                    1 + helpers.min(3),
                    "{wait:?} launch {launch}"
                );
                if launch % 50 == 0 {
                    // Long enough for `park` and `auto` workers to be asleep.
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    #[test]
    fn a_panic_in_a_worker_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2, Wait::Park).unwrap();
        let caller = std::thread::current().id();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.run(1, &|| {
                if std::thread::current().id() != caller {
                    panic!("worker");
                }
            })
        }));
        assert!(r.is_err());
        let ran = AtomicUsize::new(0);
        pool.run(1, &|| {
            ran.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(ran.into_inner(), 2);
    }

    #[test]
    fn the_policy_comes_from_the_environment_and_bad_values_are_named() {
        // (Read through `from_env` by the plugin's init; here the parsing of each value.)
        // SAFETY: this test alone reads and writes these variables in this test binary.
        unsafe {
            std::env::set_var(ENV_WAIT, "spin");
            assert_eq!(Wait::from_env().unwrap(), Wait::Spin);
            std::env::set_var(ENV_WAIT, "park");
            assert_eq!(Wait::from_env().unwrap(), Wait::Park);
            std::env::set_var(ENV_SPIN_US, "150");
            std::env::set_var(ENV_WAIT, "auto");
            assert_eq!(
                Wait::from_env().unwrap(),
                Wait::Auto(Duration::from_micros(150))
            );
            std::env::set_var(ENV_WAIT, "sometimes");
            let e = Wait::from_env().unwrap_err().to_string();
            assert!(e.contains("OFFLOAD_HOST_WAIT='sometimes'"), "{e}");
            std::env::set_var(ENV_WAIT, "auto");
            std::env::set_var(ENV_SPIN_US, "-1");
            let e = Wait::from_env().unwrap_err().to_string();
            assert!(e.contains("OFFLOAD_HOST_SPIN_US"), "{e}");
            std::env::remove_var(ENV_WAIT);
            std::env::remove_var(ENV_SPIN_US);
            assert_eq!(
                Wait::from_env().unwrap(),
                Wait::Auto(Duration::from_micros(u64::from(DEFAULT_SPIN_US)))
            );
        }
    }
}
