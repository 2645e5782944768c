//! The oneAPI Level Zero loader (`libze_loader.so.1`), opened at run time: a typed binding of
//! only the calls this plugin makes, each resolved on first use, and the structures they take,
//! laid out as `ze_api.h` (API 1.4, the loader Debian 12 ships) lays them out.
//!
//! The loader finds the GPU drivers (`libze_intel_gpu.so.1`; `ZE_ENABLE_ALT_DRIVERS` replaces
//! the list) inside the first `zeInit` and never says why none was found, so the plugin looks for
//! the default driver itself to say it ([`no_driver_reason`]). A failed `zeInit` leaves the
//! loader unusable (it unloads the driver but keeps pointing into it): after one, no other call
//! is made.
//!
//! Statuses become errors in one place ([`Ze::check`]).

use offload_core::{Error, Result};
use offload_plugin_common::dylib::{self, DriverLibrary, Start};
use std::ffi::{c_char, c_int, c_void};

/// Variable naming the Level Zero loader to open.
pub const ENV_LOADER: &str = "OFFLOAD_LEVEL_ZERO_LOADER";

/// The names the loader is looked for under.
const NAMES: [&str; 2] = ["libze_loader.so.1", "libze_loader.so"];

/// The GPU driver the loader opens when `ZE_ENABLE_ALT_DRIVERS` does not name others.
pub const DEFAULT_DRIVER: &str = "libze_intel_gpu.so.1";

/// Any Level Zero handle (`ze_driver_handle_t`, `ze_device_handle_t`, ...).
pub type Handle = *mut c_void;

/// `ZE_INIT_FLAG_GPU_ONLY`
pub const INIT_GPU_ONLY: u32 = 1;
/// `ZE_DEVICE_TYPE_GPU`
pub const DEVICE_TYPE_GPU: u32 = 1;
/// `ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE`
pub const QUEUE_GROUP_COMPUTE: u32 = 1;
/// `ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS`
pub const QUEUE_MODE_ASYNCHRONOUS: u32 = 2;
/// `ZE_EVENT_POOL_FLAG_HOST_VISIBLE`
pub const EVENT_POOL_HOST_VISIBLE: u32 = 1;
/// `ZE_EVENT_SCOPE_FLAG_HOST`
pub const EVENT_SCOPE_HOST: u32 = 4;
/// `ZE_MODULE_FORMAT_IL_SPIRV`
pub const MODULE_FORMAT_SPIRV: u32 = 0;
/// `ZE_MODULE_FORMAT_NATIVE`
pub const MODULE_FORMAT_NATIVE: u32 = 1;
/// A timeout that never ends (`UINT64_MAX`).
pub const FOREVER: u64 = u64::MAX;

/// `ze_structure_type_t` values used.
pub mod stype {
    /// `ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES`
    pub const DEVICE_PROPERTIES: u32 = 0x3;
    /// `ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES`
    pub const COMPUTE_PROPERTIES: u32 = 0x4;
    /// `ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES`
    pub const QUEUE_GROUP_PROPERTIES: u32 = 0x6;
    /// `ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES`
    pub const MEMORY_PROPERTIES: u32 = 0x7;
    /// `ZE_STRUCTURE_TYPE_CONTEXT_DESC`
    pub const CONTEXT_DESC: u32 = 0xd;
    /// `ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC`
    pub const COMMAND_QUEUE_DESC: u32 = 0xe;
    /// `ZE_STRUCTURE_TYPE_EVENT_POOL_DESC`
    pub const EVENT_POOL_DESC: u32 = 0x10;
    /// `ZE_STRUCTURE_TYPE_EVENT_DESC`
    pub const EVENT_DESC: u32 = 0x11;
    /// `ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC`
    pub const DEVICE_MEM_ALLOC_DESC: u32 = 0x15;
    /// `ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC`
    pub const HOST_MEM_ALLOC_DESC: u32 = 0x16;
    /// `ZE_STRUCTURE_TYPE_MODULE_DESC`
    pub const MODULE_DESC: u32 = 0x1b;
    /// `ZE_STRUCTURE_TYPE_KERNEL_DESC`
    pub const KERNEL_DESC: u32 = 0x1d;
    /// `ZE_STRUCTURE_TYPE_KERNEL_PROPERTIES`
    pub const KERNEL_PROPERTIES: u32 = 0x1e;
    /// `ZE_STRUCTURE_TYPE_DEVICE_IP_VERSION_EXT` (API 1.5; not in 1.4's headers)
    pub const DEVICE_IP_VERSION_EXT: u32 = 0x1000f;
}

