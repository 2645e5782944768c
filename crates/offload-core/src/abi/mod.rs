//! The C plugin ABI: one entry symbol per plugin library returning a versioned, checked table
//! of `extern "C"` functions.
//!
//! Layout rules:
//! - The table starts with an [`AbiHeader`]. The runtime reads the magic first, then the ABI
//!   version, then `table_size`, and touches nothing else until all three check out.
//! - A new ABI *minor* version only appends function pointers. The runtime accepts any table of
//!   at least the 1.0 size ([`TABLE_SIZE_1_0`]) and calls a later entry only when the plugin's
//!   `table_size` covers it. A different *major* version is refused.
//! - Every function returns `0` on success or a non-zero status; details of a failure go to
//!   the caller's [`AbiErrorOut`] sink as `(kind, native code, message)`, so neither side frees
//!   memory the other allocated.
//! - Queue argument `0` means "synchronous"; real queue handles are never 0.
//! - Every entry catches panics (a panic across `extern "C"` aborts the process) and reports
//!   them as [`crate::Error::PluginPanic`].
//! - ABI 1.2 adds `set_jit_service`: the runtime hands every plugin its process-wide JIT
//!   ([`AbiJitService`]), so all plugins of a process share one JIT worker and one cache.
//!
//! Plugin authors never write this FFI by hand: see [`crate::export_plugin!`]. The runtime side
//! is [`loader`].

pub mod export;
pub mod loader;

use std::ffi::{c_char, c_void};

/// `b"OFFLDPLG"` read as a little-endian `u64`.
pub const ABI_MAGIC: u64 = u64::from_le_bytes(*b"OFFLDPLG");
/// Major ABI version: tables with another major version are refused.
pub const ABI_MAJOR: u16 = 1;
/// Minor ABI version: a larger minor only appends entries to the table.
pub const ABI_MINOR: u16 = 2;
/// The one symbol every plugin library exports (`extern "C" fn() -> *const PluginTable`).
pub const ENTRY_SYMBOL: &str = "offload_plugin_entry";
/// Queue value meaning "run synchronously".
pub const SYNC_QUEUE: u64 = 0;

/// Type of the entry symbol.
pub type EntryFn = unsafe extern "C" fn() -> *const PluginTable;

/// The first bytes of every plugin table.
#[repr(C)]
#[derive(Debug)]
pub struct AbiHeader {
    /// Always [`ABI_MAGIC`].
    pub magic: u64,
    /// [`ABI_MAJOR`] the plugin was built with.
    pub abi_major: u16,
    /// [`ABI_MINOR`] the plugin was built with.
    pub abi_minor: u16,
    /// `size_of::<PluginTable>()` as the plugin sees it.
    pub table_size: u32,
    /// The ELF machine the plugin serves.
    pub elf_machine: u16,
    /// Zero.
    pub reserved: [u16; 3],
    /// Plugin name, NUL-terminated, static.
    pub name: *const c_char,
    /// LLVM target triple of the plugin's devices, NUL-terminated, static.
    pub target_triple: *const c_char,
    /// Free-form build identification (crate version, ABI), NUL-terminated, static.
    pub build_id: *const c_char,
}

/// Where a plugin writes an error: `set(ctx, kind, code, message, len)`.
#[repr(C)]
#[derive(Debug)]
pub struct AbiErrorOut {
    /// Caller's context.
    pub ctx: *mut c_void,
    /// Called at most once per failed call.
    pub set:
        unsafe extern "C" fn(ctx: *mut c_void, kind: u32, code: i64, msg: *const u8, len: usize),
}

/// Where a plugin writes a string (UTF-8) or bytes: `write(ctx, bytes, len)`, possibly in
/// pieces.
#[repr(C)]
#[derive(Debug)]
pub struct AbiStringOut {
    /// Caller's context.
    pub ctx: *mut c_void,
    /// Appends bytes.
    pub write: unsafe extern "C" fn(ctx: *mut c_void, bytes: *const u8, len: usize),
}

/// Numeric part of [`crate::DeviceInfo`].
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AbiDeviceInfo {
    /// Total memory in bytes.
    pub total_memory: u64,
    /// Compute units.
    pub compute_units: u32,
    /// Warp size.
    pub warp_size: u32,
    /// Max grid per dimension.
    pub max_grid: [u32; 3],
    /// Max block per dimension.
    pub max_block: [u32; 3],
    /// Max threads per block.
    pub max_threads_per_block: u32,
    /// Zero.
    pub reserved: u32,
}

/// Launch shape.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AbiLaunchDims {
    /// Blocks per grid.
    pub grid: [u32; 3],
    /// Threads per block.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared_mem_bytes: u32,
    /// Zero.
    pub reserved: u32,
}

/// One kernel argument: a kind code from [`crate::types::arg_kind`] and its bits.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AbiKernelArg {
    /// Kind code.
    pub kind: u32,
    /// Zero.
    pub reserved: u32,
    /// Value bits (floats as IEEE bits, signed values sign-extended).
    pub bits: u64,
}

/// The runtime's JIT as a plugin sees it (ABI 1.2). It lives for the rest of the process.
#[repr(C)]
#[derive(Debug)]
pub struct AbiJitService {
    /// The runtime's context.
    pub ctx: *const c_void,
    /// Compiles `image` for the request head (`offload_core::jit::encode_request_head`) and
    /// writes the result (`offload_core::jit::encode_output`) to `out`.
    pub compile: unsafe extern "C" fn(
        ctx: *const c_void,
        head: *const u8,
        head_len: usize,
        image: *const u8,
        image_len: usize,
        out: *const AbiStringOut,
        err: *const AbiErrorOut,
    ) -> i32,
}

