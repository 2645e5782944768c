//! One AMD GPU (an HSA GPU agent): the hooks the generic device layer calls.
//!
//! Memory comes from the agent's coarse-grained global pool (device memory) and the CPU's
//! fine-grained pool (pinned host and shared memory); kernel arguments from the CPU's kernarg
//! pool. Copies use the agent's DMA engines (`hsa_amd_memory_async_copy`). A copy from the host
//! locks its host side for the agent unless the runtime allocated or locked it already; a copy
//! to the host goes through a pinned staging buffer, which the CPU copies out of once the DMA
//! has completed ([`AmdDevice::copy_to_host`]), so that a copy that never settles cannot write
//! memory the program has been given back. A GPU memory fault
//! is recorded by the plugin's system event handler and fails the device's work from then on,
//! instead of ending the process. A queue of the layer owns an HSA queue; work without a queue
//! runs on a queue of the device's own. Each operation waits for its completion signal, so memory
//! the layer keeps alive for an operation is never freed while the GPU still uses it. Completion
//! signals and kernel-argument areas are kept for reuse ([`Reuse`]): creating a signal, or
//! allocating a kernarg area and giving the agent access to it, costs a call into the runtime
//! each (tens of microseconds on ROCm), per operation.

use crate::TRIPLE;
use crate::hsa::{
    self, DispatchPacket, Handle, Hsa, Queue, agent_info, aql, pool_info, symbol_info,
};
use crate::metadata::{self, ArgKind, Metadata};
use crate::target::{TargetId, code_object_target};
use offload_core::image::ImageKind;
use offload_core::jit::{JitTarget, ParamType, PostProcess};
use offload_core::{
    DeviceInfo, DeviceLimits, DevicePtr, Error, GlobalSymbol, KernelArg, LaunchDims, MemoryKind,
    Result,
};
use offload_plugin_common::{DeviceBackend, Fit, Op};
use std::ffi::{CString, c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

/// Packets in each HSA queue (each operation waits for its own, so few are ever in flight).
const QUEUE_PACKETS: u32 = 256;
/// How long one wait on a signal blocks before the queue's error flag and the device's faults
/// are looked at again (a hint to the runtime, in its timestamp units: about 1 ms at 1 GHz,
/// 10 ms at 100 MHz; the loop does not depend on it). A failed GPU is seen that soon.
const WAIT_HINT: u64 = 1 << 20;
/// Scratch added per work item for kernels with a dynamic stack (`.uses_dynamic_stack`:
/// recursion, calls through pointers), as HIP's default stack limit.
const DYNAMIC_STACK: u32 = 1024;
/// LDS per work-group when the runtime lists no group-segment pool (gfx9 to gfx11).
const DEFAULT_LDS: u32 = 64 << 10;
/// `HSA_STATUS_ERROR`
const HSA_ERROR: c_int = 0x1000;
/// At most this many idle completion signals, and idle kernarg areas, are kept per device.
const KEEP_IDLE: usize = 64;

/// GPU memory faults the runtime reported through its system event handler, by agent. ROCr
/// ends the process on a memory fault unless a handler says it handled it; this one records
/// it, so the launch that faulted (and every later operation of that device) fails with it.
static FAULTS: Mutex<Vec<(Handle, String)>> = Mutex::new(Vec::new());

/// Host ranges this plugin has locked (`hsa_amd_memory_lock`) for the copies running now, in
/// every device of the process. A copy of a range that another thread's copy has locked for the
/// same agent uses that lock instead of locking again, and the last of them unlocks it (one
/// copy's unlock must not pull the pages from under another's DMA); a copy whose range
/// overlaps a lock for another agent, or is not inside it, waits until it is unlocked. Locking
/// and unlocking happen under the table's mutex, which no GPU work waits for.
static HOST_LOCKS: Mutex<Vec<HostLock>> = Mutex::new(Vec::new());
/// Notified when a lock of [`HOST_LOCKS`] goes.
static HOST_UNLOCKED: std::sync::Condvar = std::sync::Condvar::new();

/// A host range locked for one agent, and how many copies use it.
struct HostLock {
    start: usize,
    end: usize,
    agent: Handle,
    agent_ptr: usize,
    users: usize,
}

/// What a DMA copy came to, and whether it is settled: completed, or never started. An
/// unsettled copy (its wait failed) may still be running, so what it uses must stay.
type Settled<T> = (Result<T>, bool);

/// The result of an operation as the layer gets it: a failure that did not settle is
/// [`Error::Unsettled`], so that the layer quarantines the memory it used
/// (`offload_plugin_common::health`).
fn settle<T>((out, settled): Settled<T>) -> Result<T> {
    if settled {
        out
    } else {
        out.map_err(Error::unsettled)
    }
}

/// One copy's use of a lock of [`HOST_LOCKS`]; dropping it gives the lock back: the last
/// settled use unlocks it. An unsettled use (the copy may still be running, or `f` panicked)
/// takes the lock out of the table without unlocking it: the pages stay locked for good (for
/// the table, they are then someone else's), and no later copy waits for them.
struct HostLockUse<'a> {
    device: &'a AmdDevice,
    start: usize,
    end: usize,
    settled: bool,
}

impl Drop for HostLockUse<'_> {
    fn drop(&mut self) {
        let mut locks = offload_core::sync::lock(&HOST_LOCKS);
        let Some(i) = locks.iter().position(|l| {
            l.agent == self.device.agent && l.start <= self.start && self.end <= l.end
        }) else {
            return;
        };
        if !self.settled {
            locks.swap_remove(i);
        } else {
            locks[i].users -= 1;
            if locks[i].users > 0 {
                return;
            }
            let l = locks.swap_remove(i);
            // SAFETY: locked by this plugin; the last copy that used it has finished.
            let _ = unsafe {
                self.device
                    .hsa
                    .hsa_amd_memory_unlock(l.start as *mut c_void)
            };
        }
        HOST_UNLOCKED.notify_all();
    }
}

/// The system event handler (`hsa_amd_register_system_event_handler`).
unsafe extern "C" fn system_event(event: *const hsa::SystemEvent, _data: *mut c_void) -> c_int {
    if event.is_null() {
        return HSA_ERROR;
    }
    // SAFETY: the runtime passes a live event; only the memory-fault layout is read, and only
    // for that event type.
    let e = unsafe { &*event };
    if e.event_type != hsa::MEMORY_FAULT_EVENT {
        return HSA_ERROR;
    }
    let reasons: Vec<&str> = [
        (1u32, "page not present or supervisor privilege"),
        (1 << 1, "write to a read-only page"),
        (1 << 2, "execution of a page marked NX"),
        (1 << 3, "a host-only page"),
        (1 << 4, "DRAM ECC failure"),
        (1 << 5, "imprecise address"),
        (1 << 6, "SRAM ECC failure"),
        (1 << 31, "GPU reset after a hang"),
    ]
    .into_iter()
    .filter(|(bit, _)| e.fault_reason_mask & bit != 0)
    .map(|(_, why)| why)
    .collect();
    let text = format!(
        "memory access fault by the GPU at address {:#x} ({})",
        e.virtual_address,
        if reasons.is_empty() {
            "no reason given".to_string()
        } else {
            reasons.join(", ")
        }
    );
    offload_core::sync::lock(&FAULTS).push((e.agent, text));
    hsa::SUCCESS
}

