//! The HSA runtime (ROCr, `libhsa-runtime64.so.1`), loaded at run time: a typed binding of only
//! the calls this plugin makes, each resolved on first use.
//!
//! Why HSA and not HIP: HSA is what upstream's AMDGPU plugin uses and is the layer HIP itself
//! runs on. It loads exactly the code objects the JIT and lld make (no fat-binary wrapping), it
//! exposes the kernarg segment, queues and signals that the generic layer's model maps onto one
//! to one, and Debian 12 packages it on its own (`libhsa-runtime64-1`, 2.4 MB) where HIP pulls in
//! far more.
//!
//! Statuses become errors in one place ([`Hsa::check`]): the call, HSA's name for the status and
//! its description. A missing library or a machine without an AMD GPU is "no device" with the
//! reason in plain words.

use offload_core::{Error, Result};
use offload_plugin_common::dylib::{self, DriverLibrary, EntryPoint, Start};
use std::ffi::{c_char, c_int, c_void};

/// Variable naming the HSA runtime library to load.
pub const ENV_RUNTIME: &str = "OFFLOAD_HSA_RUNTIME";

/// The names the runtime is looked for under.
const NAMES: [&str; 2] = ["libhsa-runtime64.so.1", "libhsa-runtime64.so"];

/// `hsa_agent_t`, `hsa_signal_t`, ...: a 64-bit handle passed by value.
pub type Handle = u64;

/// `hsa_queue_t`.
#[repr(C)]
#[derive(Debug)]
pub struct Queue {
    /// `hsa_queue_type32_t`
    pub queue_type: u32,
    /// Features.
    pub features: u32,
    /// The ring of 64-byte packets.
    pub base_address: *mut c_void,
    /// Written with the new write index to tell the packet processor.
    pub doorbell_signal: Handle,
    /// Packets in the ring.
    pub size: u32,
    /// Reserved.
    pub reserved1: u32,
    /// Queue id.
    pub id: u64,
}

/// `hsa_kernel_dispatch_packet_t`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct DispatchPacket {
    /// Packet header (written last, atomically, with `setup`).
    pub header: u16,
    /// Dimensions (bits 0..1).
    pub setup: u16,
    /// Work-group size.
    pub workgroup_size: [u16; 3],
    /// Reserved.
    pub reserved0: u16,
    /// Grid size, in work items.
    pub grid_size: [u32; 3],
    /// Scratch bytes per work item.
    pub private_segment_size: u32,
    /// LDS bytes per work-group.
    pub group_segment_size: u32,
    /// The kernel descriptor's address.
    pub kernel_object: u64,
    /// The kernel arguments.
    pub kernarg_address: u64,
    /// Reserved.
    pub reserved2: u64,
    /// Decremented when the kernel has finished.
    pub completion_signal: Handle,
}

/// Callback of `hsa_iterate_agents` and friends.
pub type IterateFn = unsafe extern "C" fn(Handle, *mut c_void) -> c_int;
/// Callback of `hsa_queue_create`: called on an error of the queue.
pub type QueueErrorFn = unsafe extern "C" fn(c_int, *mut Queue, *mut c_void);

/// `HSA_STATUS_SUCCESS`
pub const SUCCESS: c_int = 0;
/// `HSA_STATUS_INFO_BREAK`
pub const INFO_BREAK: c_int = 1;
/// `HSA_STATUS_ERROR_INVALID_ALLOCATION` (a size the pool cannot give, zero or over its limit)
const INVALID_ALLOCATION: c_int = 0x1003;
/// `HSA_STATUS_ERROR_OUT_OF_RESOURCES`
const OUT_OF_RESOURCES: c_int = 0x1008;
/// `HSA_STATUS_ERROR_NOT_INITIALIZED`
const NOT_INITIALIZED: c_int = 0x100B;
/// `HSA_STATUS_ERROR_EXCEPTION` (a hardware exception on a queue)
const EXCEPTION: c_int = 0x1016;
/// `HSA_STATUS_ERROR_FATAL`
const FATAL: c_int = 0x1026;
/// `HSA_STATUS_ERROR_MEMORY_APERTURE_VIOLATION`: the first of AMD's queue errors
/// (`hsa_ext_amd.h`), then `HSA_STATUS_ERROR_ILLEGAL_INSTRUCTION` (42)...
const APERTURE_VIOLATION: c_int = 41;
/// ...and `HSA_STATUS_ERROR_MEMORY_FAULT`, the last.
const MEMORY_FAULT: c_int = 43;
/// `HSA_STATUS_ERROR_INVALID_SYMBOL_NAME`
pub const INVALID_SYMBOL_NAME: c_int = 0x1013;

