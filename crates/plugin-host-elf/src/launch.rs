//! Running a kernel on the host: blocks spread over the worker pool in chunks, the work items of
//! each block run by `cpp/exec.c` (direct calls prepared once per launch, fibers for kernels
//! with barriers, the JIT's work-group functions called once per block, faults caught).

use crate::pool::Pool;
use libffi::middle::{Cif, Type};
use offload_core::{Error, KernelArg, LaunchDims, Result};
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The work-item context `include/offload_kernel.h` reads on the host (`offload_host_context`).
/// The layout is a contract with the header (fields are only ever added at the end). One per
/// worker thread, owned by the plugin (which is never unloaded, so it never moves).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct HostContext {
    /// `offload_thread_id(0..2)`
    pub thread_id: [u32; 3],
    /// `offload_block_id(0..2)`
    pub block_id: [u32; 3],
    /// `offload_block_dim(0..2)`
    pub block_dim: [u32; 3],
    /// `offload_grid_dim(0..2)`
    pub grid_dim: [u32; 3],
    /// `offload_shared_memory()`: the block's dynamic shared memory.
    pub shared: *mut c_void,
    /// Its size.
    pub shared_bytes: u32,
    /// Zero.
    pub reserved: u32,
}

/// Type of the header's `__offload_host_context` variable.
pub type ContextGetter = unsafe extern "C" fn() -> *const HostContext;
/// Type of the header's `__offload_host_barrier` variable.
pub type BarrierFn = unsafe extern "C" fn();
/// A work-group function the JIT made (`cpp/work_groups/` in offload-jit): runs every work
/// item of the blocks `begin..end` (linear indices) of the launch in `ctx`, with the packed
/// arguments and `frame` (the per-work-item frame of the block's work items). Returns 0, or
/// 1 + the linear index of a block whose work items reached different barriers.
pub type WorkGroupFn =
    unsafe extern "C" fn(*const u64, *mut HostContext, u64, u64, *mut c_void) -> u64;

/// A kernel's work-group function and the frame bytes it needs per work item.
#[derive(Debug, Clone, Copy)]
pub struct WorkGroup {
    pub func: WorkGroupFn,
    pub frame_bytes: u64,
}

/// A cache line: the unit of the workers' buffers (so they are 64-byte aligned).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

type Buffer = Cell<(*mut Line, usize)>;

thread_local! {
    /// The worker's dynamic shared memory, grown as launches ask.
    static SHARED: Buffer = const { Cell::new((std::ptr::null_mut(), 0)) };
    /// The worker's work-item frames (for work-group functions of kernels with barriers).
    static FRAME: Buffer = const { Cell::new((std::ptr::null_mut(), 0)) };
}

/// The calling worker's context (in `cpp/exec.c`); what loaded images call to read their IDs.
pub fn current_context() -> ContextGetter {
    offload_current_context
}

/// The plugin's barrier, which images call through `__offload_host_barrier`.
pub fn barrier() -> BarrierFn {
    offload_barrier_impl
}

/// The C side's `struct call`: a kernel call prepared once per launch.
#[repr(C)]
struct Call {
    func: unsafe extern "C" fn(),
    ints: [u64; 8],
    floats: [u64; 8],
    stack: [u64; 16],
    /// Stack slots used; -1: through libffi.
    nstack: i32,
    cif: *mut libffi::raw::ffi_cif,
    argv: *mut *mut c_void,
}

/// The C side's `struct fault`, with the block filled in here.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// `SIGSEGV`, `SIGBUS`, `SIGFPE` or `SIGILL`.
    pub signal: i32,
    /// The faulting address.
    pub address: *mut c_void,
    /// The work item (thread id) that faulted.
    pub item: [u32; 3],
    /// Its block.
    pub block: [u32; 3],
    /// For a work-group function: the linear blocks `range[0]..range[1]` it was running (the
    /// block is not known); `[0, 0]` otherwise.
    pub range: [u64; 2],
}

// SAFETY: plain data (the address is only printed).
unsafe impl Send for Fault {}

/// Why a launch stopped.
#[derive(Debug, Clone, Copy)]
enum Stop {
    Fault(Fault),
    Divergent([u32; 3]),
    NoMemory(u64),
    Guard,
}