/// `ze_result_t` values the plugin tells apart.
pub mod result {
    /// `ZE_RESULT_SUCCESS`
    pub const SUCCESS: i32 = 0;
    /// `ZE_RESULT_NOT_READY`
    pub const NOT_READY: i32 = 1;
    /// `ZE_RESULT_ERROR_DEVICE_LOST`
    pub const DEVICE_LOST: i32 = 0x7000_0001;
    /// `ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY`
    pub const OUT_OF_HOST_MEMORY: i32 = 0x7000_0002;
    /// `ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY`
    pub const OUT_OF_DEVICE_MEMORY: i32 = 0x7000_0003;
    /// `ZE_RESULT_ERROR_MODULE_BUILD_FAILURE`
    pub const MODULE_BUILD_FAILURE: i32 = 0x7000_0004;
    /// `ZE_RESULT_ERROR_MODULE_LINK_FAILURE`
    pub const MODULE_LINK_FAILURE: i32 = 0x7000_0005;
    /// `ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET`
    pub const DEVICE_REQUIRES_RESET: i32 = 0x7000_0006;
    /// `ZE_RESULT_ERROR_UNINITIALIZED`
    pub const UNINITIALIZED: i32 = 0x7800_0001;
    /// `ZE_RESULT_ERROR_UNSUPPORTED_VERSION`
    pub const UNSUPPORTED_VERSION: i32 = 0x7800_0002;
    /// `ZE_RESULT_ERROR_UNSUPPORTED_FEATURE`
    pub const UNSUPPORTED_FEATURE: i32 = 0x7800_0003;
    /// `ZE_RESULT_ERROR_INVALID_NATIVE_BINARY`
    pub const INVALID_NATIVE_BINARY: i32 = 0x7800_000f;
    /// `ZE_RESULT_ERROR_UNSUPPORTED_SIZE` (an allocation above the device's
    /// `maxMemAllocSize`, among others)
    pub const UNSUPPORTED_SIZE: i32 = 0x7800_0009;
    /// `ZE_RESULT_ERROR_INVALID_GLOBAL_NAME`
    pub const INVALID_GLOBAL_NAME: i32 = 0x7800_0010;
    /// `ZE_RESULT_ERROR_INVALID_KERNEL_NAME`
    pub const INVALID_KERNEL_NAME: i32 = 0x7800_0011;
}

