//! The device work of one construct, and `nowait` constructs on GPUs (upstream's `AsyncInfoTy`
//! and `TaskAsyncInfoWrapperTy`, `offload/src/interface.cpp` and `omptarget.cpp`).
//!
//! A construct does its device work through a [`Work`]. Blocking constructs, and every construct
//! on the host plugin's devices, work synchronously: each copy and launch is done when its call
//! returns (the host kernel runs on the calling OpenMP thread, which libomp gives its
//! parallelism). A `nowait` construct on a CUDA or AMD device, running in an OpenMP task that
//! libomp can re-enqueue, takes a queue of the device instead (pooled per device; upstream
//! takes a stream from its pool): its copies and launch are queued, and what must wait until
//! the queue has run waits in the `Work`: frees of device memory (mapping deletions, private
//! copies, the launch's environment and reduction buffer), the restoring of host pointers that
//! a `from` copy overwrote, and the values copied from this library's own memory. If the queue
//! is not done when the construct returns, the work is left in the task's async handle;
//! libomp calls [`__tgt_target_nowait_query`](crate::target) until it completes, and the task
//! (and every task that depends on it) completes then. Upstream's query backoff is kept: a
//! thread that polls more than `LIBOMPTARGET_QUERY_COUNT_THRESHOLD` (5) unfinished handles in a
//! row blocks on the next one; the count is halved (`LIBOMPTARGET_QUERY_COUNT_BACKOFF_FACTOR`)
//! on each completion and capped at `LIBOMPTARGET_QUERY_COUNT_MAX` (10).
//!
//! Map entries that a queued copy filled carry a fence ([`crate::mapping::Fence`]): a construct that
//! finds the entry present waits for it, on its queue or on the thread.

use crate::mapping::{self, DeviceMemory, Fence};
use crate::messages;
use crate::pool;
use crate::rtl::{OmpDevice, lock};
use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::sync::{Arc, Mutex, OnceLock};

/// What waits until a construct's queue has run.
#[derive(Default)]
struct After {
    /// Pool memory (mappings, private copies).
    frees: Vec<u64>,
    /// Launch temporaries, allocated outside the pool.
    raw_frees: Vec<u64>,
    /// Host pointers to restore: (address, value).
    restores: Vec<(usize, usize)>,
    /// Sources of queued copies of this library's own values.
    staged: Vec<Box<[u8]>>,
}

/// The device work of one construct.
pub struct Work {
    pub dev: Arc<OmpDevice>,
    queue: Option<offload::Queue>,
    after: Mutex<After>,
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Work(device {}, {})",
            self.dev.id,
            if self.queue.is_some() {
                "queued"
            } else {
                "synchronous"
            }
        )
    }
}

impl Work {
    /// Synchronous work on `dev`.
    pub fn blocking(dev: Arc<OmpDevice>) -> Work {
        Work {
            dev,
            queue: None,
            after: Mutex::default(),
        }
    }

    /// Work on a queue of `dev` (synchronous if the device cannot give one: said in the log).
    fn queued(dev: Arc<OmpDevice>) -> Work {
        let queue = match dev.take_queue() {
            Ok(q) => Some(q),
            Err(e) => {
                tracing::warn!(target: "offload::launch",
                    "OpenMP device {}: no queue for a nowait construct ({e}); it runs synchronously",
                    dev.id);
                None
            }
        };
        Work {
            dev,
            queue,
            after: Mutex::default(),
        }
    }

    /// The queue the work goes on, if it is queued.
    pub fn queue(&self) -> Option<&offload::Queue> {
        self.queue.as_ref()
    }

    /// Frees a launch temporary (allocated with [`pool::Backing::alloc_raw`]) once the work
    /// before it has run.
    pub fn free_raw(&self, ptr: u64) {
        if self.queue.is_some() {
            lock(&self.after).raw_frees.push(ptr);
        } else {
            pool::Backing::free_raw(&self.dev.device, ptr);
        }
    }