/// Installs the system event handler (once per process).
pub fn handle_memory_faults(hsa: &Hsa) -> Result<()> {
    static DONE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: a plain extern "C" handler that uses no data; it lives for the process.
        unsafe { hsa.hsa_amd_register_system_event_handler(system_event, std::ptr::null_mut()) }
            .map_err(|e| e.message().to_string())
    })
    .clone()
    .map_err(|e| {
        Error::DeviceFailure(format!(
            "the HSA runtime would end the process on a GPU memory fault: its system event \
             handler cannot be installed ({e})"
        ))
    })
}

/// The memory pools of a GPU agent and the CPU agent next to it.
#[derive(Debug, Clone, Copy)]
pub struct Pools {
    /// The GPU's coarse-grained global pool.
    pub device: Handle,
    /// Its size in bytes.
    pub device_bytes: u64,
    /// A fine-grained pool of the CPU (pinned host memory the GPU can reach).
    pub host: Handle,
    /// The CPU pool kernel arguments are allocated from.
    pub kernarg: Handle,
    /// LDS bytes a work-group may have (the GPU's group-segment pool).
    pub lds: u32,
}

/// An HSA queue, with the error its callback recorded.
pub struct HsaQueue {
    queue: *mut Queue,
    /// 0, or the status the runtime reported for the queue.
    error: Box<AtomicI32>,
    hsa: Arc<Hsa>,
}

impl std::fmt::Debug for HsaQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HsaQueue({:p})", self.queue)
    }
}

unsafe extern "C" fn queue_error(status: c_int, _queue: *mut Queue, data: *mut c_void) {
    // SAFETY: `data` is the queue's boxed flag, which outlives the queue.
    let flag = unsafe { &*data.cast::<AtomicI32>() };
    flag.store(status, Ordering::Release);
}

impl HsaQueue {
    fn create(hsa: &Arc<Hsa>, agent: Handle, max: u32) -> Result<HsaQueue> {
        let error = Box::new(AtomicI32::new(0));
        let mut queue: *mut Queue = std::ptr::null_mut();
        let size = QUEUE_PACKETS.min(max.max(1).next_power_of_two());
        // SAFETY: live out-pointer; the callback's data is the boxed flag, which lives as long
        // as the queue (dropped after `hsa_queue_destroy`).
        unsafe {
            hsa.hsa_queue_create(
                agent,
                size,
                aql::QUEUE_TYPE_MULTIPLE,
                Some(queue_error),
                (&*error as *const AtomicI32).cast_mut().cast(),
                u32::MAX,
                u32::MAX,
                &mut queue,
            )?
        };
        if queue.is_null() {
            return Err(Error::Driver {
                code: 0,
                message: "hsa_queue_create returned no queue".into(),
            });
        }
        Ok(HsaQueue {
            queue,
            error,
            hsa: hsa.clone(),
        })
    }

    fn failed(&self) -> Option<Error> {
        match self.error.load(Ordering::Acquire) {
            0 => None,
            status => Some(
                self.hsa
                    .check(status, "the device's queue")
                    .err()
                    .unwrap_or_else(|| Error::DeviceFailure(format!("queue status {status:#x}")))
                    // The runtime's status says what went wrong (a memory fault, a trap, an
                    // illegal instruction, too much LDS, a bad packet...); not guessed here.
                    .context("the GPU reported an error while running the queue's work; the queue is unusable"),
            ),
        }
    }
}

impl Drop for HsaQueue {
    fn drop(&mut self) {
        // SAFETY: a queue we created, destroyed once, after its last operation was waited for.
        let _ = unsafe { self.hsa.hsa_queue_destroy(self.queue) };
    }
}

// SAFETY: an HSA queue may be used from any thread (it is a multi-producer queue; writers
// reserve slots atomically).
unsafe impl Send for HsaQueue {}
// SAFETY: see above.
unsafe impl Sync for HsaQueue {}

/// A loaded code object: its executable, reader and metadata.
pub struct Program {
    executable: Handle,
    reader: Handle,
    metadata: Metadata,
    hsa: Arc<Hsa>,
    /// The bytes the reader reads from (kept until it is destroyed).
    _image: Vec<u8>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Program({} kernels)", self.metadata.kernels.len())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: destroyed once, after the last launch that used it (the layer holds it).
        unsafe {
            let _ = self.hsa.hsa_executable_destroy(self.executable);
            let _ = self.hsa.hsa_code_object_reader_destroy(self.reader);
        }
    }
}

/// A kernel: its descriptor and what the metadata says of its arguments.
#[derive(Debug)]
pub struct Kernel {
    object: u64,
    group_segment_size: u32,
    private_segment_size: u32,
    meta: metadata::Kernel,
}

/// See the module docs.
pub struct AmdDevice {
    hsa: Arc<Hsa>,
    agent: Handle,
    cpu: Handle,
    pools: Pools,
    target: TargetId,
    info: DeviceInfo,
    queue_max: u32,
    /// The queue for work that is not on a queue of the layer (created on first use, replaced
    /// after an error).
    own_queue: Mutex<Option<Arc<HsaQueue>>>,
    reuse: Reuse,
}

/// Idle completion signals and kernel-argument areas (`(size, address)`, the agent already
/// allowed access) of a device, for the next operation. Only what a completed operation used
/// comes back here: after a failed wait the GPU may still write the signal or read the area (a
/// fault fails every wait of the device, while kernels of other queues may still be running),
/// so those are left allocated, never destroyed nor reused: a few bytes lost per failed
/// operation of a device that has failed, against the GPU writing into memory given to another
/// use. At most [`KEEP_IDLE`] of each are kept; a
/// kernarg area beyond that replaces the one idle longest.
#[derive(Debug, Default)]
struct Reuse {
    signals: Mutex<Vec<Handle>>,
    kernargs: Mutex<Vec<(usize, usize)>>,
}

impl Drop for AmdDevice {
    fn drop(&mut self) {
        // SAFETY: idle signals and areas: no operation uses them any more.
        unsafe {
            for s in offload_core::sync::lock(&self.reuse.signals).drain(..) {
                let _ = self.hsa.hsa_signal_destroy(s);
            }
            for (_, area) in offload_core::sync::lock(&self.reuse.kernargs).drain(..) {
                let _ = self.hsa.hsa_amd_memory_pool_free(area as *mut c_void);
            }
        }
    }
}

impl std::fmt::Debug for AmdDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AmdDevice({}, {})", self.info.name, self.target)
    }
}