/// The loaded runtime.
pub struct Hsa {
    lib: DriverLibrary,
    symbols: Symbols,
    status_string: EntryPoint,
}

impl std::fmt::Debug for Hsa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Hsa({})", self.lib.path())
    }
}

offload_plugin_common::driver_entry_points!(Hsa {
    /// `hsa_init`
    hsa_init() -> status;
    /// `hsa_iterate_agents`
    hsa_iterate_agents(callback: IterateFn, data: *mut c_void) -> status;
    /// `hsa_agent_get_info`
    hsa_agent_get_info(agent: Handle, attribute: c_int, value: *mut c_void) -> status;
    /// `hsa_agent_iterate_isas`
    hsa_agent_iterate_isas(agent: Handle, callback: IterateFn, data: *mut c_void) -> status;
    /// `hsa_isa_get_info_alt`
    hsa_isa_get_info_alt(isa: Handle, attribute: c_int, value: *mut c_void) -> status;
    /// `hsa_amd_agent_iterate_memory_pools`
    hsa_amd_agent_iterate_memory_pools(agent: Handle, callback: IterateFn, data: *mut c_void) -> status;
    /// `hsa_amd_memory_pool_get_info`
    hsa_amd_memory_pool_get_info(pool: Handle, attribute: c_int, value: *mut c_void) -> status;
    /// `hsa_amd_memory_pool_allocate`
    hsa_amd_memory_pool_allocate(pool: Handle, size: usize, flags: u32, ptr: *mut *mut c_void) -> status;
    /// `hsa_amd_memory_pool_free`
    hsa_amd_memory_pool_free(ptr: *mut c_void) -> status;
    /// `hsa_amd_agents_allow_access`
    hsa_amd_agents_allow_access(count: u32, agents: *const Handle, flags: *const u32, ptr: *const c_void) -> status;
    /// `hsa_amd_memory_lock`
    hsa_amd_memory_lock(host: *mut c_void, size: usize, agents: *mut Handle, count: c_int, agent_ptr: *mut *mut c_void) -> status;
    /// `hsa_amd_memory_unlock`
    hsa_amd_memory_unlock(host: *mut c_void) -> status;
    /// `hsa_amd_memory_async_copy`
    hsa_amd_memory_async_copy(dst: *mut c_void, dst_agent: Handle, src: *const c_void, src_agent: Handle, size: usize, deps: u32, dep_signals: *const Handle, completion: Handle) -> status;
    /// `hsa_signal_create`
    hsa_signal_create(initial: i64, consumers: u32, consumer_agents: *const Handle, signal: *mut Handle) -> status;
    /// `hsa_signal_destroy`
    hsa_signal_destroy(signal: Handle) -> status;
    /// `hsa_signal_store_screlease`
    hsa_signal_store_screlease(signal: Handle, value: i64) -> ();
    /// `hsa_signal_store_relaxed`
    hsa_signal_store_relaxed(signal: Handle, value: i64) -> ();
    /// `hsa_signal_wait_scacquire`
    hsa_signal_wait_scacquire(signal: Handle, condition: c_int, compare: i64, timeout_hint: u64, wait_state: c_int) -> i64;
    /// `hsa_queue_create`
    hsa_queue_create(agent: Handle, size: u32, queue_type: u32, callback: Option<QueueErrorFn>, data: *mut c_void, private_segment_size: u32, group_segment_size: u32, queue: *mut *mut Queue) -> status;
    /// `hsa_queue_destroy`
    hsa_queue_destroy(queue: *mut Queue) -> status;
    /// `hsa_queue_add_write_index_relaxed`
    hsa_queue_add_write_index_relaxed(queue: *const Queue, value: u64) -> u64;
    /// `hsa_queue_load_read_index_scacquire`
    hsa_queue_load_read_index_scacquire(queue: *const Queue) -> u64;
    /// `hsa_code_object_reader_create_from_memory`
    hsa_code_object_reader_create_from_memory(code_object: *const c_void, size: usize, reader: *mut Handle) -> status;
    /// `hsa_code_object_reader_destroy`
    hsa_code_object_reader_destroy(reader: Handle) -> status;
    /// `hsa_executable_create_alt`
    hsa_executable_create_alt(profile: c_int, rounding: c_int, options: *const c_char, executable: *mut Handle) -> status;
    /// `hsa_executable_load_agent_code_object`
    hsa_executable_load_agent_code_object(executable: Handle, agent: Handle, reader: Handle, options: *const c_char, loaded: *mut Handle) -> status;
    /// `hsa_executable_freeze`
    hsa_executable_freeze(executable: Handle, options: *const c_char) -> status;
    /// `hsa_executable_destroy`
    hsa_executable_destroy(executable: Handle) -> status;
    /// `hsa_executable_get_symbol_by_name`
    hsa_executable_get_symbol_by_name(executable: Handle, name: *const c_char, agent: *const Handle, symbol: *mut Handle) -> status;
    /// `hsa_executable_symbol_get_info`
    hsa_executable_symbol_get_info(symbol: Handle, attribute: c_int, value: *mut c_void) -> status;
    /// `hsa_amd_register_system_event_handler`
    hsa_amd_register_system_event_handler(callback: SystemEventFn, data: *mut c_void) -> status;
    /// `hsa_amd_pointer_info`
    hsa_amd_pointer_info(ptr: *const c_void, info: *mut PointerInfo, alloc: *const c_void, agents: *mut u32, accessible: *mut *mut Handle) -> status;
});