    /// Waits for the queue, then does what waited for it. Returns the first error of the
    /// queued work. The queue goes back to the device's pool unless it failed.
    fn settle(&mut self) -> Result<(), String> {
        let Some(queue) = self.queue.take() else {
            return Ok(());
        };
        let result = queue
            .synchronize()
            .map_err(|e| format!("work queued on OpenMP device {}: {e}", self.dev.id));
        let after = std::mem::take(&mut *lock(&self.after));
        for (addr, value) in after.restores {
            // SAFETY: the mapping's shadow pointers (`restore` below).
            unsafe { mapping::restore_host_pointer(addr, value) };
        }
        for p in after.frees {
            self.dev.free(p);
        }
        for p in after.raw_frees {
            pool::Backing::free_raw(&self.dev.device, p);
        }
        drop(after.staged);
        if result.is_ok() {
            self.dev.give_back_queue(queue);
        }
        result
    }

    /// [`Work::settle`], its error said; whether the queued work succeeded.
    fn settle_or_say(&mut self) -> bool {
        match self.settle() {
            Ok(()) => true,
            Err(e) => {
                messages::error(&e);
                false
            }
        }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        self.settle_or_say();
    }
}

impl DeviceMemory for Work {
    fn alloc(&self, size: u64, host: usize) -> Option<u64> {
        self.dev.alloc(size, host)
    }
    fn free(&self, ptr: u64) {
        if self.queue.is_some() {
            lock(&self.after).frees.push(ptr);
        } else {
            self.dev.free(ptr);
        }
    }
    fn submit(&self, dst: u64, src: usize, size: u64) -> bool {
        self.dev.copy_in(dst, src, size, self.queue.as_ref())
    }
    fn retrieve(&self, dst: usize, src: u64, size: u64) -> bool {
        self.dev.copy_out(dst, src, size, self.queue.as_ref())
    }
    fn submit_value(&self, dst: u64, value: u64) -> bool {
        let staged: Box<[u8]> = Box::new(value.to_le_bytes());
        let ok = self
            .dev
            .copy_in(dst, staged.as_ptr() as usize, 8, self.queue.as_ref());
        if self.queue.is_some() {
            lock(&self.after).staged.push(staged);
        }
        ok
    }
    fn restore(&self, addr: usize, value: usize) {
        if self.queue.is_some() {
            lock(&self.after).restores.push((addr, value));
        } else {
            // SAFETY: the mapping passes only its shadow pointers' host addresses.
            unsafe { mapping::restore_host_pointer(addr, value) };
        }
    }
    fn fence(&self) -> Option<Fence> {
        let queue = self.queue.as_ref()?;
        match queue.record() {
            Ok(e) => Some(Arc::new(e)),
            Err(e) => {
                // The queue failed: its construct reports that; nothing waits for its copies.
                tracing::warn!(target: "offload::launch",
                    "OpenMP device {}: recording a fence: {e}", self.dev.id);
                None
            }
        }
    }
    fn after(&self, fence: &Fence) -> bool {
        // A finished fence's synchronize returns at once, with the error of the work it
        // followed, if that failed.
        let r = match &self.queue {
            Some(q) if !matches!(fence.is_complete(), Ok(true)) => q.wait(fence),
            _ => fence.synchronize(),
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                messages::error(&format!(
                    "OpenMP device {}: the copy into a mapping this construct uses failed: {e}",
                    self.dev.id
                ));
                false
            }
        }
    }
}

/// A construct's queued work that was not done when the construct returned (`work` is `None`
/// once it has been settled).
struct Pending {
    work: Mutex<Option<Work>>,
    event: offload::Event,
}

/// Handles this library gave out, by value: a handle libomp passes back is looked up here
/// before it is used, so a stale or foreign one is an error, not a wild read.
fn live() -> &'static Mutex<HashMap<usize, Arc<Pending>>> {
    static LIVE: OnceLock<Mutex<HashMap<usize, Arc<Pending>>>> = OnceLock::new();
    LIVE.get_or_init(Mutex::default)
}

