//! Running a kernel on the host: the SPMD loop over work items and the C-ABI call of each.

use libffi::middle::{Cif, Type};
use offload_core::{KernelArg, LaunchDims};
use rayon::prelude::*;
use std::ffi::c_void;

/// The work-item context `include/offload_kernel.h` reads on the host (`offload_host_context`).
/// The layout is a contract with the header. One per worker thread, owned by the plugin (which
/// is never unloaded, so its thread-local storage never moves).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct HostContext {
    /// `offload_thread_id(0..2)`
    pub thread_id: [u32; 3],
    /// `offload_block_id(0..2)`
    pub block_id: [u32; 3],
    /// `offload_block_dim(0..2)`
    pub block_dim: [u32; 3],
    /// `offload_grid_dim(0..2)`
    pub grid_dim: [u32; 3],
}

/// Type of the header's `__offload_host_context` variable.
pub type ContextGetter = extern "C" fn() -> *const HostContext;

thread_local! {
    static CONTEXT: std::cell::UnsafeCell<HostContext> = const {
        std::cell::UnsafeCell::new(HostContext {
            thread_id: [0; 3],
            block_id: [0; 3],
            block_dim: [0; 3],
            grid_dim: [0; 3],
        })
    };
}

/// The calling worker's context; what loaded images call to read their IDs.
pub extern "C" fn current_context() -> *const HostContext {
    CONTEXT.with(|c| c.get() as *const HostContext)
}

/// Storage of one argument value, addressed by libffi.
#[repr(C)]
#[derive(Clone, Copy)]
union Slot {
    i32: i32,
    u32: u32,
    i64: i64,
    u64: u64,
    f32: f32,
    f64: f64,
    ptr: *mut c_void,
}

/// A kernel call prepared once per launch and made once per work item.
pub struct PreparedCall {
    /// Whether the image reads the work-item context (kernels that include the header do).
    has_context: bool,
    func: unsafe extern "C" fn(),
    cif: Cif,
    slots: Box<[Slot]>,
}

impl std::fmt::Debug for PreparedCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedCall")
            .field("args", &self.slots.len())
            .finish()
    }
}

// SAFETY: after construction nothing mutates the CIF or the slots; `ffi_call` only reads
// them, so sharing across worker threads is sound. The function pointer stays valid because
// the generic layer keeps the program loaded until the launch has run.
unsafe impl Send for PreparedCall {}
// SAFETY: see `Send`.
unsafe impl Sync for PreparedCall {}

impl PreparedCall {
    /// # Safety
    /// `func` must be a function of a loaded image that stays loaded while the call is used,
    /// whose C signature matches `args` in number and type, returning `void`.
    pub unsafe fn new(has_context: bool, func: *mut c_void, args: &[KernelArg]) -> Self {
        let mut types = Vec::with_capacity(args.len());
        let mut slots = Vec::with_capacity(args.len());
        for a in args {
            let (ty, slot) = match *a {
                KernelArg::I32(v) => (Type::i32(), Slot { i32: v }),
                KernelArg::U32(v) => (Type::u32(), Slot { u32: v }),
                KernelArg::I64(v) => (Type::i64(), Slot { i64: v }),
                KernelArg::U64(v) => (Type::u64(), Slot { u64: v }),
                KernelArg::F32(v) => (Type::f32(), Slot { f32: v }),
                KernelArg::F64(v) => (Type::f64(), Slot { f64: v }),
                KernelArg::Ptr(p) => (
                    Type::pointer(),
                    Slot {
                        ptr: p.0 as *mut c_void,
                    },
                ),
            };
            types.push(ty);
            slots.push(slot);
        }
        // SAFETY: `func` is a non-null function address from dlsym (guaranteed by the caller).
        let func: unsafe extern "C" fn() = unsafe { std::mem::transmute(func) };
        PreparedCall {
            has_context,
            func,
            cif: Cif::new(types, Type::void()),
            slots: slots.into_boxed_slice(),
        }
    }

    fn arg_pointers(&self) -> Vec<*mut c_void> {
        self.slots
            .iter()
            .map(|s| s as *const Slot as *mut c_void)
            .collect()
    }