/// `hsa_amd_pointer_info_t` (the fields up to `global_flags`).
#[repr(C)]
#[derive(Debug)]
pub struct PointerInfo {
    /// The structure's size, set before the call.
    pub size: u32,
    /// `hsa_amd_pointer_type_t`.
    pub kind: u32,
    /// Where agents other than the host address the allocation.
    pub agent_base: *mut c_void,
    /// Where the host addresses it.
    pub host_base: *mut c_void,
    /// Its size.
    pub size_in_bytes: usize,
    /// The application's value.
    pub user_data: *mut c_void,
    /// The agent owning its pool.
    pub agent_owner: Handle,
    /// `hsa_amd_memory_pool_global_flag_t` bits.
    pub global_flags: u32,
}

impl Default for PointerInfo {
    fn default() -> Self {
        PointerInfo {
            size: std::mem::size_of::<PointerInfo>() as u32,
            kind: 0,
            agent_base: std::ptr::null_mut(),
            host_base: std::ptr::null_mut(),
            size_in_bytes: 0,
            user_data: std::ptr::null_mut(),
            agent_owner: 0,
            global_flags: 0,
        }
    }
}

/// `hsa_amd_pointer_type_t` values.
pub mod pointer_type {
    /// Memory the runtime allocated (`hsa_amd_memory_pool_allocate`).
    pub const HSA: u32 = 1;
    /// Host memory locked with `hsa_amd_memory_lock`.
    pub const LOCKED: u32 = 2;
}

/// `hsa_amd_event_t` for `HSA_AMD_GPU_MEMORY_FAULT_EVENT` (type 0): the agent, the virtual
/// address and the `hsa_amd_memory_fault_reason_t` bits.
#[repr(C)]
#[derive(Debug)]
pub struct SystemEvent {
    /// `hsa_amd_event_type_t`.
    pub event_type: c_int,
    /// The faulting agent.
    pub agent: Handle,
    /// The address accessed.
    pub virtual_address: u64,
    /// Why it faulted.
    pub fault_reason_mask: u32,
}

/// `HSA_AMD_GPU_MEMORY_FAULT_EVENT`
pub const MEMORY_FAULT_EVENT: c_int = 0;

/// Callback of `hsa_amd_register_system_event_handler`.
pub type SystemEventFn = unsafe extern "C" fn(*const SystemEvent, *mut c_void) -> c_int;