/// Reads a fixed-size attribute with `get`.
fn attribute<T: Default>(get: impl FnOnce(*mut c_void) -> Result<()>) -> Result<T> {
    let mut v = T::default();
    get((&mut v as *mut T).cast())?;
    Ok(v)
}

fn c_string(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_string()
}

impl AmdDevice {
    /// Opens GPU agent `agent` (with CPU agent `cpu` and their pools).
    pub fn open(hsa: Arc<Hsa>, agent: Handle, cpu: Handle, pools: Pools) -> Result<AmdDevice> {
        let get = |attr: i32, out: *mut c_void| {
            // SAFETY: every caller passes a live out-buffer of the attribute's documented size.
            unsafe { hsa.hsa_agent_get_info(agent, attr, out) }
        };
        let mut name = [0u8; 64];
        get(agent_info::NAME, name.as_mut_ptr().cast())?;
        let mut product = [0u8; 64];
        get(agent_info::PRODUCT_NAME, product.as_mut_ptr().cast())?;
        let isa = isa_name(&hsa, agent)?;
        let target = TargetId::from_isa_name(&isa).map_err(|e| e.context("the device's ISA"))?;
        let wavefront: u32 = attribute(|p| get(agent_info::WAVEFRONT_SIZE, p))?;
        let max_wg: u32 = attribute(|p| get(agent_info::WORKGROUP_MAX_SIZE, p))?;
        let wg_dim: [u16; 3] = attribute(|p| get(agent_info::WORKGROUP_MAX_DIM, p))?;
        let grid_dim: [u32; 3] = attribute(|p| get(agent_info::GRID_MAX_DIM, p))?;
        let cus: u32 = attribute(|p| get(agent_info::COMPUTE_UNIT_COUNT, p))?;
        let queue_max: u32 = attribute(|p| get(agent_info::QUEUE_MAX_SIZE, p))?;
        let product = c_string(&product);
        let info = DeviceInfo {
            name: if product.is_empty() {
                c_string(&name)
            } else {
                product
            },
            compute_unit_kind: target.processor.clone(),
            target_features: target.llvm_features(),
            total_memory: pools.device_bytes,
            compute_units: cus,
            limits: DeviceLimits {
                max_grid: grid_dim,
                max_block: wg_dim.map(u32::from),
                max_threads_per_block: max_wg,
                warp_size: wavefront,
            },
        };
        Ok(AmdDevice {
            hsa,
            agent,
            cpu,
            pools,
            target,
            info,
            queue_max,
            own_queue: Mutex::new(None),
            reuse: Reuse::default(),
        })
    }

    /// The device's target id (`gfx90a:sramecc+:xnack-`).
    pub fn target(&self) -> &TargetId {
        &self.target
    }