/// The name `ze_api.h` gives a status.
pub fn result_name(status: c_int) -> String {
    let name = match status as u32 {
        0 => "ZE_RESULT_SUCCESS",
        1 => "ZE_RESULT_NOT_READY",
        0x7000_0001 => "ZE_RESULT_ERROR_DEVICE_LOST",
        0x7000_0002 => "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY",
        0x7000_0003 => "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
        0x7000_0004 => "ZE_RESULT_ERROR_MODULE_BUILD_FAILURE",
        0x7000_0005 => "ZE_RESULT_ERROR_MODULE_LINK_FAILURE",
        0x7000_0006 => "ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET",
        0x7000_0007 => "ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE",
        0x7001_0000 => "ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS",
        0x7001_0001 => "ZE_RESULT_ERROR_NOT_AVAILABLE",
        0x7002_0000 => "ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE",
        0x7800_0001 => "ZE_RESULT_ERROR_UNINITIALIZED",
        0x7800_0002 => "ZE_RESULT_ERROR_UNSUPPORTED_VERSION",
        0x7800_0003 => "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE",
        0x7800_0004 => "ZE_RESULT_ERROR_INVALID_ARGUMENT",
        0x7800_0005 => "ZE_RESULT_ERROR_INVALID_NULL_HANDLE",
        0x7800_0006 => "ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE",
        0x7800_0007 => "ZE_RESULT_ERROR_INVALID_NULL_POINTER",
        0x7800_0008 => "ZE_RESULT_ERROR_INVALID_SIZE",
        0x7800_0009 => "ZE_RESULT_ERROR_UNSUPPORTED_SIZE",
        0x7800_000a => "ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT",
        0x7800_000b => "ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT",
        0x7800_000c => "ZE_RESULT_ERROR_INVALID_ENUMERATION",
        0x7800_000d => "ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION",
        0x7800_000e => "ZE_RESULT_ERROR_UNSUPPORTED_IMAGE_FORMAT",
        0x7800_000f => "ZE_RESULT_ERROR_INVALID_NATIVE_BINARY",
        0x7800_0010 => "ZE_RESULT_ERROR_INVALID_GLOBAL_NAME",
        0x7800_0011 => "ZE_RESULT_ERROR_INVALID_KERNEL_NAME",
        0x7800_0012 => "ZE_RESULT_ERROR_INVALID_FUNCTION_NAME",
        0x7800_0013 => "ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION",
        0x7800_0014 => "ZE_RESULT_ERROR_INVALID_GLOBAL_WIDTH_DIMENSION",
        0x7800_0015 => "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_INDEX",
        0x7800_0016 => "ZE_RESULT_ERROR_INVALID_KERNEL_ARGUMENT_SIZE",
        0x7800_0017 => "ZE_RESULT_ERROR_INVALID_KERNEL_ATTRIBUTE_VALUE",
        0x7800_0018 => "ZE_RESULT_ERROR_INVALID_MODULE_UNLINKED",
        0x7800_0019 => "ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE",
        0x7800_001a => "ZE_RESULT_ERROR_OVERLAPPING_REGIONS",
        0x7800_001b => "ZE_RESULT_WARNING_ACTION_REQUIRED",
        0x7002_0001 => "ZE_RESULT_WARNING_DROPPED_DATA",
        0x7ff0_0001 => "ZE_RESULT_EXP_ERROR_DEVICE_IS_NOT_VERTEX",
        0x7ff0_0002 => "ZE_RESULT_EXP_ERROR_VERTEX_IS_NOT_DEVICE",
        0x7ff0_0003 => "ZE_RESULT_EXP_ERROR_REMOTE_DEVICE",
        0x7fff_fffe => "ZE_RESULT_ERROR_UNKNOWN",
        other => return format!("ze_result_t {other:#x}"),
    };
    name.to_string()
}

/// [`Ze::check`]'s mapping of a failed status, by status alone:
///
/// - `OUT_OF_HOST_MEMORY`, `OUT_OF_DEVICE_MEMORY`: [`Error::OutOfMemory`];
/// - `DEVICE_LOST`, `DEVICE_REQUIRES_RESET`: [`Error::DeviceFailure`] (a kernel faulted or the
///   GPU hung: the device's work is lost);
/// - `MODULE_BUILD_FAILURE`, `MODULE_LINK_FAILURE`, `INVALID_NATIVE_BINARY`:
///   [`Error::InvalidImage`] (the caller adds the build log);
/// - `UNINITIALIZED`: [`Error::NoDevice`];
/// - `UNSUPPORTED_VERSION`, `UNSUPPORTED_FEATURE`, `UNSUPPORTED_SIZE`: [`Error::Unsupported`];
/// - `INVALID_KERNEL_NAME`, `INVALID_GLOBAL_NAME`: [`Error::NotFound`] (no such kernel or
///   global in the module; every other failure of those lookups keeps its own kind);
/// - anything else: [`Error::Driver`] with the code.
pub fn error_of(status: c_int, call: &str) -> Error {
    use result::*;
    let text = format!("{call}: {}", result_name(status));
    match status {
        OUT_OF_HOST_MEMORY | OUT_OF_DEVICE_MEMORY => Error::OutOfMemory(text),
        DEVICE_LOST | DEVICE_REQUIRES_RESET => Error::DeviceFailure(format!(
            "{text}: the device's work is lost; restart the process"
        )),
        MODULE_BUILD_FAILURE | MODULE_LINK_FAILURE | INVALID_NATIVE_BINARY => {
            Error::InvalidImage(text)
        }
        UNINITIALIZED => Error::NoDevice(text),
        UNSUPPORTED_VERSION | UNSUPPORTED_FEATURE | UNSUPPORTED_SIZE => Error::Unsupported(text),
        INVALID_KERNEL_NAME | INVALID_GLOBAL_NAME => Error::NotFound(text),
        code => Error::Driver {
            code: i64::from(code),
            message: format!("{text} failed"),
        },
    }
}