impl Stop {
    fn error(&self, kernel: &str, dims: &LaunchDims) -> Error {
        match self {
            Stop::Fault(f) => {
                let name = match f.signal {
                    libc::SIGSEGV => "SIGSEGV (invalid memory access)",
                    libc::SIGBUS => "SIGBUS (misaligned or unmapped memory)",
                    libc::SIGFPE => "SIGFPE (arithmetic fault, e.g. integer division by zero)",
                    libc::SIGILL => "SIGILL (illegal instruction)",
                    _ => "a fault signal",
                };
                let at = match f.range {
                    [b, e] if e > b => format!("in one of the blocks {b}..{e} (linear indices)"),
                    _ => format!(
                        "work item ({}, {}, {}) of block ({}, {}, {})",
                        f.item[0], f.item[1], f.item[2], f.block[0], f.block[1], f.block[2]
                    ),
                };
                Error::DeviceFailure(format!(
                    "kernel '{kernel}' faulted: {name} at address {:p}, {at}; the launch was stopped, and memory it wrote may be partly updated",
                    f.address
                ))
            }
            Stop::Divergent(b) => Error::DeviceFailure(format!(
                "kernel '{kernel}': in block ({}, {}, {}) some work items reached an offload_barrier() that others did not; every work item of a block must reach the same barriers",
                b[0], b[1], b[2]
            )),
            Stop::NoMemory(bytes) => Error::OutOfMemory(format!(
                "kernel '{kernel}': {bytes} bytes for the blocks of {} work items (fiber stacks, dynamic shared memory, work-item frames)",
                dims.block.iter().map(|&b| u64::from(b)).product::<u64>()
            )),
            Stop::Guard => {
                Error::System("cannot install the host plugin's kernel fault handler".into())
            }
        }
    }
}

unsafe extern "C" {
    fn offload_current_context() -> *const HostContext;
    fn offload_worker_context() -> *mut HostContext;
    fn offload_guard_install() -> i32;
    fn offload_int_registers() -> i32;
    fn offload_barrier_impl();
    fn offload_run_block(
        call: *const Call,
        ctx: *mut HostContext,
        bx: u32,
        by: u32,
        bz: u32,
        fault: *mut Fault,
    ) -> i32;
    fn offload_run_blocks_wg(
        wg: WorkGroupFn,
        args: *const u64,
        ctx: *mut HostContext,
        begin: u64,
        end: u64,
        frame: *mut c_void,
        fault: *mut Fault,
        diverged: *mut u64,
    ) -> i32;
}

/// `offload_run_block`'s results.
const FAULT: i32 = 1;
const DIVERGENT: i32 = 2;
const NO_MEMORY: i32 = 3;

/// Storage of one argument value, addressed by libffi (the fallback).
#[repr(C)]
#[derive(Clone, Copy)]
union Slot {
    u64: u64,
    f32: f32,
    f64: f64,
}

/// A kernel call prepared once per launch.
pub struct PreparedCall {
    /// Whether the image reads the work-item context (kernels that include the header do).
    has_context: bool,
    /// The JIT's work-group function for this kernel, if it made one.
    work_group: Option<WorkGroup>,
    call: Call,
    /// Every argument's bits, in order (the work-group function's packed arguments).
    packed: Vec<u64>,
    /// The libffi fallback's description and values (kept alive for `call`).
    _cif: Option<Box<Cif>>,
    _slots: Box<[Slot]>,
    _argv: Box<[*mut c_void]>,
}

impl std::fmt::Debug for PreparedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCall")
            .field("args", &self.packed.len())
            .field("work_group", &self.work_group.is_some())
            .finish()
    }
}

// SAFETY: after construction nothing mutates the call, the CIF or the slots; the C side only
// reads them, so sharing across worker threads is sound. The function pointers stay valid
// because the generic layer keeps the program loaded until the launch has run.
unsafe impl Send for PreparedCall {}
// SAFETY: see `Send`.
unsafe impl Sync for PreparedCall {}