    /// A completion signal at 1: an idle one of the device's, else a new one.
    fn signal(&self) -> Result<Signal<'_>> {
        let idle = offload_core::sync::lock(&self.reuse.signals).pop();
        let handle = match idle {
            Some(s) => {
                // SAFETY: an idle signal of ours, nothing waits on or writes it.
                if let Err(e) = unsafe { self.hsa.hsa_signal_store_screlease(s, 1) } {
                    // SAFETY: as above; it is not handed out.
                    let _ = unsafe { self.hsa.hsa_signal_destroy(s) };
                    return Err(e);
                }
                s
            }
            None => {
                let mut s: Handle = 0;
                // SAFETY: live out-pointer; no consumer list.
                unsafe { self.hsa.hsa_signal_create(1, 0, std::ptr::null(), &mut s)? };
                s
            }
        };
        Ok(Signal {
            device: self,
            handle,
            completed: false,
        })
    }

    /// A kernarg area of exactly `len` bytes the agent can read: an idle one, else a new one.
    fn kernarg_area(&self, len: usize) -> Result<*mut c_void> {
        {
            let mut idle = offload_core::sync::lock(&self.reuse.kernargs);
            if let Some(i) = idle.iter().position(|(n, _)| *n == len) {
                return Ok(idle.swap_remove(i).1 as *mut c_void);
            }
        }
        let mut area: *mut c_void = std::ptr::null_mut();
        // SAFETY: live out-pointer.
        unsafe {
            self.hsa
                .hsa_amd_memory_pool_allocate(self.pools.kernarg, len, 0, &mut area)?
        };
        // SAFETY: the kernarg allocation just made.
        let access = unsafe {
            self.hsa
                .hsa_amd_agents_allow_access(1, &self.agent, std::ptr::null(), area)
        };
        if let Err(e) = access {
            // SAFETY: allocated above, never used.
            let _ = unsafe { self.hsa.hsa_amd_memory_pool_free(area) };
            return Err(e);
        }
        Ok(area)
    }

    /// Gives back a kernarg area: kept for reuse if the dispatch that read it completed,
    /// else left allocated (see [`Reuse`]).
    fn kernarg_done(&self, len: usize, area: *mut c_void, completed: bool) {
        if completed {
            let mut idle = offload_core::sync::lock(&self.reuse.kernargs);
            // Full: the area idle longest goes (a size no launch uses any more must not keep
            // the others from being reused).
            let evicted = (idle.len() >= KEEP_IDLE).then(|| idle.remove(0).1);
            idle.push((len, area as usize));
            drop(idle);
            if let Some(old) = evicted {
                // SAFETY: an idle area: no dispatch reads it.
                let _ = unsafe { self.hsa.hsa_amd_memory_pool_free(old as *mut c_void) };
            }
        }
        // Not completed: left allocated.
    }

    /// Waits until `signal` drops below 1 (then it is marked completed, free for reuse), or
    /// `queue` reports an error.
    fn wait(&self, signal: &mut Signal<'_>, queue: Option<&HsaQueue>, what: &str) -> Result<()> {
        loop {
            // SAFETY: a live signal of ours.
            let v = unsafe {
                self.hsa.hsa_signal_wait_scacquire(
                    signal.handle,
                    aql::CONDITION_LT,
                    1,
                    WAIT_HINT,
                    aql::WAIT_BLOCKED,
                )?
            };
            if v < 1 {
                signal.completed = true;
                return Ok(());
            }
            if let Some(e) = self.fault() {
                return Err(e.context(what.to_string()));
            }
            if let Some(e) = queue.and_then(HsaQueue::failed) {
                return Err(e.context(what.to_string()));
            }
        }
    }

    /// Copies `len` bytes with the DMA engines, `host` (if any) locked for the agent meanwhile.
    fn dma(
        &self,
        dst: *mut c_void,
        dst_agent: Handle,
        src: *const c_void,
        src_agent: Handle,
        len: usize,
    ) -> Settled<()> {
        let mut signal = match self.signal() {
            Ok(s) => s,
            Err(e) => return (Err(e), true),
        };
        // SAFETY: both ranges are valid for `len` bytes and reachable by the agents named (the
        // caller locked host memory); the signal lives until the copy has completed.
        let submitted = unsafe {
            self.hsa.hsa_amd_memory_async_copy(
                dst,
                dst_agent,
                src,
                src_agent,
                len,
                0,
                std::ptr::null(),
                signal.handle,
            )
        };
        if let Err(e) = submitted {
            // Never submitted: nothing uses the signal.
            signal.completed = true;
            return (Err(e), true);
        }
        let out = self.wait(&mut signal, None, "copy");
        (out, signal.completed)
    }

    /// Runs `f` with `host..host+len` reachable by the agent; `f` gets the agent's address of
    /// it (see [`HOST_LOCKS`]). Memory the runtime allocated (pinned host and shared memory) is
    /// used where it is (the runtime refuses to lock it), made accessible to this agent first
    /// if it is not yet; memory this plugin has locked for this agent (another thread's copy)
    /// is used under that lock, counted, so that it stays locked until the last such copy has
    /// finished; memory locked by someone else (the application) is used if this agent may
    /// reach it; other memory is locked for the copy and unlocked after it. Memory the runtime
    /// cannot lock (read-only pages: the kernel driver registers host memory for writing) is
    /// copied through a pinned staging buffer. `f` copies from the memory (the source of a
    /// copy to the device: a DMA that does not settle may still read it, never write it), and
    /// also says whether its copy is settled (completed, or never started); what an unsettled
    /// copy used (a lock, a staging buffer) is left as it is, since the DMA engine may still be
    /// at it.
    fn with_locked<T>(
        &self,
        host: *mut c_void,
        len: usize,
        f: impl FnOnce(*mut c_void) -> Settled<T>,
    ) -> Result<T> {
        let start = host as usize;
        let end = start.saturating_add(len.max(1));
        let mut locks = offload_core::sync::lock(&HOST_LOCKS);
        let agent_ptr = loop {
            if let Some(l) = locks
                .iter_mut()
                .find(|l| l.agent == self.agent && l.start <= start && end <= l.end)
            {
                l.users += 1;
                break l.agent_ptr + (start - l.start);
            }
            if locks.iter().any(|l| l.start < end && start < l.end) {
                // Locked by another copy for another agent, or only in part: the runtime
                // locks a page once, so wait for that lock to go.
                locks = offload_core::sync::wait(&HOST_UNLOCKED, locks);
                continue;
            }
            let (info, reachable) = self.pointer_info(host)?;
            let inside = !info.agent_base.is_null()
                && start >= info.host_base as usize
                && end <= (info.host_base as usize).saturating_add(info.size_in_bytes);
            // Where the agent addresses `host` in memory the runtime knows.
            let agent_address = || {
                info.agent_base
                    .cast::<u8>()
                    .wrapping_add(start - info.host_base as usize)
                    .cast()
            };
            if inside && info.kind == hsa::pointer_type::HSA {
                drop(locks);
                if !reachable {
                    // SAFETY: memory the runtime allocated, live (the copy's contract).
                    unsafe {
                        self.hsa.hsa_amd_agents_allow_access(
                            1,
                            &self.agent,
                            std::ptr::null(),
                            info.host_base,
                        )?
                    };
                }
                return settle(f(agent_address()));
            }
            if info.kind == hsa::pointer_type::LOCKED {
                // Not locked by this plugin (its locks are in the table): the application's.
                drop(locks);
                if !inside || !reachable {
                    return Err(Error::InvalidArgument(format!(
                        "host memory at {host:p} ({len} bytes) is locked by another part of \
                         the process {}; this plugin cannot lock it again for {}",
                        if inside {
                            "for other GPUs only"
                        } else {
                            "in a range that does not hold all of it"
                        },
                        self.info.name
                    )));
                }
                return settle(f(agent_address()));
            }
            let mut agent = self.agent;
            let mut agent_ptr: *mut c_void = std::ptr::null_mut();
            // SAFETY: `host` is valid for `len` bytes (the copy's contract); unlocked by the
            // last copy that uses the lock.
            let locked = unsafe {
                self.hsa
                    .hsa_amd_memory_lock(host, len, &mut agent, 1, &mut agent_ptr)
            };
            if let Err(e) = locked {
                drop(locks);
                return self.staged(host, len, f).map_err(|staging| {
                    e.context(format!(
                        "the host memory at {host:p} ({len} bytes) cannot be locked, nor \
                         staged ({})",
                        staging.message()
                    ))
                })?;
            }
            locks.push(HostLock {
                start,
                end,
                agent: self.agent,
                agent_ptr: agent_ptr as usize,
                users: 1,
            });
            break agent_ptr as usize;
        };
        drop(locks);
        // Released when dropped, also if `f` panics (then as unsettled).
        let mut using = HostLockUse {
            device: self,
            start,
            end,
            settled: false,
        };
        let (out, settled) = f(agent_ptr as *mut c_void);
        using.settled = settled;
        settle((out, settled))
    }

    /// Copies `len` bytes from device memory `src` to `host`, whatever memory it is: the DMA
    /// fills a pinned staging buffer and the CPU copies the bytes out
    /// ([`offload_plugin_common::staging`]). The program has `host` back when the call
    /// returns, settled or not (a `&mut [T]` it lent, its pinned memory too), so the DMA never
    /// writes it: a DMA that does not settle leaves the staging buffer for good instead.
    fn copy_to_host(&self, host: *mut c_void, src: *const c_void, len: usize) -> Result<()> {
        // SAFETY: `host` is writable for `len` bytes (the copy's contract).
        unsafe {
            offload_plugin_common::staging::copy_to_host_via(
                self,
                host.cast(),
                len,
                |at, offset, n| {
                    // `src + offset` stays inside the copy's source (its contract).
                    let from = src.cast::<u8>().wrapping_add(offset).cast();
                    settle(self.dma(at.cast(), self.cpu, from, self.agent, n))
                },
            )
        }
    }

    /// Runs `f` on a pinned copy of `host..host+len` (the source of a copy to the device): host
    /// memory as `alloc` gives it (the CPU's pool, accessible to the agent), freed after. The
    /// outer error is the staging's own; the inner, `f`'s.
    fn staged<T>(
        &self,
        host: *mut c_void,
        len: usize,
        f: impl FnOnce(*mut c_void) -> Settled<T>,
    ) -> Result<Result<T>> {
        let staging = self.alloc(len as u64, MemoryKind::Host)?;
        let at = staging.0 as *mut c_void;
        // SAFETY: the allocation just made, `len` bytes; `host` is readable for `len` bytes
        // (the copy's contract) and does not overlap it.
        unsafe { std::ptr::copy_nonoverlapping(host.cast::<u8>(), at.cast(), len) };
        let (out, settled) = f(at);
        if settled {
            // The copy has completed (or never started): nothing reads it.
            self.free(staging, len as u64, MemoryKind::Host);
        }
        Ok(settle((out, settled)))
    }

    /// What the runtime knows of `host`, and whether this agent may reach it.
    fn pointer_info(&self, host: *mut c_void) -> Result<(hsa::PointerInfo, bool)> {
        let mut info = hsa::PointerInfo::default();
        let (mut count, mut agents): (u32, *mut Handle) = (0, std::ptr::null_mut());
        // SAFETY: a live out-structure with its size set; the agent list is allocated with
        // malloc (the callback) and freed here.
        unsafe {
            self.hsa.hsa_amd_pointer_info(
                host,
                &mut info,
                libc::malloc as *const c_void,
                &mut count,
                &mut agents,
            )?;
        }
        let reachable = !agents.is_null()
            // SAFETY: `count` agents, allocated by the callback.
            && unsafe { std::slice::from_raw_parts(agents, count as usize) }.contains(&self.agent);
        // SAFETY: allocated by malloc (or null).
        unsafe { libc::free(agents.cast()) };
        Ok((info, reachable))
    }

    /// The memory fault the runtime reported for this device, if any: the GPU's state is lost.
    fn fault(&self) -> Option<Error> {
        let faults = offload_core::sync::lock(&FAULTS);
        let (_, text) = faults.iter().find(|(agent, _)| *agent == self.agent)?;
        Some(Error::DeviceFailure(format!(
            "{} on {}: the device's work is lost; restart the process",
            text, self.info.name
        )))
    }

    /// The kernel's LDS: its static part and its `dynamic_shared_pointer` arguments (the
    /// layer's one layout and budget of work-group memory, `args::LocalMemory`).
    fn lds(k: &Kernel) -> offload_plugin_common::args::LocalMemory {
        offload_plugin_common::args::LocalMemory {
            name: "LDS",
            fixed: u64::from(k.group_segment_size.max(k.meta.group_segment_fixed_size)),
            pointers: k
                .meta
                .explicit_args()
                .enumerate()
                .filter_map(|(i, param)| match param.kind {
                    ArgKind::DynamicShared { align } => Some((i, u64::from(align))),
                    _ => None,
                })
                .collect(),
            min_size: 0,
        }
    }

    /// Writes one dispatch packet to `queue`, rings its doorbell and waits for it; whether it
    /// completed (else the GPU may still be reading what the packet points to).
    fn dispatch(&self, queue: &HsaQueue, packet: DispatchPacket, name: &str) -> (Result<()>, bool) {
        if let Some(e) = self.fault() {
            return (Err(e), true);
        }
        if let Some(e) = queue.failed() {
            return (Err(e), true);
        }
        let mut signal = match self.signal() {
            Ok(s) => s,
            Err(e) => return (Err(e), true),
        };
        let mut packet = packet;
        packet.completion_signal = signal.handle;
        let mut published = false;
        let submitted = (|| {
            // SAFETY: `queue.queue` is a live queue; the slot reserved by the write-index
            // increment is ours until the packet processor consumes it; the header is published
            // last with release ordering, as the AQL protocol requires.
            unsafe {
                let q = &*queue.queue;
                let index = self.hsa.hsa_queue_add_write_index_relaxed(queue.queue, 1)?;
                while index - self.hsa.hsa_queue_load_read_index_scacquire(queue.queue)?
                    >= u64::from(q.size)
                {
                    std::thread::yield_now();
                }
                let slot = q
                    .base_address
                    .cast::<DispatchPacket>()
                    .add((index % u64::from(q.size)) as usize);
                // Body first (everything after the first 32 bits), then header + setup at once.
                let body = std::ptr::addr_of_mut!((*slot).workgroup_size).cast::<u8>();
                let from = std::ptr::addr_of!(packet.workgroup_size).cast::<u8>();
                std::ptr::copy_nonoverlapping(
                    from,
                    body,
                    std::mem::size_of::<DispatchPacket>() - 4,
                );
                let header = u32::from(packet.header) | u32::from(packet.setup) << 16;
                AtomicU32::from_ptr(slot.cast::<u32>()).store(header, Ordering::Release);
                published = true;
                self.hsa
                    .hsa_signal_store_relaxed(q.doorbell_signal, index as i64)?;
            }
            Ok(())
        })();
        if let Err(e) = submitted {
            // Unless the packet was published, the GPU reads neither the signal nor what the
            // packet points to.
            signal.completed = !published;
            return (Err(e), !published);
        }
        let result = self.wait(&mut signal, Some(queue), &format!("kernel '{name}'"));
        let completed = signal.completed;
        (result, completed)
    }

    /// The kernel argument bytes of a launch, laid out as the metadata says; `lds` is where
    /// each `dynamic_shared_pointer` argument's LDS starts ([`AmdDevice::lds`]).
    fn kernargs(
        &self,
        k: &Kernel,
        dims: &LaunchDims,
        args: &[KernelArg],
        lds: &[(usize, u64)],
        queue: *mut Queue,
        ndims: u16,
    ) -> Result<Vec<u8>> {
        let meta = &k.meta;
        let mut bytes = vec![0u8; (meta.kernarg_segment_size as usize).max(16)];
        let mut put = |offset: u32, size: u32, value: u64| {
            let at = offset as usize;
            let n = (size as usize).min(8);
            bytes[at..at + n].copy_from_slice(&value.to_le_bytes()[..n]);
        };
        for (i, (arg, value)) in meta.explicit_args().zip(args).enumerate() {
            // An LDS argument gets its offset in the work-group's LDS, not the size passed.
            let bits = match lds.iter().find(|(j, _)| *j == i) {
                Some((_, offset)) => *offset,
                None => value.to_bits().1,
            };
            put(arg.offset, arg.size, bits);
        }
        for arg in &meta.args {
            let ArgKind::Hidden(kind) = &arg.kind else {
                continue;
            };
            // `_x`, `_y`, `_z` → 0, 1, 2.
            let axis = |k: &str| match k.as_bytes().last() {
                Some(b'x') => Some(0),
                Some(b'y') => Some(1),
                Some(b'z') => Some(2),
                _ => None,
            };
            let value: u64 = match kind.as_str() {
                k if k.starts_with("hidden_block_count_") => {
                    axis(k).map_or(0, |d| u64::from(dims.grid[d]))
                }
                k if k.starts_with("hidden_group_size_") => {
                    axis(k).map_or(0, |d| u64::from(dims.block[d]))
                }
                k if k.starts_with("hidden_remainder_")
                    || k.starts_with("hidden_global_offset_") =>
                {
                    0
                }
                "hidden_grid_dims" => u64::from(ndims),
                "hidden_dynamic_lds_size" => u64::from(dims.shared_mem_bytes),
                "hidden_queue_ptr" => queue as u64,
                // Runtime services (printf and hostcall buffers, device-side enqueue, heap,
                // multi-grid sync) are not provided: 0, which a kernel that does not use them
                // never reads.
                _ => 0,
            };
            put(arg.offset, arg.size, value);
        }
        Ok(bytes)
    }
}