/// `ze_device_properties_t` (368 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceProperties {
    /// `ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES`
    pub stype: u32,
    /// Extension structures (the IP version).
    pub next: *mut c_void,
    /// `ze_device_type_t`
    pub device_type: u32,
    /// PCI vendor id (0x8086).
    pub vendor_id: u32,
    /// PCI device id.
    pub device_id: u32,
    /// `ze_device_property_flags_t`
    pub flags: u32,
    /// Sub-device id.
    pub subdevice_id: u32,
    /// Clock in MHz.
    pub core_clock_rate: u32,
    /// Largest single allocation.
    pub max_mem_alloc_size: u64,
    /// Hardware contexts.
    pub max_hardware_contexts: u32,
    /// Queue priorities.
    pub max_command_queue_priority: u32,
    /// Threads per EU.
    pub num_threads_per_eu: u32,
    /// SIMD width of an EU.
    pub physical_eu_simd_width: u32,
    /// EUs per sub-slice.
    pub num_eus_per_subslice: u32,
    /// Sub-slices per slice.
    pub num_subslices_per_slice: u32,
    /// Slices.
    pub num_slices: u32,
    /// Timer resolution.
    pub timer_resolution: u64,
    /// Valid timestamp bits.
    pub timestamp_valid_bits: u32,
    /// Valid kernel timestamp bits.
    pub kernel_timestamp_valid_bits: u32,
    /// UUID.
    pub uuid: [u8; 16],
    /// Name, NUL-terminated.
    pub name: [u8; 256],
}

impl Default for DeviceProperties {
    fn default() -> Self {
        DeviceProperties {
            stype: stype::DEVICE_PROPERTIES,
            next: std::ptr::null_mut(),
            device_type: 0,
            vendor_id: 0,
            device_id: 0,
            flags: 0,
            subdevice_id: 0,
            core_clock_rate: 0,
            max_mem_alloc_size: 0,
            max_hardware_contexts: 0,
            max_command_queue_priority: 0,
            num_threads_per_eu: 0,
            physical_eu_simd_width: 0,
            num_eus_per_subslice: 0,
            num_subslices_per_slice: 0,
            num_slices: 0,
            timer_resolution: 0,
            timestamp_valid_bits: 0,
            kernel_timestamp_valid_bits: 0,
            uuid: [0; 16],
            name: [0; 256],
        }
    }
}

/// `ze_device_ip_version_ext_t` (API 1.5), chained to [`DeviceProperties`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct IpVersionExt {
    /// `ZE_STRUCTURE_TYPE_DEVICE_IP_VERSION_EXT`
    pub stype: u32,
    /// Next extension structure.
    pub next: *const c_void,
    /// The graphics IP version: architecture (bits 22..31), release (14..21), revision (0..5).
    pub ip_version: u32,
}

/// `ze_device_compute_properties_t` (88 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ComputeProperties {
    /// `ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES`
    pub stype: u32,
    /// Extension structures.
    pub next: *mut c_void,
    /// Work items per group.
    pub max_total_group_size: u32,
    /// Group size per dimension.
    pub max_group_size: [u32; 3],
    /// Groups per dimension.
    pub max_group_count: [u32; 3],
    /// Shared local memory per group, bytes.
    pub max_shared_local_memory: u32,
    /// Entries of `sub_group_sizes`.
    pub num_sub_group_sizes: u32,
    /// Supported sub-group sizes.
    pub sub_group_sizes: [u32; 8],
}

/// `ze_device_memory_properties_t` (296 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemoryProperties {
    /// `ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES`
    pub stype: u32,
    /// Extension structures.
    pub next: *mut c_void,
    /// Flags.
    pub flags: u32,
    /// Clock in MHz.
    pub max_clock_rate: u32,
    /// Bus width in bits.
    pub max_bus_width: u32,
    /// Bytes.
    pub total_size: u64,
    /// Name.
    pub name: [u8; 256],
}

/// `ze_command_queue_group_properties_t` (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct QueueGroupProperties {
    /// `ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES`
    pub stype: u32,
    /// Extension structures.
    pub next: *mut c_void,
    /// `ze_command_queue_group_property_flags_t`
    pub flags: u32,
    /// Largest fill pattern.
    pub max_memory_fill_pattern_size: usize,
    /// Queues in the group.
    pub num_queues: u32,
}

/// A descriptor with only `stype`, `pNext` and a flags word (`ze_context_desc_t`,
/// `ze_host_mem_alloc_desc_t`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct FlagsDesc {
    /// The descriptor's structure type.
    pub stype: u32,
    /// Extension structures.
    pub next: *const c_void,
    /// Flags.
    pub flags: u32,
}