// SAFETY: the runtime's context behind `ctx` is a `Send + Sync` service that is never freed.
unsafe impl Send for AbiJitService {}
// SAFETY: see `Send`.
unsafe impl Sync for AbiJitService {}

/// Plugin context pointer passed back to every entry.
pub type Ctx = *const c_void;
/// Pointer to the caller's error sink.
pub type Err = *const AbiErrorOut;

/// The function table a plugin exports. Fields after the header may only ever be appended.
#[repr(C)]
#[derive(Debug)]
pub struct PluginTable {
    /// Versioned header, checked before anything else.
    pub header: AbiHeader,
    /// Opaque plugin state, passed back as the first argument of every entry.
    pub ctx: Ctx,
    /// Initialise; writes the device count.
    pub init: unsafe extern "C" fn(Ctx, out_count: *mut u32, Err) -> i32,
    /// Plugin-level image compatibility.
    pub check_image: unsafe extern "C" fn(Ctx, image: *const u8, len: usize, Err) -> i32,
    /// Device-level image compatibility.
    pub device_check_image:
        unsafe extern "C" fn(Ctx, dev: u32, image: *const u8, len: usize, Err) -> i32,
    /// Device information: numbers, then name, compute-unit kind and features as strings.
    pub device_info: unsafe extern "C" fn(
        Ctx,
        dev: u32,
        out: *mut AbiDeviceInfo,
        name: *const AbiStringOut,
        compute_unit: *const AbiStringOut,
        features: *const AbiStringOut,
        Err,
    ) -> i32,
    /// Load an image; writes the program handle.
    pub load_image: unsafe extern "C" fn(
        Ctx,
        dev: u32,
        image: *const u8,
        len: usize,
        out: *mut u64,
        Err,
    ) -> i32,
    /// Unload a program.
    pub unload_image: unsafe extern "C" fn(Ctx, dev: u32, program: u64, Err) -> i32,
    /// Look up a kernel; writes its handle.
    pub get_kernel: unsafe extern "C" fn(
        Ctx,
        dev: u32,
        program: u64,
        name: *const u8,
        name_len: usize,
        out: *mut u64,
        Err,
    ) -> i32,
    /// Look up a global; writes its address and size.
    pub get_global: unsafe extern "C" fn(
        Ctx,
        dev: u32,
        program: u64,
        name: *const u8,
        name_len: usize,
        out_ptr: *mut u64,
        out_size: *mut u64,
        Err,
    ) -> i32,
    /// Allocate device memory.
    pub alloc: unsafe extern "C" fn(Ctx, dev: u32, size: u64, kind: u32, out: *mut u64, Err) -> i32,
    /// Free device memory.
    pub free: unsafe extern "C" fn(Ctx, dev: u32, ptr: u64, Err) -> i32,
    /// Host to device copy.
    pub copy_to_device: unsafe extern "C" fn(
        Ctx,
        dev: u32,
        dst: u64,
        src: *const u8,
        len: usize,
        queue: u64,
        Err,
    ) -> i32,
    /// Device to host copy.
    pub copy_from_device: unsafe extern "C" fn(
        Ctx,
        dev: u32,
        dst: *mut u8,
        src: u64,
        len: usize,
        queue: u64,
        Err,
    ) -> i32,
    /// Device to device copy.
    pub copy_device_to_device:
        unsafe extern "C" fn(Ctx, dev: u32, dst: u64, src: u64, len: u64, queue: u64, Err) -> i32,
    /// Launch a kernel.
    pub launch: unsafe extern "C" fn(
        Ctx,
        dev: u32,
        kernel: u64,
        dims: *const AbiLaunchDims,
        args: *const AbiKernelArg,
        nargs: usize,
        queue: u64,
        Err,
    ) -> i32,
    /// Create a queue; writes its handle.
    pub queue_create: unsafe extern "C" fn(Ctx, dev: u32, out: *mut u64, Err) -> i32,
    /// Wait for a queue.
    pub queue_synchronize: unsafe extern "C" fn(Ctx, dev: u32, queue: u64, Err) -> i32,
    /// Destroy a queue.
    pub queue_destroy: unsafe extern "C" fn(Ctx, dev: u32, queue: u64, Err) -> i32,
    // ---- ABI 1.1 ----
    /// JIT counters; fails with `Unsupported` for a plugin without a JIT engine.
    pub jit_stats: unsafe extern "C" fn(Ctx, out: *mut crate::JitStats, Err) -> i32,
    // ---- ABI 1.2 ----
    /// Offers the runtime's JIT service (called before `init`); fails with `Unsupported` for a
    /// plugin that compiles nothing. The pointer stays valid for the rest of the process.
    pub set_jit_service: unsafe extern "C" fn(Ctx, service: *const AbiJitService, Err) -> i32,
}

/// Size of a 1.0 table: the smallest table the runtime accepts. Entries after it are used only
/// when the plugin's `table_size` covers them.
pub const TABLE_SIZE_1_0: usize = std::mem::offset_of!(PluginTable, jit_stats);
/// Size of a 1.1 table (1.0 plus `jit_stats`).
pub const TABLE_SIZE_1_1: usize = std::mem::offset_of!(PluginTable, set_jit_service);

// SAFETY: the table is immutable after construction and the plugin state behind `ctx` is
// `Send + Sync` (it wraps a `dyn GenericPlugin`); the header's string pointers point to
// static, never-freed C strings.
unsafe impl Send for PluginTable {}
// SAFETY: see the `Send` impl above.
unsafe impl Sync for PluginTable {}