// `Hsa` is `Send` and `Sync` by its fields (the library and resolved addresses); calling it
// from any thread is sound because the HSA API is thread-safe.

/// Why this machine has no usable AMD GPU kernel driver, in plain words, if it has none.
pub fn kfd_problem() -> Option<String> {
    const KFD: &str = "/dev/kfd";
    match std::fs::OpenOptions::new().read(true).write(true).open(KFD) {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "{KFD} does not exist: this machine has no AMD GPU, or the amdgpu kernel driver is not loaded"
        )),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Some(format!(
            "{KFD} exists but this user may not open it ({e}): add the user to the 'render' and 'video' groups"
        )),
        Err(e) => Some(format!("{KFD} cannot be opened: {e}")),
    }
}

impl Hsa {
    /// Finds and opens the runtime (`OFFLOAD_HSA_RUNTIME`, else `libhsa-runtime64.so.1`), then
    /// `hsa_init`s it. A missing library, or a machine without an AMD GPU, is
    /// [`Error::NoDevice`] with the reason in plain words; a bad `OFFLOAD_HSA_RUNTIME` is an
    /// error naming it.
    pub fn load() -> Result<Hsa> {
        let names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
        let start = |c: &str, lib| {
            let hsa = Hsa {
                lib,
                symbols: Symbols::default(),
                status_string: EntryPoint::default(),
            };
            // SAFETY: hsa_init has no preconditions.
            match unsafe { hsa.hsa_init() } {
                Ok(()) => Start::Ready(hsa),
                Err(e) => Start::Absent(match kfd_problem() {
                    Some(why) => format!("the HSA runtime '{c}' found no AMD GPU: {why}"),
                    None => format!(
                        "the HSA runtime '{c}' failed to initialise ({})",
                        e.message()
                    ),
                }),
            }
        };
        // SAFETY: the HSA runtime's own library names, and the file its variable names (the
        // user's, trusted as the dynamic loader's search path is).
        unsafe {
            dylib::open_driver(
                ENV_RUNTIME,
                &names,
                "the HSA runtime (ROCm)",
                "install it (Debian: apt install libhsa-runtime64-1)",
                start,
            )
        }
    }

    /// The library's path (as it was opened).
    pub fn path(&self) -> &str {
        self.lib.path()
    }

    /// HSA's description of a status.
    fn status_text(&self, status: c_int) -> Option<String> {
        self.lib
            .status_text(&self.status_string, c"hsa_status_string", status)
    }

    /// Turns a status into a result; `call` names the call (or what reported the status) for
    /// the message, which also carries HSA's name and description of the status. The whole
    /// mapping, by status alone:
    ///
    /// - `SUCCESS`, `INFO_BREAK` (an iteration stopped on purpose): `Ok`;
    /// - `OUT_OF_RESOURCES`, `INVALID_ALLOCATION` (a pool cannot give that size):
    ///   [`Error::OutOfMemory`];
    /// - `NOT_INITIALIZED`: [`Error::NoDevice`];
    /// - `INVALID_SYMBOL_NAME`: [`Error::NotFound`] (no such kernel or global; every other
    ///   failure of a symbol lookup keeps its own kind);
    /// - `EXCEPTION`, the AMD queue faults (aperture violation, illegal instruction, memory
    ///   fault) and `FATAL`: [`Error::DeviceFailure`], the queue or device is unusable;
    /// - anything else: [`Error::Driver`] with the code.
    pub fn check(&self, status: c_int, call: &str) -> Result<()> {
        if status == SUCCESS || status == INFO_BREAK {
            return Ok(());
        }
        let text = self
            .status_text(status)
            .unwrap_or_else(|| format!("HSA status {status:#x}"));
        Err(error_of(status, call, &text))
    }
}

/// [`Hsa::check`]'s mapping of a failed status, with the runtime's `text` for it.
fn error_of(status: c_int, call: &str, text: &str) -> Error {
    match status {
        OUT_OF_RESOURCES | INVALID_ALLOCATION => Error::OutOfMemory(format!("{call}: {text}")),
        NOT_INITIALIZED => Error::NoDevice(format!("{call}: {text}")),
        INVALID_SYMBOL_NAME => Error::NotFound(format!("{call}: {text}")),
        EXCEPTION | FATAL | APERTURE_VIOLATION..=MEMORY_FAULT => {
            Error::DeviceFailure(format!("{call}: {text}"))
        }
        code => Error::Driver {
            code: i64::from(code),
            message: format!("{call} failed: {text}"),
        },
    }
}