/// `ze_command_queue_desc_t` (40 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CommandQueueDesc {
    /// `ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC`
    pub stype: u32,
    /// Extension structures.
    pub next: *const c_void,
    /// Queue group ordinal.
    pub ordinal: u32,
    /// Queue index in the group.
    pub index: u32,
    /// Flags.
    pub flags: u32,
    /// `ze_command_queue_mode_t`
    pub mode: u32,
    /// `ze_command_queue_priority_t`
    pub priority: u32,
}

/// `ze_device_mem_alloc_desc_t` (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DeviceMemAllocDesc {
    /// `ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC`
    pub stype: u32,
    /// Extension structures.
    pub next: *const c_void,
    /// Flags.
    pub flags: u32,
    /// Memory ordinal.
    pub ordinal: u32,
}

/// `ze_event_pool_desc_t` (24 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventPoolDesc {
    /// `ZE_STRUCTURE_TYPE_EVENT_POOL_DESC`
    pub stype: u32,
    /// Extension structures.
    pub next: *const c_void,
    /// `ze_event_pool_flags_t`
    pub flags: u32,
    /// Events in the pool.
    pub count: u32,
}

/// `ze_event_desc_t` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventDesc {
    /// `ZE_STRUCTURE_TYPE_EVENT_DESC`
    pub stype: u32,
    /// Extension structures.
    pub next: *const c_void,
    /// Index in the pool.
    pub index: u32,
    /// `ze_event_scope_flags_t` on signal.
    pub signal: u32,
    /// `ze_event_scope_flags_t` on wait.
    pub wait: u32,
}

/// `ze_module_desc_t` (56 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleDesc {
    /// `ZE_STRUCTURE_TYPE_MODULE_DESC`
    pub stype: u32,
    /// Extension structures.
    pub next: *const c_void,
    /// [`MODULE_FORMAT_SPIRV`] or [`MODULE_FORMAT_NATIVE`].
    pub format: u32,
    /// Bytes of the module.
    pub input_size: usize,
    /// The module.
    pub input: *const u8,
    /// Build flags (a C string), or null.
    pub build_flags: *const c_char,
    /// Specialisation constants, or null.
    pub constants: *const c_void,
}

/// `ze_kernel_desc_t` (32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelDesc {
    /// `ZE_STRUCTURE_TYPE_KERNEL_DESC`
    pub stype: u32,
    /// Extension structures.
    pub next: *const c_void,
    /// Flags.
    pub flags: u32,
    /// The kernel's name.
    pub name: *const c_char,
}

/// `ze_kernel_properties_t` (96 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct KernelProperties {
    /// `ZE_STRUCTURE_TYPE_KERNEL_PROPERTIES`
    pub stype: u32,
    /// Extension structures.
    pub next: *mut c_void,
    /// Parameters.
    pub num_kernel_args: u32,
    /// The group size the kernel was compiled for (`reqd_work_group_size`), or zeros.
    pub required_group_size: [u32; 3],
    /// Required sub-groups.
    pub required_num_sub_groups: u32,
    /// Required sub-group size.
    pub required_subgroup_size: u32,
    /// Largest sub-group.
    pub max_subgroup_size: u32,
    /// Most sub-groups.
    pub max_num_subgroups: u32,
    /// Shared local memory the kernel declares, bytes.
    pub local_mem_size: u32,
    /// Private memory per work item.
    pub private_mem_size: u32,
    /// Spill memory per work item.
    pub spill_mem_size: u32,
    /// Kernel and module UUIDs.
    pub uuid: [u8; 32],
}

/// `zel_component_version_t` (the loader's `zelLoaderGetVersions`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ComponentVersion {
    /// `"loader"`, a layer's name.
    pub name: [u8; 64],
    /// API version.
    pub spec_version: u32,
    /// major, minor, patch.
    pub version: [c_int; 3],
}

/// The opened loader. The entry points are the loader's exports; with one driver the loader
/// hands calls straight to it.
pub struct Ze {
    lib: DriverLibrary,
    symbols: Symbols,
}

impl std::fmt::Debug for Ze {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.lib)
    }
}