    /// Runs all work items of one block on the calling thread; a fault of the kernel ends
    /// the block and is returned.
    fn run_block(
        &self,
        dims: &LaunchDims,
        block: u64,
        ctx: Option<*mut HostContext>,
        argv: &mut [*mut c_void],
    ) -> Option<Fault> {
        let [gx, gy, _] = dims.grid.map(u64::from);
        let block_id = [
            (block % gx) as u32,
            ((block / gx) % gy) as u32,
            (block / (gx * gy)) as u32,
        ];
        if let Some(ctx) = ctx {
            // SAFETY: `ctx` is this thread's own context (a thread-local of the plugin); only
            // this thread writes it, and the kernel reads it only during the calls below.
            unsafe {
                (*ctx).block_id = block_id;
                (*ctx).block_dim = dims.block;
                (*ctx).grid_dim = dims.grid;
            }
        }
        let [bx, by, bz] = dims.block;
        // The C side fills in the leading fields (its `struct fault`).
        let mut fault = Fault {
            signal: 0,
            address: std::ptr::null_mut(),
            item: [0; 3],
            block: block_id,
        };
        // SAFETY: the CIF matches the function by `new`'s contract, `argv` points at
        // `self.slots` (one pointer per argument), a void return needs no return buffer, and
        // `ctx` is this thread's own context; the loop runs in C so that a fault's jump back
        // crosses no Rust frame.
        let faulted = unsafe {
            offload_run_block(
                self.cif.as_raw_ptr(),
                self.func,
                argv.as_mut_ptr(),
                ctx.unwrap_or(std::ptr::null_mut()),
                bx,
                by,
                bz,
                &mut fault,
            )
        };
        (faulted != 0).then_some(fault)
    }

    /// This thread's context, if the image reads one.
    fn context(&self) -> Option<*mut HostContext> {
        self.has_context.then(|| CONTEXT.with(|c| c.get()))
    }

    /// Runs the whole grid: blocks spread over `pool`, or inline when there is one block. A
    /// fault of the kernel stops the launch (blocks not yet started are skipped) and is
    /// returned.
    pub fn run(&self, dims: &LaunchDims, pool: &rayon::ThreadPool) -> Result<(), Fault> {
        // SAFETY: installs the plugin's fault handler once; no preconditions.
        if unsafe { offload_guard_install() } != 0 {
            return Err(Fault {
                signal: 0,
                address: std::ptr::null_mut(),
                item: [0; 3],
                block: [0; 3],
            });
        }
        let blocks = dims.blocks();
        if blocks == 1 || pool.current_num_threads() == 1 {
            let ctx = self.context();
            let mut argv = self.arg_pointers();
            for b in 0..blocks {
                if let Some(f) = self.run_block(dims, b, ctx, &mut argv) {
                    return Err(f);
                }
            }
            return Ok(());
        }
        let first: std::sync::Mutex<Option<Fault>> = std::sync::Mutex::new(None);
        let stop = std::sync::atomic::AtomicBool::new(false);
        pool.install(|| {
            (0..blocks).into_par_iter().for_each_init(
                || (self.context(), self.arg_pointers()),
                |(ctx, argv), b| {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        return;
                    }
                    if let Some(f) = self.run_block(dims, b, *ctx, argv) {
                        stop.store(true, std::sync::atomic::Ordering::Relaxed);
                        first
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .get_or_insert(f);
                    }
                },
            );
        });
        match first.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(f) => Err(f),
            None => Ok(()),
        }
    }
}

/// A fault of a kernel: the signal, the address it touched, and the work item.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// `SIGSEGV`, `SIGBUS`, `SIGFPE` or `SIGILL` (0: the handler could not be installed).
    pub signal: i32,
    /// The faulting address.
    pub address: *mut c_void,
    /// The work item (thread id) that faulted.
    pub item: [u32; 3],
    /// Its block (filled in on the Rust side).
    pub block: [u32; 3],
}

// SAFETY: plain data (the address is only printed).
unsafe impl Send for Fault {}

impl Fault {
    /// The error a launch that faulted gives.
    pub fn error(&self, kernel: &str) -> offload_core::Error {
        let name = match self.signal {
            libc::SIGSEGV => "SIGSEGV (invalid memory access)",
            libc::SIGBUS => "SIGBUS (misaligned or unmapped memory)",
            libc::SIGFPE => "SIGFPE (arithmetic fault, e.g. integer division by zero)",
            libc::SIGILL => "SIGILL (illegal instruction)",
            0 => {
                return offload_core::Error::System(
                    "cannot install the host plugin's kernel fault handler".into(),
                );
            }
            _ => "a fault signal",
        };
        offload_core::Error::DeviceFailure(format!(
            "kernel '{kernel}' faulted: {name} at address {:p}, work item ({}, {}, {}) of block ({}, {}, {}); the launch was stopped, and memory it wrote may be partly updated",
            self.address,
            self.item[0],
            self.item[1],
            self.item[2],
            self.block[0],
            self.block[1],
            self.block[2]
        ))
    }
}

unsafe extern "C" {
    fn offload_guard_install() -> i32;
    fn offload_run_block(
        cif: *mut libffi::raw::ffi_cif,
        func: unsafe extern "C" fn(),
        argv: *mut *mut c_void,
        ctx: *mut HostContext,
        bx: u32,
        by: u32,
        bz: u32,
        fault: *mut Fault,
    ) -> i32;
}
