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
//!   them as [`offload_core::Error::PluginPanic`].
//! - ABI 1.2 adds `set_jit_service`: the runtime hands every plugin its process-wide JIT
//!   ([`AbiJitService`]), so all plugins of a process share one JIT worker and one cache.
//! - ABI 1.3 adds events (create, record, wait, synchronize, query, destroy),
//!   `image_claims` (what image kinds a plugin serves) and `plugin_properties` (facts for
//!   `offload info`).
//! - ABI 1.4 adds the kernel-argument kind `word` ([`offload_core::KernelArg::Word`]): one
//!   pointer-sized value passed as the kernel's parameter is declared (OpenMP's convention).
//! - ABI 1.5 adds `event_elapsed`: the time between two completed events.
//! - ABI 1.6 adds `host_access`: a device's memory visited as the process's own, where it is
//!   (the host backend's), so a proxy receives bytes straight into it.
//! - The runtime never forms a reference to a plugin's table: it copies the `table_size`
//!   bytes the plugin declares into a zeroed table of its own (entries a shorter, older table
//!   lacks stay null), and refuses a table whose version requires an entry that is null.
//!
//! Plugin authors never write this FFI by hand: see [`crate::export_plugin!`]. The runtime side
//! is [`loader`].

pub mod export;
pub mod loader;

/// The ground floor the ABI carries (for the export macro's paths).
pub use offload_core;

use std::ffi::{c_char, c_void};

/// `b"OFFLDPLG"` read as a little-endian `u64`.
pub const ABI_MAGIC: u64 = u64::from_le_bytes(*b"OFFLDPLG");
/// Major ABI version: tables with another major version are refused.
pub const ABI_MAJOR: u16 = 1;
/// Minor ABI version: a larger minor only appends entries to the table.
pub const ABI_MINOR: u16 = 6;
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

/// Numeric part of [`offload_core::DeviceInfo`].
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

/// One kernel argument: a kind code from [`offload_core::types::arg_kind`] and its bits.
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