offload_plugin_common::driver_entry_points!(Ze {
    /// `zeInit`
    zeInit(flags: u32) -> status;
    /// `zeDriverGet`
    zeDriverGet(count: *mut u32, drivers: *mut Handle) -> status;
    /// `zeDeviceGet`
    zeDeviceGet(driver: Handle, count: *mut u32, devices: *mut Handle) -> status;
    /// `zeDeviceGetProperties`
    zeDeviceGetProperties(device: Handle, properties: *mut DeviceProperties) -> status;
    /// `zeDeviceGetComputeProperties`
    zeDeviceGetComputeProperties(device: Handle, properties: *mut ComputeProperties) -> status;
    /// `zeDeviceGetMemoryProperties`
    zeDeviceGetMemoryProperties(device: Handle, count: *mut u32, properties: *mut MemoryProperties) -> status;
    /// `zeDeviceGetCommandQueueGroupProperties`
    zeDeviceGetCommandQueueGroupProperties(device: Handle, count: *mut u32, properties: *mut QueueGroupProperties) -> status;
    /// `zeContextCreate`
    zeContextCreate(driver: Handle, desc: *const FlagsDesc, context: *mut Handle) -> status;
    /// `zeContextDestroy`
    zeContextDestroy(context: Handle) -> status;
    /// `zeCommandListCreateImmediate`
    zeCommandListCreateImmediate(context: Handle, device: Handle, desc: *const CommandQueueDesc, list: *mut Handle) -> status;
    /// `zeCommandListDestroy`
    zeCommandListDestroy(list: Handle) -> status;
    /// `zeCommandListAppendBarrier`: everything appended before it finishes before anything
    /// after it starts; then `signal` (if not null) is signalled.
    zeCommandListAppendBarrier(list: Handle, signal: Handle, wait_count: u32, waits: *mut Handle) -> status;
    /// `zeEventPoolCreate`
    zeEventPoolCreate(context: Handle, desc: *const EventPoolDesc, device_count: u32, devices: *mut Handle, pool: *mut Handle) -> status;
    /// `zeEventPoolDestroy`
    zeEventPoolDestroy(pool: Handle) -> status;
    /// `zeEventCreate`
    zeEventCreate(pool: Handle, desc: *const EventDesc, event: *mut Handle) -> status;
    /// `zeEventDestroy`
    zeEventDestroy(event: Handle) -> status;
    /// `zeEventHostSynchronize`
    zeEventHostSynchronize(event: Handle, timeout: u64) -> status;
    /// `zeEventHostReset`
    zeEventHostReset(event: Handle) -> status;
    /// `zeCommandListAppendMemoryCopy`
    zeCommandListAppendMemoryCopy(list: Handle, dst: *mut c_void, src: *const c_void, size: usize, signal: Handle, wait_count: u32, waits: *mut Handle) -> status;
    /// `zeCommandListAppendLaunchKernel`
    zeCommandListAppendLaunchKernel(list: Handle, kernel: Handle, groups: *const [u32; 3], signal: Handle, wait_count: u32, waits: *mut Handle) -> status;
    /// `zeMemAllocDevice`
    zeMemAllocDevice(context: Handle, desc: *const DeviceMemAllocDesc, size: usize, alignment: usize, device: Handle, ptr: *mut *mut c_void) -> status;
    /// `zeMemAllocHost`
    zeMemAllocHost(context: Handle, desc: *const FlagsDesc, size: usize, alignment: usize, ptr: *mut *mut c_void) -> status;
    /// `zeMemAllocShared`
    zeMemAllocShared(context: Handle, device_desc: *const DeviceMemAllocDesc, host_desc: *const FlagsDesc, size: usize, alignment: usize, device: Handle, ptr: *mut *mut c_void) -> status;
    /// `zeMemFree`
    zeMemFree(context: Handle, ptr: *mut c_void) -> status;
    /// `zeModuleCreate`
    zeModuleCreate(context: Handle, device: Handle, desc: *const ModuleDesc, module: *mut Handle, log: *mut Handle) -> status;
    /// `zeModuleDestroy`
    zeModuleDestroy(module: Handle) -> status;
    /// `zeModuleBuildLogGetString`
    zeModuleBuildLogGetString(log: Handle, size: *mut usize, text: *mut c_char) -> status;
    /// `zeModuleBuildLogDestroy`
    zeModuleBuildLogDestroy(log: Handle) -> status;
    /// `zeModuleGetGlobalPointer`
    zeModuleGetGlobalPointer(module: Handle, name: *const c_char, size: *mut usize, ptr: *mut *mut c_void) -> status;
    /// `zeKernelCreate`
    zeKernelCreate(module: Handle, desc: *const KernelDesc, kernel: *mut Handle) -> status;
    /// `zeKernelDestroy`
    zeKernelDestroy(kernel: Handle) -> status;
    /// `zeKernelSetArgumentValue`
    zeKernelSetArgumentValue(kernel: Handle, index: u32, size: usize, value: *const c_void) -> status;
    /// `zeKernelSetGroupSize`
    zeKernelSetGroupSize(kernel: Handle, x: u32, y: u32, z: u32) -> status;
    /// `zeKernelGetProperties`
    zeKernelGetProperties(kernel: Handle, properties: *mut KernelProperties) -> status;
    /// `zelLoaderGetVersions` (the loader's own: the components it loaded)
    zelLoaderGetVersions(count: *mut usize, versions: *mut ComponentVersion) -> status;
});