type GlobalThreadNum = unsafe extern "C" fn(*mut c_void) -> i32;
type HasTaskTeam = unsafe extern "C" fn(i32) -> bool;
type HandlePtr = unsafe extern "C" fn(i32) -> *mut *mut c_void;

/// libomp's entry points for target tasks (absent from a libomp older than LLVM 17).
fn libomp() -> Option<(GlobalThreadNum, HasTaskTeam, HandlePtr)> {
    static FNS: OnceLock<Option<(usize, usize, usize)>> = OnceLock::new();
    let fns = FNS.get_or_init(|| {
        let sym = |name: &CStr| {
            // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
            let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
            (!p.is_null()).then_some(p as usize)
        };
        Some((
            sym(c"__kmpc_global_thread_num")?,
            sym(c"__kmpc_omp_has_task_team")?,
            sym(c"__kmpc_omp_get_target_async_handle_ptr")?,
        ))
    });
    let (a, b, c) = (*fns)?;
    // SAFETY: libomp's functions of these signatures (kmp.h).
    unsafe {
        Some((
            std::mem::transmute::<usize, GlobalThreadNum>(a),
            std::mem::transmute::<usize, HasTaskTeam>(b),
            std::mem::transmute::<usize, HandlePtr>(c),
        ))
    }
}

/// The async handle slot of the OpenMP task running this construct, where the task can be
/// re-enqueued (upstream's conditions: a known thread, a task team, a slot); `None`: block.
fn task_slot() -> Option<*mut *mut c_void> {
    let (gtid, has_team, slot) = libomp()?;
    // SAFETY: libomp's entry points; NULL is an accepted location.
    let id = unsafe { gtid(std::ptr::null_mut()) };
    if id < 0 {
        return None;
    }
    // SAFETY: as above, for a valid thread id.
    if !unsafe { has_team(id) } {
        return None;
    }
    // SAFETY: as above.
    let p = unsafe { slot(id) };
    if p.is_null() {
        return None;
    }
    // SAFETY: libomp's slot in the current task.
    if !unsafe { *p }.is_null() {
        // Upstream asserts this; a handle still in the slot is never overwritten.
        messages::error(
            "the OpenMP task's async handle is in use (a query was missed): this construct runs synchronously",
        );
        return None;
    }
    Some(p)
}

/// Runs a construct's device work on `dev`: queued if `nowait` asks for it and the device is
/// a GPU in a re-enqueueable task, else synchronously. `body` returns whether the construct's
/// work could be done; the result is that and, for work that finished, the queue's result.
pub fn construct(dev: &Arc<OmpDevice>, nowait: bool, body: impl FnOnce(&Work) -> bool) -> bool {
    let slot = if nowait && dev.gpu.is_some() {
        task_slot()
    } else {
        None
    };
    let Some(slot) = slot else {
        return body(&Work::blocking(dev.clone()));
    };
    let mut work = Work::queued(dev.clone());
    if !body(&work) {
        work.settle_or_say();
        return false;
    }
    let Some(queue) = work.queue.as_ref() else {
        return true;
    };
    let event = match queue.record() {
        Ok(e) => e,
        Err(e) => {
            messages::error(&format!("OpenMP device {}: {e}", dev.id));
            work.settle_or_say();
            return false;
        }
    };
    if matches!(event.is_complete(), Ok(true)) {
        return work.settle_or_say();
    }
    let pending = Arc::new(Pending {
        work: Mutex::new(Some(work)),
        event,
    });
    let key = Arc::as_ptr(&pending) as usize;
    lock(live()).insert(key, pending);
    tracing::debug!(target: "offload::launch",
        "OpenMP device {}: nowait construct queued (handle {key:#x})", dev.id);
    // SAFETY: libomp's slot of the current task (checked empty).
    unsafe { *slot = key as *mut c_void };
    true
}

/// Upstream's query backoff (`utils::ExponentialBackoff`), per thread.
struct Backoff {
    count: f64,
}

fn env_number(name: &str, default: f64) -> f64 {
    match offload_core::env::parsed::<f64>(
        &[name],
        |v| v.is_finite() && *v >= 0.0,
        "a number of 0 or more",
    ) {
        Ok(v) => v.unwrap_or(default),
        Err(e) => {
            messages::error(&format!("{e}; using {default}"));
            default
        }
    }
}