/// The types of the table's entries, one per function.
pub mod entry {
    use super::*;
    /// `init(ctx, out_count, err)`
    pub type Init = unsafe extern "C" fn(Ctx, out_count: *mut u32, Err) -> i32;
    /// `check_image(ctx, image, len, err)`
    pub type CheckImage = unsafe extern "C" fn(Ctx, image: *const u8, len: usize, Err) -> i32;
    /// `device_check_image(ctx, dev, image, len, err)`
    pub type DeviceCheckImage =
        unsafe extern "C" fn(Ctx, dev: u32, image: *const u8, len: usize, Err) -> i32;
    /// `device_info(ctx, dev, out, name, compute_unit, features, err)`
    pub type DeviceInfo = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        out: *mut AbiDeviceInfo,
        name: *const AbiStringOut,
        compute_unit: *const AbiStringOut,
        features: *const AbiStringOut,
        Err,
    ) -> i32;
    /// `load_image(ctx, dev, image, len, out, err)`
    pub type LoadImage = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        image: *const u8,
        len: usize,
        out: *mut u64,
        Err,
    ) -> i32;
    /// `unload_image(ctx, dev, program, err)`
    pub type UnloadImage = unsafe extern "C" fn(Ctx, dev: u32, program: u64, Err) -> i32;
    /// `get_kernel(ctx, dev, program, name, name_len, out, err)`
    pub type GetKernel = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        program: u64,
        name: *const u8,
        name_len: usize,
        out: *mut u64,
        Err,
    ) -> i32;
    /// `get_global(ctx, dev, program, name, name_len, out_ptr, out_size, err)`
    pub type GetGlobal = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        program: u64,
        name: *const u8,
        name_len: usize,
        out_ptr: *mut u64,
        out_size: *mut u64,
        Err,
    ) -> i32;
    /// `alloc(ctx, dev, size, kind, out, err)`
    pub type Alloc =
        unsafe extern "C" fn(Ctx, dev: u32, size: u64, kind: u32, out: *mut u64, Err) -> i32;
    /// `free(ctx, dev, ptr, err)`
    pub type Free = unsafe extern "C" fn(Ctx, dev: u32, ptr: u64, Err) -> i32;
    /// `copy_to_device(ctx, dev, dst, src, len, queue, err)`
    pub type CopyToDevice = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        dst: u64,
        src: *const u8,
        len: usize,
        queue: u64,
        Err,
    ) -> i32;
    /// `copy_from_device(ctx, dev, dst, src, len, queue, err)`
    pub type CopyFromDevice = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        dst: *mut u8,
        src: u64,
        len: usize,
        queue: u64,
        Err,
    ) -> i32;
    /// `copy_device_to_device(ctx, dev, dst, src, len, queue, err)`
    pub type CopyDeviceToDevice =
        unsafe extern "C" fn(Ctx, dev: u32, dst: u64, src: u64, len: u64, queue: u64, Err) -> i32;
    /// `launch(ctx, dev, kernel, dims, args, nargs, queue, err)`
    pub type Launch = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        kernel: u64,
        dims: *const AbiLaunchDims,
        args: *const AbiKernelArg,
        nargs: usize,
        queue: u64,
        Err,
    ) -> i32;
    /// `queue_create(ctx, dev, out, err)` and `event_create`
    pub type Create = unsafe extern "C" fn(Ctx, dev: u32, out: *mut u64, Err) -> i32;
    /// `queue_synchronize(ctx, dev, queue, err)`, `queue_destroy`, `event_synchronize`,
    /// `event_destroy`
    pub type OnHandle = unsafe extern "C" fn(Ctx, dev: u32, handle: u64, Err) -> i32;
    /// `jit_stats(ctx, out, err)`
    pub type JitStats = unsafe extern "C" fn(Ctx, out: *mut offload_core::JitStats, Err) -> i32;
    /// `set_jit_service(ctx, service, err)`
    pub type SetJitService = unsafe extern "C" fn(Ctx, service: *const AbiJitService, Err) -> i32;
    /// `event_record(ctx, dev, event, queue, err)` and `event_wait`
    pub type EventOnQueue = unsafe extern "C" fn(Ctx, dev: u32, event: u64, queue: u64, Err) -> i32;
    /// `event_query(ctx, dev, event, out_done, err)`
    pub type EventQuery =
        unsafe extern "C" fn(Ctx, dev: u32, event: u64, out: *mut u32, Err) -> i32;
    /// `event_elapsed(ctx, dev, start, end, out_ns, err)`: nanoseconds from `start`'s completion
    /// to `end`'s.
    pub type EventElapsed =
        unsafe extern "C" fn(Ctx, dev: u32, start: u64, end: u64, out_ns: *mut u64, Err) -> i32;
    /// `host_access(ctx, dev, ptr, len, visit, visit_ctx, err)`: calls `visit(visit_ctx,
    /// addr, len)` once with the address at which this process reads and writes the device
    /// memory `ptr..ptr+len`, until `visit` returns; fails with `Unsupported` (not calling
    /// `visit`) for a device whose memory the process cannot address. A non-zero `visit`
    /// status fails the call.
    pub type HostAccess = unsafe extern "C" fn(
        Ctx,
        dev: u32,
        ptr: u64,
        len: u64,
        visit: AbiVisit,
        visit_ctx: *mut c_void,
        Err,
    ) -> i32;
    /// What [`HostAccess`] calls: `0`, or non-zero to fail the access.
    pub type AbiVisit =
        unsafe extern "C" fn(visit_ctx: *mut c_void, addr: *mut u8, len: u64) -> i32;
    /// `image_claims(ctx, out, err)`: one claim per line (`elf:62`, `bitcode:<triple>`, `ptx`,
    /// `fatbin`).
    pub type ImageClaims = unsafe extern "C" fn(Ctx, out: *const AbiStringOut, Err) -> i32;
}