impl Ze {
    /// Opens the loader (`OFFLOAD_LEVEL_ZERO_LOADER`, else `libze_loader.so.1`) and `zeInit`s it
    /// for GPUs. A missing loader or driver is [`Error::NoDevice`] with the reason in plain
    /// words; a bad `OFFLOAD_LEVEL_ZERO_LOADER` is an error naming it.
    pub fn load() -> Result<Ze> {
        let names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
        let start = |c: &str, lib| {
            let ze = Ze {
                lib,
                symbols: Symbols::default(),
            };
            // SAFETY: zeInit has no preconditions; it is the first call.
            match unsafe { ze.zeInit(INIT_GPU_ONLY) } {
                Ok(()) => Start::Ready(ze),
                Err(e) => Start::Absent(format!(
                    "the Level Zero loader '{c}' found no usable GPU driver ({}): {}",
                    e.message(),
                    ze.no_driver_reason()
                )),
            }
        };
        // SAFETY: the Level Zero loader's own library names, and the file its variable names
        // (the user's, trusted as the dynamic loader's search path is).
        unsafe {
            dylib::open_driver(
                ENV_LOADER,
                &names,
                "the Level Zero loader",
                "install it (Debian: apt install libze1) and a GPU driver (Intel's compute runtime)",
                start,
            )
        }
    }

    /// The library's path (as it was opened).
    pub fn path(&self) -> &str {
        self.lib.path()
    }

    /// Why `zeInit` found no driver, as far as can be told: the loader says nothing itself. It
    /// lists no component when it could open no driver library; then the driver it would have
    /// opened is opened here to get the dynamic loader's reason.
    fn no_driver_reason(&self) -> String {
        let mut count = 0usize;
        // SAFETY: a count query; it reads nothing of the loader's drivers.
        let components = unsafe { self.zelLoaderGetVersions(&mut count, std::ptr::null_mut()) };
        let alt = offload_core::env::raw(&["ZE_ENABLE_ALT_DRIVERS"])
            .ok()
            .flatten()
            .map(|(_, v)| v);
        let drivers = alt.clone().unwrap_or_else(|| DEFAULT_DRIVER.to_string());
        if components.is_ok() && count > 0 {
            return format!(
                "the driver ({drivers}) was loaded, but it found no GPU or failed to start"
            );
        }
        let why: Vec<String> = drivers
            .split(',')
            .map(|d| {
                // SAFETY: the drivers the loader itself would open (its default, or the ones
                // the user's ZE_ENABLE_ALT_DRIVERS names), trusted as the loader trusts them.
                let opened = unsafe { DriverLibrary::open(d, "a Level Zero driver") };
                match opened {
                    Ok(_) => format!("{d} opens, but the loader did not accept it"),
                    Err(e) => e,
                }
            })
            .collect();
        match alt {
            Some(a) => format!(
                "no driver of ZE_ENABLE_ALT_DRIVERS='{a}' could be used: {}",
                why.join("; ")
            ),
            None => format!(
                "no GPU driver is installed ({}): this machine has no Intel GPU driver \
                 (intel-level-zero-gpu / Intel's compute runtime)",
                why.join("; ")
            ),
        }
    }