/// A completion signal of a device: back to the device's idle signals on drop once an
/// operation has completed through it (or was never given it); else left as it is (see
/// [`Reuse`]), or destroyed when the idle ones are full.
struct Signal<'a> {
    device: &'a AmdDevice,
    handle: Handle,
    /// The operation it was given to has completed (or was never submitted).
    completed: bool,
}

impl Drop for Signal<'_> {
    fn drop(&mut self) {
        if !self.completed {
            // Left as it is: the GPU may still write it.
            return;
        }
        let mut idle = offload_core::sync::lock(&self.device.reuse.signals);
        if idle.len() < KEEP_IDLE {
            idle.push(self.handle);
            return;
        }
        drop(idle);
        // SAFETY: a signal we created whose operation completed: nothing writes it any more.
        let _ = unsafe { self.device.hsa.hsa_signal_destroy(self.handle) };
    }
}

/// The agent's ISA name (`amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-`).
pub fn isa_name(hsa: &Hsa, agent: Handle) -> Result<String> {
    unsafe extern "C" fn first(isa: Handle, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Option<Handle>` below.
        unsafe { *data.cast::<Option<Handle>>() = Some(isa) };
        hsa::INFO_BREAK
    }
    let mut isa: Option<Handle> = None;
    // SAFETY: the callback writes the first ISA into `isa`, which outlives the call.
    unsafe { hsa.hsa_agent_iterate_isas(agent, first, (&mut isa as *mut Option<Handle>).cast())? };
    let isa = isa.ok_or_else(|| Error::Driver {
        code: 0,
        message: "the GPU agent reports no ISA".into(),
    })?;
    let len: u32 = attribute(|p| {
        // SAFETY: a u32 out-value.
        unsafe { hsa.hsa_isa_get_info_alt(isa, agent_info::ISA_NAME_LENGTH, p) }
    })?;
    let mut name = vec![0u8; (len as usize).clamp(1, 4096) + 1];
    // SAFETY: the buffer holds the name and its terminator.
    unsafe { hsa.hsa_isa_get_info_alt(isa, agent_info::ISA_NAME, name.as_mut_ptr().cast())? };
    Ok(c_string(&name))
}

/// The pools of a GPU agent and its CPU agent, or `None` if one the plugin needs is missing.
pub fn find_pools(hsa: &Hsa, gpu: Handle, cpu: Handle) -> Result<Option<Pools>> {
    #[derive(Default)]
    struct Found {
        device: Option<(Handle, u64)>,
        host: Option<Handle>,
        kernarg: Option<Handle>,
        host_is_kernarg: bool,
        lds: Option<u32>,
        hsa: usize,
    }
    unsafe extern "C" fn visit(pool: Handle, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Found` below, whose `hsa` is the address of a live `Hsa`.
        let found = unsafe { &mut *data.cast::<Found>() };
        // SAFETY: as above.
        let hsa = unsafe { &*(found.hsa as *const Hsa) };
        let get = |attr: i32, out: *mut c_void| {
            // SAFETY: out-values of the attribute's size.
            unsafe { hsa.hsa_amd_memory_pool_get_info(pool, attr, out) }.is_ok()
        };
        let (mut segment, mut flags, mut size, mut alloc) = (u32::MAX, 0u32, 0usize, false);
        if get(pool_info::SEGMENT, (&mut segment as *mut u32).cast())
            && segment == pool_info::SEGMENT_GROUP
        {
            get(pool_info::SIZE, (&mut size as *mut usize).cast());
            found.lds = u32::try_from(size).ok().filter(|n| *n > 0);
            return hsa::SUCCESS;
        }
        if segment != pool_info::SEGMENT_GLOBAL
            || !get(pool_info::GLOBAL_FLAGS, (&mut flags as *mut u32).cast())
            || !get(
                pool_info::RUNTIME_ALLOC_ALLOWED,
                (&mut alloc as *mut bool).cast(),
            )
            || !alloc
        {
            return hsa::SUCCESS;
        }
        get(pool_info::SIZE, (&mut size as *mut usize).cast());
        if flags & pool_info::FLAG_COARSE_GRAINED != 0 && found.device.is_none() {
            found.device = Some((pool, size as u64));
        }
        if flags & pool_info::FLAG_KERNARG_INIT != 0 && found.kernarg.is_none() {
            found.kernarg = Some(pool);
        }
        // Pinned host memory from a fine-grained pool that is not the kernarg pool (ROCr marks
        // kernarg system memory uncached): that one only if there is no other.
        if flags & pool_info::FLAG_FINE_GRAINED != 0
            && (found.host.is_none()
                || (flags & pool_info::FLAG_KERNARG_INIT == 0 && found.host_is_kernarg))
        {
            found.host = Some(pool);
            found.host_is_kernarg = flags & pool_info::FLAG_KERNARG_INIT != 0;
        }
        hsa::SUCCESS
    }
    let mut gpu_found = Found {
        hsa: hsa as *const Hsa as usize,
        ..Found::default()
    };
    let mut cpu_found = Found {
        hsa: hsa as *const Hsa as usize,
        ..Found::default()
    };
    // SAFETY: the callbacks write into the `Found`s, which outlive the calls.
    unsafe {
        hsa.hsa_amd_agent_iterate_memory_pools(gpu, visit, (&mut gpu_found as *mut Found).cast())?;
        hsa.hsa_amd_agent_iterate_memory_pools(cpu, visit, (&mut cpu_found as *mut Found).cast())?;
    }
    Ok(
        match (gpu_found.device, cpu_found.host, cpu_found.kernarg) {
            (Some((device, device_bytes)), Some(host), Some(kernarg)) => Some(Pools {
                device,
                device_bytes,
                host,
                kernarg,
                lds: gpu_found.lds.unwrap_or(DEFAULT_LDS),
            }),
            _ => None,
        },
    )
}