/// `hsa_agent_info_t` and AMD extensions used.
pub mod agent_info {
    /// `HSA_AGENT_INFO_NAME` (char[64])
    pub const NAME: i32 = 0;
    /// `HSA_AGENT_INFO_FEATURE` (hsa_agent_feature_t bits)
    pub const FEATURE: i32 = 2;
    /// `HSA_AGENT_FEATURE_KERNEL_DISPATCH`
    pub const FEATURE_KERNEL_DISPATCH: u32 = 1;
    /// `HSA_AGENT_INFO_WAVEFRONT_SIZE` (u32)
    pub const WAVEFRONT_SIZE: i32 = 6;
    /// `HSA_AGENT_INFO_WORKGROUP_MAX_DIM` (u16[3])
    pub const WORKGROUP_MAX_DIM: i32 = 7;
    /// `HSA_AGENT_INFO_WORKGROUP_MAX_SIZE` (u32)
    pub const WORKGROUP_MAX_SIZE: i32 = 8;
    /// `HSA_AGENT_INFO_GRID_MAX_DIM` (u32[3])
    pub const GRID_MAX_DIM: i32 = 9;
    /// `HSA_AGENT_INFO_QUEUE_MAX_SIZE` (u32)
    pub const QUEUE_MAX_SIZE: i32 = 14;
    /// `HSA_AGENT_INFO_DEVICE` (hsa_device_type_t)
    pub const DEVICE: i32 = 17;
    /// `HSA_AMD_AGENT_INFO_COMPUTE_UNIT_COUNT` (u32)
    pub const COMPUTE_UNIT_COUNT: i32 = 0xA002;
    /// `HSA_AMD_AGENT_INFO_PRODUCT_NAME` (char[64])
    pub const PRODUCT_NAME: i32 = 0xA009;
    /// `HSA_DEVICE_TYPE_CPU`
    pub const DEVICE_CPU: u32 = 0;
    /// `HSA_DEVICE_TYPE_GPU`
    pub const DEVICE_GPU: u32 = 1;
    /// `HSA_ISA_INFO_NAME` (char[name length])
    pub const ISA_NAME: i32 = 1;
    /// `HSA_ISA_INFO_NAME_LENGTH` (u32)
    pub const ISA_NAME_LENGTH: i32 = 0;
}

/// `hsa_amd_memory_pool_info_t` values and flags used.
pub mod pool_info {
    /// `HSA_AMD_MEMORY_POOL_INFO_SEGMENT`
    pub const SEGMENT: i32 = 0;
    /// `HSA_AMD_MEMORY_POOL_INFO_GLOBAL_FLAGS`
    pub const GLOBAL_FLAGS: i32 = 1;
    /// `HSA_AMD_MEMORY_POOL_INFO_SIZE` (usize)
    pub const SIZE: i32 = 2;
    /// `HSA_AMD_MEMORY_POOL_INFO_RUNTIME_ALLOC_ALLOWED` (bool)
    pub const RUNTIME_ALLOC_ALLOWED: i32 = 5;
    /// `HSA_AMD_SEGMENT_GLOBAL`
    pub const SEGMENT_GLOBAL: u32 = 0;
    /// `HSA_AMD_SEGMENT_GROUP` (LDS)
    pub const SEGMENT_GROUP: u32 = 3;
    /// `HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_KERNARG_INIT`
    pub const FLAG_KERNARG_INIT: u32 = 1;
    /// `HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_FINE_GRAINED`
    pub const FLAG_FINE_GRAINED: u32 = 2;
    /// `HSA_AMD_MEMORY_POOL_GLOBAL_FLAG_COARSE_GRAINED`
    pub const FLAG_COARSE_GRAINED: u32 = 4;
}