    /// Turns a status into a result (see [`error_of`]); `call` names the call.
    pub fn check(&self, status: c_int, call: &str) -> Result<()> {
        if status == result::SUCCESS {
            Ok(())
        } else {
            Err(error_of(status, call))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_those_of_ze_api_h() {
        use std::mem::{offset_of, size_of};
        assert_eq!(size_of::<DeviceProperties>(), 368);
        assert_eq!(offset_of!(DeviceProperties, max_mem_alloc_size), 40);
        assert_eq!(offset_of!(DeviceProperties, timer_resolution), 80);
        assert_eq!(offset_of!(DeviceProperties, uuid), 96);
        assert_eq!(offset_of!(DeviceProperties, name), 112);
        assert_eq!(size_of::<IpVersionExt>(), 24);
        assert_eq!(size_of::<ComputeProperties>(), 88);
        assert_eq!(offset_of!(ComputeProperties, max_shared_local_memory), 44);
        assert_eq!(offset_of!(ComputeProperties, sub_group_sizes), 52);
        assert_eq!(size_of::<MemoryProperties>(), 296);
        assert_eq!(offset_of!(MemoryProperties, total_size), 32);
        assert_eq!(size_of::<QueueGroupProperties>(), 40);
        assert_eq!(offset_of!(QueueGroupProperties, num_queues), 32);
        assert_eq!(size_of::<FlagsDesc>(), 24);
        assert_eq!(size_of::<CommandQueueDesc>(), 40);
        assert_eq!(offset_of!(CommandQueueDesc, priority), 32);
        assert_eq!(size_of::<DeviceMemAllocDesc>(), 24);
        assert_eq!(size_of::<EventPoolDesc>(), 24);
        assert_eq!(size_of::<EventDesc>(), 32);
        assert_eq!(offset_of!(EventDesc, wait), 24);
        assert_eq!(size_of::<ModuleDesc>(), 56);
        assert_eq!(offset_of!(ModuleDesc, input), 32);
        assert_eq!(offset_of!(ModuleDesc, constants), 48);
        assert_eq!(size_of::<KernelDesc>(), 32);
        assert_eq!(offset_of!(KernelDesc, name), 24);
        assert_eq!(size_of::<KernelProperties>(), 96);
        assert_eq!(offset_of!(KernelProperties, local_mem_size), 48);
        assert_eq!(offset_of!(KernelProperties, uuid), 60);
        assert_eq!(size_of::<ComponentVersion>(), 80);
    }

    #[test]
    fn statuses_map_to_errors_by_status_alone() {
        use offload_core::ErrorKind as K;
        use result::*;
        // The same status gives the same kind whatever the call is. Only "no such name" is
        // NotFound: a lookup that fails otherwise keeps its kind.
        for (status, call, kind) in [
            (OUT_OF_DEVICE_MEMORY, "zeMemAllocDevice", K::OutOfMemory),
            (OUT_OF_HOST_MEMORY, "zeMemAllocHost", K::OutOfMemory),
            (DEVICE_LOST, "zeCommandQueueSynchronize", K::DeviceFailure),
            (DEVICE_LOST, "zeKernelCreate", K::DeviceFailure),
            (MODULE_BUILD_FAILURE, "zeModuleCreate", K::InvalidImage),
            (INVALID_NATIVE_BINARY, "zeModuleCreate", K::InvalidImage),
            (UNINITIALIZED, "zeInit", K::NoDevice),
            (UNSUPPORTED_FEATURE, "zeX", K::Unsupported),
            (UNSUPPORTED_SIZE, "zeMemAllocDevice", K::Unsupported),
            (INVALID_KERNEL_NAME, "zeKernelCreate", K::NotFound),
            (INVALID_GLOBAL_NAME, "zeKernelCreate", K::NotFound),
        ] {
            assert_eq!(
                error_of(status, call).kind(),
                kind,
                "{status:#x} from {call}"
            );
        }
        let lost = error_of(DEVICE_LOST, "zeCommandQueueSynchronize");
        assert!(
            lost.message().contains("ZE_RESULT_ERROR_DEVICE_LOST"),
            "{lost}"
        );
        match error_of(0x7800_0013, "zeKernelSetGroupSize") {
            Error::Driver { code, message } => {
                assert_eq!(code, 0x7800_0013);
                assert!(
                    message.contains("ZE_RESULT_ERROR_INVALID_GROUP_SIZE_DIMENSION"),
                    "{message}"
                );
            }
            e => panic!("{e:?}"),
        }
        assert_eq!(result_name(0x1234), "ze_result_t 0x1234");
        assert_eq!(result_name(0x7002_0001), "ZE_RESULT_WARNING_DROPPED_DATA");
    }
}