impl DeviceBackend for AmdDevice {
    type Program = Program;
    type Kernel = Kernel;
    type Stream = HsaQueue;

    fn info(&self) -> Result<DeviceInfo> {
        Ok(self.info.clone())
    }

    fn jit_target(&self) -> Option<(JitTarget, PostProcess)> {
        Some((
            JitTarget {
                triple: TRIPLE.into(),
                cpu: self.target.processor.clone(),
                features: self.target.llvm_features(),
            },
            PostProcess::for_target(TRIPLE, &self.target.processor, None),
        ))
    }

    fn fits(&self, arch: &str) -> Fit {
        if arch.is_empty() {
            return Fit::Compatible;
        }
        match TargetId::from_isa_name(arch) {
            Ok(id) if id == self.target => Fit::Exact,
            Ok(id) => match id.runs_on(&self.target) {
                Ok(()) => Fit::Compatible,
                Err(e) => Fit::No(e.message().to_string()),
            },
            Err(_) => Fit::No(format!("'{arch}' is not an AMD GPU target")),
        }
    }

    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()> {
        match kind {
            ImageKind::Elf(info) => {
                code_object_target(info, image.get(8).copied().unwrap_or(0))?.runs_on(&self.target)
            }
            other => Err(Error::InvalidImage(format!(
                "a {} is not an AMD code object",
                other.describe()
            ))),
        }
    }