impl PreparedCall {
    /// # Safety
    /// `func` (and `work_group`, if any) must be functions of a loaded image that stays loaded
    /// while the call is used; `func`'s C signature must match `args` in number and type,
    /// returning `void`.
    pub unsafe fn new(
        has_context: bool,
        func: *mut c_void,
        work_group: Option<WorkGroup>,
        args: &[KernelArg],
    ) -> Self {
        // SAFETY: `func` is a non-null function address from dlsym (the caller's contract).
        let func: unsafe extern "C" fn() = unsafe { std::mem::transmute(func) };
        let packed: Vec<u64> = args.iter().map(|a| a.to_bits().1).collect();
        let mut call = Call {
            func,
            ints: [0; 8],
            floats: [0; 8],
            stack: [0; 16],
            nstack: 0,
            cif: std::ptr::null_mut(),
            argv: std::ptr::null_mut(),
        };
        // Registers first (integers and floats each in order), then the stack, in order: the
        // C calling convention of x86-64 and AArch64 Linux for arguments of these types.
        // SAFETY: no preconditions.
        let int_regs = unsafe { offload_int_registers() } as usize;
        let (mut ni, mut nf, mut ns) = (0usize, 0usize, 0usize);
        let mut fits = int_regs > 0;
        for (a, bits) in args.iter().zip(&packed) {
            let float = matches!(a, KernelArg::F32(_) | KernelArg::F64(_));
            if float && nf < 8 {
                call.floats[nf] = *bits;
                nf += 1;
            } else if !float && ni < int_regs {
                call.ints[ni] = *bits;
                ni += 1;
            } else if ns < 16 {
                call.stack[ns] = *bits;
                ns += 1;
            } else {
                fits = false;
            }
        }
        call.nstack = ns as i32;
        let (cif, slots, argv) = if fits {
            (None, Box::default(), Box::default())
        } else {
            let types: Vec<Type> = args
                .iter()
                .map(|a| match a {
                    KernelArg::I32(_) => Type::i32(),
                    KernelArg::U32(_) => Type::u32(),
                    KernelArg::I64(_) => Type::i64(),
                    KernelArg::U64(_) | KernelArg::Word(_) => Type::u64(),
                    KernelArg::F32(_) => Type::f32(),
                    KernelArg::F64(_) => Type::f64(),
                    KernelArg::Ptr(_) => Type::pointer(),
                })
                .collect();
            let slots: Box<[Slot]> = args
                .iter()
                .zip(&packed)
                .map(|(a, bits)| match a {
                    KernelArg::F32(v) => Slot { f32: *v },
                    KernelArg::F64(v) => Slot { f64: *v },
                    _ => Slot { u64: *bits },
                })
                .collect();
            let cif = Box::new(Cif::new(types, Type::void()));
            let mut argv: Box<[*mut c_void]> = slots
                .iter()
                .map(|s| s as *const Slot as *mut c_void)
                .collect();
            call.nstack = -1;
            call.cif = cif.as_raw_ptr();
            call.argv = argv.as_mut_ptr();
            (Some(cif), slots, argv)
        };
        PreparedCall {
            has_context,
            work_group,
            call,
            packed,
            _cif: cif,
            _slots: slots,
            _argv: argv,
        }
    }

    /// This worker's context, made ready for `block` of a launch of `dims`.
    fn context_for(&self, dims: &LaunchDims, block: u64) -> Result<*mut HostContext, Stop> {
        // SAFETY: no preconditions; the context of the calling thread.
        let ctx = unsafe { offload_worker_context() };
        let [gx, gy, _] = dims.grid.map(u64::from);
        let shared = shared_memory(dims.shared_mem_bytes)?;
        // SAFETY: this thread's own context; only this thread writes it, and the kernel reads it
        // only while this thread runs the block.
        unsafe {
            (*ctx).block_id = [
                (block % gx) as u32,
                ((block / gx) % gy) as u32,
                (block / (gx * gy)) as u32,
            ];
            (*ctx).block_dim = dims.block;
            (*ctx).grid_dim = dims.grid;
            (*ctx).thread_id = [0; 3];
            (*ctx).shared = shared;
            (*ctx).shared_bytes = dims.shared_mem_bytes;
        }
        Ok(ctx)
    }