/// The function table a plugin exports. Fields after the header may only ever be appended.
/// Every entry is nullable on the wire (`Option` of a function pointer has the layout of a
/// nullable C function pointer); the runtime refuses a table whose version requires an entry
/// that is null, naming it.
#[repr(C)]
#[derive(Debug)]
pub struct PluginTable {
    /// Versioned header, checked before anything else.
    pub header: AbiHeader,
    /// Opaque plugin state, passed back as the first argument of every entry.
    pub ctx: Ctx,
    /// Initialise; writes the device count.
    pub init: Option<entry::Init>,
    /// Plugin-level image compatibility.
    pub check_image: Option<entry::CheckImage>,
    /// Device-level image compatibility.
    pub device_check_image: Option<entry::DeviceCheckImage>,
    /// Device information: numbers, then name, compute-unit kind and features as strings.
    pub device_info: Option<entry::DeviceInfo>,
    /// Load an image; writes the program handle.
    pub load_image: Option<entry::LoadImage>,
    /// Unload a program.
    pub unload_image: Option<entry::UnloadImage>,
    /// Look up a kernel; writes its handle.
    pub get_kernel: Option<entry::GetKernel>,
    /// Look up a global; writes its address and size.
    pub get_global: Option<entry::GetGlobal>,
    /// Allocate device memory.
    pub alloc: Option<entry::Alloc>,
    /// Free device memory.
    pub free: Option<entry::Free>,
    /// Host to device copy.
    pub copy_to_device: Option<entry::CopyToDevice>,
    /// Device to host copy.
    pub copy_from_device: Option<entry::CopyFromDevice>,
    /// Device to device copy.
    pub copy_device_to_device: Option<entry::CopyDeviceToDevice>,
    /// Launch a kernel.
    pub launch: Option<entry::Launch>,
    /// Create a queue; writes its handle.
    pub queue_create: Option<entry::Create>,
    /// Wait for a queue.
    pub queue_synchronize: Option<entry::OnHandle>,
    /// Destroy a queue.
    pub queue_destroy: Option<entry::OnHandle>,
    // ---- ABI 1.1 ----
    /// JIT counters; fails with `Unsupported` for a plugin without a JIT client of its own.
    pub jit_stats: Option<entry::JitStats>,
    // ---- ABI 1.2 ----
    /// Offers the runtime's JIT service (called before `init`); fails with `Unsupported` for a
    /// plugin that compiles nothing. The pointer stays valid for the rest of the process.
    pub set_jit_service: Option<entry::SetJitService>,
    // ---- ABI 1.3 ----
    /// The image kinds the plugin serves.
    pub image_claims: Option<entry::ImageClaims>,
    /// Create an event; writes its handle.
    pub event_create: Option<entry::Create>,
    /// Record an event on a queue (it completes when the work enqueued before it does).
    pub event_record: Option<entry::EventOnQueue>,
    /// Make a queue wait for an event before its later work.
    pub event_wait: Option<entry::EventOnQueue>,
    /// Wait on the calling thread until an event completes.
    pub event_synchronize: Option<entry::OnHandle>,
    /// Whether an event has completed (writes 1 or 0).
    pub event_query: Option<entry::EventQuery>,
    /// Destroy an event.
    pub event_destroy: Option<entry::OnHandle>,
    /// Facts about the plugin for `offload info` (`key=value` lines: which driver library it
    /// loaded, which `ptxas` it uses, ...).
    pub plugin_properties: Option<entry::ImageClaims>,
    // ---- ABI 1.5 ----
    /// The time from one completed event to another (writes nanoseconds).
    pub event_elapsed: Option<entry::EventElapsed>,
    // ---- ABI 1.6 ----
    /// Visits device memory as the process's own, where it is.
    pub host_access: Option<entry::HostAccess>,
}

/// Size of a 1.0 table: the smallest table the runtime accepts. Entries after it are used only
/// when the plugin's `table_size` covers them.
pub const TABLE_SIZE_1_0: usize = std::mem::offset_of!(PluginTable, jit_stats);
/// Size of a 1.1 table (1.0 plus `jit_stats`).
pub const TABLE_SIZE_1_1: usize = std::mem::offset_of!(PluginTable, set_jit_service);
/// Size of a 1.2 table (1.1 plus `set_jit_service`).
pub const TABLE_SIZE_1_2: usize = std::mem::offset_of!(PluginTable, image_claims);
/// Size of a 1.3 table (and of 1.4, which added no entry).
pub const TABLE_SIZE_1_3: usize = std::mem::offset_of!(PluginTable, event_elapsed);
/// Size of a 1.5 table (1.3 plus `event_elapsed`).
pub const TABLE_SIZE_1_5: usize = std::mem::offset_of!(PluginTable, host_access);
/// Size of a 1.6 table (this version).
pub const TABLE_SIZE_1_6: usize = std::mem::size_of::<PluginTable>();
/// Largest `table_size` the runtime believes (a bigger one is corruption).
pub const MAX_TABLE_SIZE: usize = 64 << 10;

// SAFETY: the table is immutable after construction and the plugin state behind `ctx` is
// `Send + Sync` (it wraps a `dyn GenericPlugin`); the header's string pointers point to
// static, never-freed C strings.
unsafe impl Send for PluginTable {}
// SAFETY: see the `Send` impl above.
unsafe impl Sync for PluginTable {}