/// `hsa_executable_symbol_info_t` values used.
pub mod symbol_info {
    /// `HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_SIZE` (u32)
    pub const VARIABLE_SIZE: i32 = 9;
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_KERNARG_SEGMENT_SIZE` (u32)
    pub const KERNARG_SEGMENT_SIZE: i32 = 11;
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_GROUP_SEGMENT_SIZE` (u32)
    pub const GROUP_SEGMENT_SIZE: i32 = 13;
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_PRIVATE_SEGMENT_SIZE` (u32)
    pub const PRIVATE_SEGMENT_SIZE: i32 = 14;
    /// `HSA_EXECUTABLE_SYMBOL_INFO_VARIABLE_ADDRESS` (u64)
    pub const VARIABLE_ADDRESS: i32 = 21;
    /// `HSA_EXECUTABLE_SYMBOL_INFO_KERNEL_OBJECT` (u64)
    pub const KERNEL_OBJECT: i32 = 22;
}

/// AQL and signal constants used.
pub mod aql {
    /// `HSA_PACKET_TYPE_KERNEL_DISPATCH`
    pub const PACKET_TYPE_KERNEL_DISPATCH: u16 = 2;
    /// `HSA_PACKET_TYPE_INVALID`
    pub const PACKET_TYPE_INVALID: u16 = 1;
    /// `HSA_PACKET_HEADER_TYPE` (bit offset)
    pub const HEADER_TYPE: u16 = 0;
    /// `HSA_PACKET_HEADER_BARRIER` (bit offset)
    pub const HEADER_BARRIER: u16 = 8;
    /// `HSA_PACKET_HEADER_SCACQUIRE_FENCE_SCOPE` (bit offset)
    pub const HEADER_ACQUIRE_FENCE_SCOPE: u16 = 9;
    /// `HSA_PACKET_HEADER_SCRELEASE_FENCE_SCOPE` (bit offset)
    pub const HEADER_RELEASE_FENCE_SCOPE: u16 = 11;
    /// `HSA_FENCE_SCOPE_SYSTEM`
    pub const FENCE_SCOPE_SYSTEM: u16 = 2;
    /// `HSA_KERNEL_DISPATCH_PACKET_SETUP_DIMENSIONS` (bit offset)
    pub const SETUP_DIMENSIONS: u16 = 0;
    /// `HSA_QUEUE_TYPE_MULTIPLE`
    pub const QUEUE_TYPE_MULTIPLE: u32 = 0;
    /// `HSA_SIGNAL_CONDITION_LT`
    pub const CONDITION_LT: i32 = 2;
    /// `HSA_WAIT_STATE_BLOCKED`
    pub const WAIT_BLOCKED: i32 = 0;
    /// `HSA_PROFILE_FULL`
    pub const PROFILE_FULL: i32 = 1;
    /// `HSA_DEFAULT_FLOAT_ROUNDING_MODE_DEFAULT`
    pub const ROUNDING_DEFAULT: i32 = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_errors_by_status_alone() {
        let kind = |status| match error_of(status, "hsa_some_call", "text") {
            Error::OutOfMemory(m) => {
                assert_eq!(m, "hsa_some_call: text");
                "oom"
            }
            Error::NoDevice(_) => "no-device",
            Error::NotFound(m) => {
                assert_eq!(m, "hsa_some_call: text");
                "not-found"
            }
            Error::DeviceFailure(m) => {
                assert!(m.starts_with("hsa_some_call: "), "{m}");
                "device-failure"
            }
            Error::Driver { code, message } => {
                assert_eq!(code, i64::from(status));
                assert_eq!(message, "hsa_some_call failed: text");
                "driver"
            }
            other => panic!("{other:?}"),
        };
        // The same status gives the same kind whatever the call is named.
        for (status, want) in [
            (0x1008, "oom"),
            (0x1003, "oom"),
            (0x100B, "no-device"),
            (0x1016, "device-failure"),
            (0x1026, "device-failure"),
            (41, "device-failure"),
            (42, "device-failure"),
            (43, "device-failure"),
            (40, "driver"),
            (44, "driver"),
            (0x1001, "driver"),
            (0x1013, "not-found"),
            (0x1014, "driver"),
        ] {
            assert_eq!(kind(status), want, "status {status:#x}");
        }
    }
}