    /// Runs the work items of one block on the calling thread.
    fn run_block(&self, dims: &LaunchDims, block: u64) -> Result<(), Stop> {
        let ctx = self.context_for(dims, block)?;
        // SAFETY: set just above.
        let block_id = unsafe { (*ctx).block_id };
        let mut fault = Fault {
            signal: 0,
            address: std::ptr::null_mut(),
            item: [0; 3],
            block: block_id,
            range: [0, 0],
        };
        let [bx, by, bz] = dims.block;
        let ctx_arg = if self.has_context {
            ctx
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: the call is prepared for this kernel and stays valid (see `new`); `ctx` is
        // this thread's context; the C side writes only `fault`'s leading fields.
        let r = unsafe { offload_run_block(&self.call, ctx_arg, bx, by, bz, &mut fault) };
        match r {
            0 => Ok(()),
            FAULT => Err(Stop::Fault(fault)),
            DIVERGENT => Err(Stop::Divergent(block_id)),
            NO_MEMORY => Err(Stop::NoMemory(
                u64::from(bx) * u64::from(by) * u64::from(bz) * 256 * 1024,
            )),
            _ => Err(Stop::Guard),
        }
    }

    /// Runs the blocks `begin..end` through the work-group function `wg` on the calling
    /// thread.
    fn run_blocks_wg(
        &self,
        wg: WorkGroup,
        dims: &LaunchDims,
        begin: u64,
        end: u64,
    ) -> Result<(), Stop> {
        let ctx = self.context_for(dims, begin)?;
        let frame = if wg.frame_bytes == 0 {
            std::ptr::null_mut()
        } else {
            let items = dims.block.iter().map(|&b| u64::from(b)).product::<u64>();
            let bytes = wg
                .frame_bytes
                .checked_mul(items)
                .ok_or(Stop::NoMemory(u64::MAX))?;
            worker_buffer(&FRAME, bytes)?
        };
        let mut diverged = 0u64;
        let mut fault = Fault {
            signal: 0,
            address: std::ptr::null_mut(),
            item: [0; 3],
            block: [0; 3],
            range: [begin, end],
        };
        // SAFETY: `wg` is this kernel's work-group function in a loaded image, `packed` holds
        // one slot per parameter, `ctx` is this thread's context, `frame` holds `frame_bytes`
        // for each work item of a block.
        let r = unsafe {
            offload_run_blocks_wg(
                wg.func,
                self.packed.as_ptr(),
                ctx,
                begin,
                end,
                frame,
                &mut fault,
                &mut diverged,
            )
        };
        match r {
            0 => Ok(()),
            DIVERGENT => {
                let [gx, gy, _] = dims.grid.map(u64::from);
                Err(Stop::Divergent([
                    (diverged % gx) as u32,
                    ((diverged / gx) % gy) as u32,
                    (diverged / (gx * gy)) as u32,
                ]))
            }
            _ => Err(Stop::Fault(fault)),
        }
    }

    /// Runs the whole grid: blocks handed to `pool`'s workers in chunks sized to the grid (see
    /// [`schedule`]), or inline when there is one block or one worker. The first fault or
    /// barrier error stops the launch (blocks not yet started are skipped) and is returned.
    pub fn run(&self, name: &str, dims: &LaunchDims, pool: &Pool) -> Result<()> {
        // SAFETY: installs the plugin's fault handler once; no preconditions.
        if unsafe { offload_guard_install() } != 0 {
            return Err(Stop::Guard.error(name, dims));
        }
        let blocks = dims.blocks();
        let threads = pool.threads() as u64;
        if let Some(wg) = self.work_group {
            if blocks == 1 || threads == 1 {
                return self
                    .run_blocks_wg(wg, dims, 0, blocks)
                    .map_err(|s| s.error(name, dims));
            }
            return schedule(pool, blocks, |begin, end| {
                self.run_blocks_wg(wg, dims, begin, end)
            })
            .map_err(|s| s.error(name, dims));
        }
        if blocks == 1 || threads == 1 {
            for b in 0..blocks {
                self.run_block(dims, b).map_err(|s| s.error(name, dims))?;
            }
            return Ok(());
        }
        schedule(pool, blocks, |begin, end| {
            (begin..end).try_for_each(|b| self.run_block(dims, b))
        })
        .map_err(|s| s.error(name, dims))
    }
}

/// Runs `run(begin, end)` over the blocks `0..blocks` on the calling thread and all but one of
/// `pool`'s workers, each
/// taking the next range from a shared counter until none is left (guided self-scheduling):
/// a range is a share of what is left (1 / (2 x workers)), at least 1 block, so ranges start
/// large (one counter update per many blocks) and shrink toward the end of the grid, where
/// they keep the workers finishing together. The first error stops every worker at its next
/// range and is returned.
fn schedule<F>(pool: &Pool, blocks: u64, run: F) -> Result<(), Stop>
where
    F: Fn(u64, u64) -> Result<(), Stop> + Sync,
{
    let workers = pool.threads() as u64;
    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<Stop>> = Mutex::new(None);
    let work = || {
        let mut begin = next.load(Ordering::Relaxed);
        while begin < blocks && !stop.load(Ordering::Relaxed) {
            let size = ((blocks - begin) / (2 * workers)).max(1);
            match next.compare_exchange_weak(
                begin,
                begin + size,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    if let Err(s) = run(begin, begin + size) {
                        stop.store(true, Ordering::Relaxed);
                        offload_core::sync::lock(&failure).get_or_insert(s);
                        return;
                    }
                    begin = next.load(Ordering::Relaxed);
                }
                Err(now) => begin = now,
            }
        }
    };
    // The calling thread (which waits for the launch anyway) takes ranges too, with one fewer
    // pool worker woken: no wake-up latency before the first block runs, as OpenMP's master
    // thread does.
    // No more helpers than there are blocks for them: a one-block launch (an OpenMP target
    // region, called once) runs on the calling thread alone.
    let helpers = workers.min(blocks).saturating_sub(1);
    pool.run(helpers as usize, &work);
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(s) => Err(s),
        None => Ok(()),
    }
}