    fn load(&self, image: &[u8], kind: &ImageKind) -> Result<Program> {
        self.check_native(image, kind)?;
        let metadata = metadata::read(image)?;
        let image = image.to_vec();
        let mut reader: Handle = 0;
        // SAFETY: `image` stays alive (in the Program) until the reader is destroyed.
        unsafe {
            self.hsa.hsa_code_object_reader_create_from_memory(
                image.as_ptr().cast(),
                image.len(),
                &mut reader,
            )?
        };
        let mut executable: Handle = 0;
        // SAFETY: live out-pointer; an empty option string.
        if let Err(e) = unsafe {
            self.hsa.hsa_executable_create_alt(
                aql::PROFILE_FULL,
                aql::ROUNDING_DEFAULT,
                c"".as_ptr(),
                &mut executable,
            )
        } {
            // SAFETY: the reader created above.
            let _ = unsafe { self.hsa.hsa_code_object_reader_destroy(reader) };
            return Err(e);
        }
        let program = Program {
            executable,
            reader,
            metadata,
            hsa: self.hsa.clone(),
            _image: image,
        };
        // SAFETY: the executable and reader above (freed by `program`'s drop on error).
        unsafe {
            self.hsa.hsa_executable_load_agent_code_object(
                executable,
                self.agent,
                reader,
                c"".as_ptr(),
                std::ptr::null_mut(),
            )?;
            self.hsa.hsa_executable_freeze(executable, c"".as_ptr())?;
        }
        Ok(program)
    }

    fn kernel(&self, program: &Program, name: &str) -> Result<(Kernel, Option<Vec<ParamType>>)> {
        let meta = program.metadata.kernel(name).ok_or_else(|| {
            let names: Vec<&str> = program
                .metadata
                .kernels
                .iter()
                .map(|k| k.name.as_str())
                .collect();
            Error::NotFound(format!(
                "kernel '{name}' is not in the code object (it has: {})",
                if names.is_empty() {
                    "no kernels".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })?;
        if let Some(a) = meta
            .args
            .iter()
            .find(|a| matches!(a.kind, ArgKind::Other(_)))
        {
            return Err(Error::Unsupported(format!(
                "kernel '{name}' takes an argument of kind '{}' (offset {}), which this plugin cannot pass",
                a.value_kind, a.offset
            )));
        }
        let symbol = CString::new(meta.symbol.as_str()).map_err(|_| {
            Error::InvalidImage(format!("kernel '{name}': its symbol name contains NUL"))
        })?;
        let mut s: Handle = 0;
        // SAFETY: a frozen executable; live name and out-pointer.
        unsafe {
            self.hsa.hsa_executable_get_symbol_by_name(
                program.executable,
                symbol.as_ptr(),
                &self.agent,
                &mut s,
            )
        }
        .map_err(|e| e.context(format!("kernel '{name}' ({})", meta.symbol)))?;
        let get = |attr: i32, out: *mut c_void| {
            // SAFETY: every caller passes an out-value of the attribute's size.
            unsafe { self.hsa.hsa_executable_symbol_get_info(s, attr, out) }
        };
        let object: u64 = attribute(|p| get(symbol_info::KERNEL_OBJECT, p))?;
        let group_segment_size: u32 = attribute(|p| get(symbol_info::GROUP_SEGMENT_SIZE, p))?;
        let private_segment_size: u32 = attribute(|p| get(symbol_info::PRIVATE_SEGMENT_SIZE, p))?;
        let kernarg_size: u32 = attribute(|p| get(symbol_info::KERNARG_SEGMENT_SIZE, p))?;
        if kernarg_size != 0 && kernarg_size < meta.kernarg_segment_size {
            return Err(Error::InvalidImage(format!(
                "kernel '{name}': the runtime says {kernarg_size} bytes of arguments, the metadata {}",
                meta.kernarg_segment_size
            )));
        }
        Ok((
            Kernel {
                object,
                group_segment_size,
                private_segment_size,
                meta: meta.clone(),
            },
            None,
        ))
    }

    fn check_launch(
        &self,
        kernel: &Kernel,
        name: &str,
        dims: &LaunchDims,
        args: &[KernelArg],
    ) -> Result<()> {
        // The code was compiled for at most this many work items per group (OpenCL's default
        // is 256, HIP's `__launch_bounds__` sets it): more would run it outside what it assumes.
        offload_plugin_common::args::check_block(
            name,
            dims.block,
            kernel.meta.max_flat_workgroup_size,
            "its .max_flat_workgroup_size",
        )?;
        let explicit: Vec<&metadata::Arg> = kernel.meta.explicit_args().collect();
        let sizes: Vec<usize> = explicit.iter().map(|a| a.size as usize).collect();
        for (i, (param, arg)) in explicit.iter().zip(args).enumerate() {
            if param.kind == ArgKind::Pointer
                && !matches!(arg, KernelArg::Ptr(_) | KernelArg::Word(_))
            {
                return Err(Error::InvalidArgument(format!(
                    "kernel '{name}' argument {i} is a pointer ({}); the launch passes {}",
                    param.value_kind,
                    arg.type_name()
                )));
            }
        }
        Self::lds(kernel).check(
            name,
            u64::from(dims.shared_mem_bytes),
            args,
            u64::from(self.pools.lds),
            &self.info.name,
        )?;
        offload_plugin_common::args::check_sizes(name, &sizes, args)
    }

    fn global(&self, program: &Program, name: &str) -> Result<GlobalSymbol> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("global name '{name}' contains NUL")))?;
        let mut s: Handle = 0;
        // SAFETY: a frozen executable; live name and out-pointer.
        unsafe {
            self.hsa.hsa_executable_get_symbol_by_name(
                program.executable,
                c.as_ptr(),
                &self.agent,
                &mut s,
            )
        }
        .map_err(|e| e.context(format!("global '{name}' in the code object")))?;
        let get = |attr: i32, out: *mut c_void| {
            // SAFETY: every caller passes an out-value of the attribute's size.
            unsafe { self.hsa.hsa_executable_symbol_get_info(s, attr, out) }
        };
        let address: u64 = attribute(|p| get(symbol_info::VARIABLE_ADDRESS, p))?;
        let size: u32 = attribute(|p| get(symbol_info::VARIABLE_SIZE, p))?;
        Ok(GlobalSymbol {
            ptr: DevicePtr(address),
            size: u64::from(size),
        })
    }

    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr> {
        let bytes = usize::try_from(size)
            .map_err(|_| Error::OutOfMemory(format!("{size} bytes cannot be allocated here")))?;
        let pool = match kind {
            MemoryKind::Device => self.pools.device,
            MemoryKind::Host | MemoryKind::Shared => self.pools.host,
        };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: live out-pointer.
        unsafe {
            self.hsa
                .hsa_amd_memory_pool_allocate(pool, bytes, 0, &mut p)?
        };
        if kind != MemoryKind::Device {
            // Host memory the GPU is to reach must be made accessible to it.
            // SAFETY: the allocation just made.
            if let Err(e) = unsafe {
                self.hsa
                    .hsa_amd_agents_allow_access(1, &self.agent, std::ptr::null(), p)
            } {
                // SAFETY: as above.
                let _ = unsafe { self.hsa.hsa_amd_memory_pool_free(p) };
                return Err(e);
            }
        }
        Ok(DevicePtr(p as u64))
    }