fn backoff_settings() -> (f64, f64, f64) {
    static S: OnceLock<(f64, f64, f64)> = OnceLock::new();
    *S.get_or_init(|| {
        (
            env_number("LIBOMPTARGET_QUERY_COUNT_MAX", 10.0),
            env_number("LIBOMPTARGET_QUERY_COUNT_THRESHOLD", 5.0),
            env_number("LIBOMPTARGET_QUERY_COUNT_BACKOFF_FACTOR", 0.5).min(1.0),
        )
    })
}

thread_local! {
    static QUERIES: std::cell::RefCell<Backoff> = const { std::cell::RefCell::new(Backoff { count: 0.0 }) };
}

/// Why a query failed.
#[derive(Debug)]
pub enum QueryError {
    /// The slot is NULL, or holds what this library never gave (the slot is cleared, so the
    /// task completes).
    Foreign(String),
    /// The queued work failed (the slot is cleared).
    Failed(String),
}

/// `__tgt_target_nowait_query`: whether the work in `*handle` is done; if it is, what waited
/// for it is done and the slot cleared. The slot is never left holding a handle that is not
/// live, so libomp never re-enqueues a task for ever.
///
/// # Safety
/// `handle` is NULL or a task's async handle slot.
pub unsafe fn query(handle: *mut *mut c_void) -> Result<(), QueryError> {
    if handle.is_null() {
        return Err(QueryError::Foreign(
            "__tgt_target_nowait_query: the async handle slot is NULL".into(),
        ));
    }
    // SAFETY: the caller's slot.
    let key = unsafe { *handle } as usize;
    if key == 0 {
        // Nothing queued (a construct that finished before it returned): nothing to wait for.
        return Ok(());
    }
    let Some(pending) = lock(live()).get(&key).cloned() else {
        // SAFETY: the caller's slot.
        unsafe { *handle = std::ptr::null_mut() };
        return Err(QueryError::Foreign(format!(
            "__tgt_target_nowait_query: {key:#x} is not an async handle of this library (a \
             stale or foreign handle); the slot is cleared"
        )));
    };
    let (max, threshold, factor) = backoff_settings();
    let block = QUERIES.with(|q| q.borrow().count > threshold);
    if block {
        // The thread has polled too many unfinished regions: it waits for this one.
        let _ = pending.event.synchronize();
    }
    // An event that cannot be asked ends the wait too (settling reports the queue's error):
    // libomp would otherwise re-enqueue the task for ever.
    let asked = pending.event.is_complete();
    if matches!(asked, Ok(false)) {
        QUERIES.with(|q| {
            let mut q = q.borrow_mut();
            q.count = (q.count + 1.0).min(max);
        });
        return Ok(());
    }
    QUERIES.with(|q| q.borrow_mut().count *= factor);
    // Settled under its own lock: whoever settles it (this query or `settle_all`), the slot is
    // cleared only once the work is settled.
    let settled = {
        let mut work = lock(&pending.work);
        match work.take() {
            Some(mut w) => w.settle(),
            None => Ok(()),
        }
    };
    lock(live()).remove(&key);
    // SAFETY: the caller's slot.
    unsafe { *handle = std::ptr::null_mut() };
    match asked {
        Err(e) => Err(QueryError::Failed(format!(
            "asking whether queued work is done: {e}"
        ))),
        Ok(_) => settled.map_err(QueryError::Failed),
    }
}

/// Work queued by `nowait` constructs that no query has completed yet: waited for and
/// settled, at unregistration. The handles stay live (settled), so a task that queries one
/// later completes at once.
pub fn settle_all() {
    let all: Vec<Arc<Pending>> = lock(live()).values().cloned().collect();
    for p in all {
        // Held while it settles: a query of this handle waits, then finds it settled.
        let mut work = lock(&p.work);
        if let Some(mut w) = work.take() {
            w.settle_or_say();
        }
    }
}