/// This worker's dynamic shared memory of at least `bytes` (null for 0).
fn shared_memory(bytes: u32) -> Result<*mut c_void, Stop> {
    if bytes == 0 {
        return Ok(std::ptr::null_mut());
    }
    worker_buffer(&SHARED, u64::from(bytes))
}

/// This worker's buffer `key`, grown to at least `bytes` (64-byte aligned, zeroed when grown).
/// More than a quarter of the machine's memory per worker is refused (overcommit would grant
/// it on paper and end the process when it is written).
fn worker_buffer(
    key: &'static std::thread::LocalKey<Buffer>,
    bytes: u64,
) -> Result<*mut c_void, Stop> {
    let physical = offload_core::fs::physical_memory();
    if physical > 0 && bytes > physical / 4 {
        return Err(Stop::NoMemory(bytes));
    }
    let units = usize::try_from(bytes.div_ceil(64)).map_err(|_| Stop::NoMemory(bytes))?;
    key.with(|s| {
        let (ptr, len) = s.get();
        if len >= units {
            return Ok(ptr.cast());
        }
        let mut v: Vec<Line> = Vec::new();
        v.try_reserve_exact(units)
            .map_err(|_| Stop::NoMemory(bytes))?;
        v.resize(units, Line([0; 64]));
        let new = Box::leak(v.into_boxed_slice());
        if !ptr.is_null() {
            // SAFETY: the previous buffer was leaked from a boxed slice of `len` units by this
            // function on this thread, and no block of this thread runs now.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) });
        }
        s.set((new.as_mut_ptr(), units));
        Ok(new.as_mut_ptr().cast())
    })
}

#[cfg(test)]
mod tests {
    use super::HostContext;
    use std::mem::{offset_of, size_of};

    unsafe extern "C" {
        fn offload_context_layout(out: *mut usize);
    }

    /// `HostContext` is the kernel header's `offload_host_context`, as `cpp/exec.c` compiles it
    /// from the header: the same size and field offsets.
    #[test]
    fn the_context_mirrors_the_kernel_headers_type() {
        let mut c = [0usize; 8];
        // SAFETY: the function writes exactly 8 values.
        unsafe { offload_context_layout(c.as_mut_ptr()) };
        let rust = [
            size_of::<HostContext>(),
            offset_of!(HostContext, thread_id),
            offset_of!(HostContext, block_id),
            offset_of!(HostContext, block_dim),
            offset_of!(HostContext, grid_dim),
            offset_of!(HostContext, shared),
            offset_of!(HostContext, shared_bytes),
            offset_of!(HostContext, reserved),
        ];
        assert_eq!(
            rust, c,
            "HostContext (size, then the offsets of thread_id, block_id, block_dim, grid_dim, \
             shared, shared_bytes, reserved) differs from include/offload_kernel.h's \
             offload_host_context"
        );
    }
}