    fn free(&self, ptr: DevicePtr, _size: u64, _kind: MemoryKind) {
        // SAFETY: an allocation of `alloc`, freed once, after the last operation using it.
        let _ = unsafe { self.hsa.hsa_amd_memory_pool_free(ptr.0 as *mut c_void) };
    }

    fn locks_regions(&self) -> bool {
        // Streams order the GPU's work; see the trait.
        false
    }

    fn strict_pointers(&self) -> bool {
        // Memory of another runtime in the process is the caller's to pass; see the trait.
        false
    }

    fn stream_create(&self) -> Result<HsaQueue> {
        HsaQueue::create(&self.hsa, self.agent, self.queue_max)
    }

    fn execute(&self, op: Op<'_, Self>, stream: Option<&HsaQueue>) -> Result<()> {
        if let Some(e) = self.fault() {
            return Err(e);
        }
        match op {
            Op::CopyToDevice { dst, src, len } => self.with_locked(src.0.cast(), len, |host| {
                self.dma(dst.0 as *mut c_void, self.agent, host, self.cpu, len)
            }),
            Op::CopyFromDevice { dst, src, len } => {
                self.copy_to_host(dst.0.cast(), src.0 as *const c_void, len)
            }
            Op::CopyDeviceToDevice { dst, src, len } => {
                let len = usize::try_from(len).map_err(|_| {
                    Error::InvalidArgument(format!("{len} bytes cannot be copied here"))
                })?;
                settle(self.dma(
                    dst.0 as *mut c_void,
                    self.agent,
                    src.0 as *const c_void,
                    self.agent,
                    len,
                ))
            }
            Op::Launch {
                kernel,
                dims,
                args,
                name,
                ..
            } => {
                let mut grid = [0u32; 3];
                for (d, g) in grid.iter_mut().enumerate() {
                    *g = dims.grid[d].checked_mul(dims.block[d]).ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "launch of '{name}': {} blocks of {} work items in dimension {d} exceed the 2^32 work items an AMD GPU dispatch can have",
                            dims.grid[d], dims.block[d]
                        ))
                    })?;
                }
                let ndims: u16 = if grid[2] > 1 {
                    3
                } else if grid[1] > 1 {
                    2
                } else {
                    1
                };
                // Checked against the device's LDS in `check_launch`.
                let (lds, group_segment) =
                    Self::lds(kernel).layout(u64::from(dims.shared_mem_bytes), args);
                let group_segment = u32::try_from(group_segment).unwrap_or(u32::MAX);
                let run = |queue: &HsaQueue| -> Result<()> {
                    let bytes = self.kernargs(kernel, &dims, args, &lds, queue.queue, ndims)?;
                    let area = self.kernarg_area(bytes.len())?;
                    let (result, completed) = (|| {
                        // SAFETY: a kernarg area of `bytes.len()` bytes no dispatch uses.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                bytes.as_ptr(),
                                area.cast::<u8>(),
                                bytes.len(),
                            );
                        }
                        let header = aql::PACKET_TYPE_KERNEL_DISPATCH << aql::HEADER_TYPE
                            | 1 << aql::HEADER_BARRIER
                            | aql::FENCE_SCOPE_SYSTEM << aql::HEADER_ACQUIRE_FENCE_SCOPE
                            | aql::FENCE_SCOPE_SYSTEM << aql::HEADER_RELEASE_FENCE_SCOPE;
                        let mut block = [0u16; 3];
                        for (d, b) in block.iter_mut().enumerate() {
                            match u16::try_from(dims.block[d]) {
                                Ok(v) => *b = v,
                                Err(_) => {
                                    return (
                                        Err(Error::InvalidArgument(format!(
                                            "launch of '{name}': a block of {} work items in \
                                             dimension {d} does not fit a dispatch packet (at \
                                             most 65535)",
                                            dims.block[d]
                                        ))),
                                        true,
                                    );
                                }
                            }
                        }
                        self.dispatch(
                            queue,
                            DispatchPacket {
                                header,
                                setup: ndims << aql::SETUP_DIMENSIONS,
                                workgroup_size: block,
                                grid_size: grid,
                                private_segment_size: kernel
                                    .private_segment_size
                                    .max(kernel.meta.private_segment_fixed_size)
                                    .saturating_add(if kernel.meta.uses_dynamic_stack {
                                        DYNAMIC_STACK
                                    } else {
                                        0
                                    }),
                                group_segment_size: group_segment,
                                kernel_object: kernel.object,
                                kernarg_address: area as u64,
                                ..DispatchPacket::default()
                            },
                            name,
                        )
                    })();
                    self.kernarg_done(bytes.len(), area, completed);
                    // A dispatch that did not complete is settled only if its queue has
                    // stopped (an error halts it: nothing of it runs on); after a memory
                    // fault, or a wait that gave up, the GPU may still run it.
                    settle((result, completed || queue.failed().is_some()))
                };
                match stream {
                    Some(q) => run(q),
                    None => {
                        // The queue is taken out of the lock before the dispatch: synchronous
                        // launches of several threads share it (HSA queues take many writers)
                        // and do not wait for each other's kernels.
                        let queue = {
                            let mut own = offload_core::sync::lock(&self.own_queue);
                            if own.as_ref().is_some_and(|q| q.failed().is_some()) {
                                *own = None;
                            }
                            match &*own {
                                Some(q) => q.clone(),
                                None => {
                                    let q = Arc::new(HsaQueue::create(
                                        &self.hsa,
                                        self.agent,
                                        self.queue_max,
                                    )?);
                                    *own = Some(q.clone());
                                    q
                                }
                            }
                        };
                        run(&queue)
                    }
                }
            }
        }
    }
}

// SAFETY: every HSA handle here may be used from any thread; the queue is guarded by a mutex.
unsafe impl Send for AmdDevice {}
// SAFETY: see above.
unsafe impl Sync for AmdDevice {}
// SAFETY: an executable and a code object reader may be used and destroyed from any thread.
unsafe impl Send for Program {}
// SAFETY: see above.
unsafe impl Sync for Program {}
