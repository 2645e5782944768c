//! The CUDA driver, loaded at run time: the calls this plugin makes, each resolved on first use
//! and checked.
//!
//! Three layers, as cudarc has them: the raw entry points (resolved lazily from the library,
//! with the types and names of `cudarc::driver::sys`), a layer where every call returns
//! `Result` ([`Driver`]'s methods), and the plugin's own safe types on top (`device.rs`).
//!
//! Why not cudarc's own call layer: its `sys` functions return `CUresult` as a Rust enum, so a
//! status the enum does not list (from a newer driver, or a stub) would be undefined behaviour;
//! and it panics when the library or a symbol is missing. Here every status is read as a plain
//! integer, a missing symbol is an error for that call (`Unsupported`, naming it), and a missing
//! library is "no device" with the reason.
//!
//! Statuses become errors in one place, [`Driver::check`], whose documentation is the whole
//! mapping.

use cudarc::driver::sys::{CUcontext, CUdevice, CUdeviceptr, CUfunction, CUmodule, CUstream};
use offload_core::{Error, Result};
use offload_plugin_common::dylib::{self, DriverLibrary, EntryPoint, Start};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Variable naming the driver library to load (default: the names cudarc knows, `libcuda.so`,
/// `libcuda.so.1`, ...).
pub const ENV_DRIVER: &str = "OFFLOAD_CUDA_DRIVER";

/// `CUDA_SUCCESS`
const SUCCESS: c_int = 0;
/// `CUDA_ERROR_INVALID_VALUE`
pub const INVALID_VALUE: c_int = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`
const OUT_OF_MEMORY: c_int = 2;
/// `CUDA_ERROR_NOT_INITIALIZED`
const NOT_INITIALIZED: c_int = 3;
/// `CUDA_ERROR_NO_DEVICE`
const NO_DEVICE: c_int = 100;
/// `CUDA_ERROR_STUB_LIBRARY`
pub const STUB_LIBRARY: c_int = 34;
/// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`: not sticky, the context stays usable.
pub const LAUNCH_OUT_OF_RESOURCES: c_int = 701;

/// Whether a status leaves the context unusable for the rest of the process ("sticky"): an
/// illegal address, a trap, a launch that failed or timed out, a hardware error. Other 7xx
/// statuses (out of resources, peer access, host registration, a cooperative launch too
/// large) fail only their call.
pub fn is_sticky(status: c_int) -> bool {
    // 214: an uncorrectable ECC error; 999: an unknown error (the driver's own state is in
    // doubt): both leave the context unusable too.
    matches!(status, 214 | 700 | 702 | 710 | 714..=719 | 999)
}

/// `CUDA_ERROR_NOT_FOUND`: a named kernel or global is not in the module.
const NOT_FOUND: c_int = 500;
/// `CUDA_ERROR_INSUFFICIENT_DRIVER`
const INSUFFICIENT_DRIVER: c_int = 35;
/// `CUDA_ERROR_SYSTEM_DRIVER_MISMATCH`
const DRIVER_MISMATCH: c_int = 803;

/// The loaded driver library.
pub struct Driver {
    lib: DriverLibrary,
    symbols: Symbols,
    error_name: EntryPoint,
    error_string: EntryPoint,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Driver({})", self.lib.path())
    }
}

offload_plugin_common::driver_entry_points!(Driver {
    /// `cuDriverGetVersion`
    cuDriverGetVersion(version: *mut c_int) -> status;
    /// `cuDeviceGetCount`
    cuDeviceGetCount(count: *mut c_int) -> status;
    /// `cuDeviceGet`
    cuDeviceGet(device: *mut CUdevice, ordinal: c_int) -> status;
    /// `cuDeviceGetName`
    cuDeviceGetName(name: *mut c_char, len: c_int, device: CUdevice) -> status;
    /// `cuDeviceTotalMem_v2`
    cuDeviceTotalMem_v2(bytes: *mut usize, device: CUdevice) -> status;
    /// `cuDeviceGetAttribute`
    cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, device: CUdevice) -> status;
    /// `cuDevicePrimaryCtxRetain`
    cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, device: CUdevice) -> status;
    /// `cuCtxSetCurrent`
    cuCtxSetCurrent(ctx: CUcontext) -> status;
    /// `cuModuleLoadData`
    cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> status;
    /// `cuModuleLoadDataEx`
    cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, count: c_uint, options: *mut c_int, values: *mut *mut c_void) -> status;
    /// `cuModuleLoadFatBinary`
    cuModuleLoadFatBinary(module: *mut CUmodule, image: *const c_void) -> status;
    /// `cuModuleUnload`
    cuModuleUnload(module: CUmodule) -> status;
    /// `cuModuleGetFunction`
    cuModuleGetFunction(function: *mut CUfunction, module: CUmodule, name: *const c_char) -> status;
    /// `cuFuncGetParamInfo` (CUDA 12.4 on)
    cuFuncGetParamInfo(f: CUfunction, index: usize, offset: *mut usize, size: *mut usize) -> status;
    /// `cuFuncGetAttribute`
    cuFuncGetAttribute(value: *mut c_int, attribute: c_int, f: CUfunction) -> status;
    /// `cuFuncSetAttribute`
    cuFuncSetAttribute(f: CUfunction, attribute: c_int, value: c_int) -> status;
    /// `cuModuleGetGlobal_v2`
    cuModuleGetGlobal_v2(ptr: *mut CUdeviceptr, bytes: *mut usize, module: CUmodule, name: *const c_char) -> status;
    /// `cuMemAlloc_v2`
    cuMemAlloc_v2(ptr: *mut CUdeviceptr, bytes: usize) -> status;
    /// `cuMemFree_v2`
    cuMemFree_v2(ptr: CUdeviceptr) -> status;
    /// `cuMemAllocHost_v2`
    cuMemAllocHost_v2(ptr: *mut *mut c_void, bytes: usize) -> status;
    /// `cuMemFreeHost`
    cuMemFreeHost(ptr: *mut c_void) -> status;
    /// `cuMemAllocManaged`
    cuMemAllocManaged(ptr: *mut CUdeviceptr, bytes: usize, flags: c_uint) -> status;
    /// `cuMemcpyHtoDAsync_v2`
    cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, bytes: usize, stream: CUstream) -> status;
    /// `cuMemcpyDtoHAsync_v2`
    cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, bytes: usize, stream: CUstream) -> status;
    /// `cuMemcpyDtoDAsync_v2`
    cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize, stream: CUstream) -> status;
    /// `cuStreamCreate`
    cuStreamCreate(stream: *mut CUstream, flags: c_uint) -> status;
    /// `cuStreamSynchronize`
    cuStreamSynchronize(stream: CUstream) -> status;
    /// `cuStreamDestroy_v2`
    cuStreamDestroy_v2(stream: CUstream) -> status;
    /// `cuLaunchKernel`
    cuLaunchKernel(f: CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void) -> status;
});

// `Driver` is `Send` and `Sync` by its fields (the library and resolved addresses); calling it
// from any thread is sound because the CUDA driver API is thread-safe.

impl Driver {
    /// Finds and opens the driver library (`OFFLOAD_CUDA_DRIVER`, else `libcuda.so.1`, the
    /// name every NVIDIA driver installs, then cudarc's other candidate names), then
    /// `cuInit`s it. A candidate that is the toolkit's stub library or has no `cuInit` is
    /// passed over for the next one (a stub directory on the loader path must not hide the
    /// driver); no usable candidate, or a driver without devices, is [`Error::NoDevice`] with
    /// the reasons; a bad `OFFLOAD_CUDA_DRIVER` is an error naming it.
    pub fn load() -> Result<Driver> {
        // libcuda.so.1 first; the unversioned name is a development link or the stub. Then
        // cudarc's names, without the Windows spellings and duplicates.
        let mut names = vec!["libcuda.so.1".to_string()];
        for n in cudarc::get_lib_name_candidates("cuda") {
            if n.starts_with("libcuda.so") && !names.contains(&n) {
                names.push(n);
            }
        }
        let start = |c: &str, lib| {
            let driver = Driver {
                lib,
                symbols: Symbols::default(),
                error_name: EntryPoint::default(),
                error_string: EntryPoint::default(),
            };
            // Called by hand, not as an entry-point method: the raw status tells the stub
            // apart.
            let init = driver.lib.address(c"cuInit").map(|addr| {
                // SAFETY: the symbol has this C signature in every CUDA driver.
                unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(c_uint) -> c_int>(addr) }
            });
            let Some(init) = init else {
                return Start::PassOver(format!("'{c}' has no cuInit (not a CUDA driver)"));
            };
            // SAFETY: cuInit has no preconditions.
            let status = unsafe { init(0) };
            match driver.check(status, "cuInit") {
                Ok(()) => Start::Ready(driver),
                Err(Error::NoDevice(why)) if status == STUB_LIBRARY => Start::PassOver(why),
                Err(Error::NoDevice(why)) => Start::Absent(why),
                // Before any context: not the "context is unusable" of a sticky status.
                Err(Error::DeviceFailure(_)) => Start::Absent(format!(
                    "the CUDA driver '{c}' failed to initialise (cuInit: {})",
                    driver.status_name(status)
                )),
                Err(e) => Start::Absent(format!(
                    "the CUDA driver '{c}' failed to initialise: {}",
                    e.message()
                )),
            }
        };
        // SAFETY: the CUDA driver's own library names, and the file its variable names (the user's,
        // trusted as the dynamic loader's search path is).
        unsafe {
            dylib::open_driver(
                ENV_DRIVER,
                &names,
                "the CUDA driver",
                "install the NVIDIA driver",
                start,
            )
        }
    }

    /// The library's path (as it was opened).
    pub fn path(&self) -> &str {
        self.lib.path()
    }

    /// The driver's name for `status` (`CUDA_ERROR_UNKNOWN`), or its number.
    fn status_name(&self, status: c_int) -> String {
        self.lib
            .status_text(&self.error_name, c"cuGetErrorName", status)
            .unwrap_or_else(|| format!("CUDA error {status}"))
    }

    /// Turns a status into a result; `call` names the driver call for the message, which
    /// also carries the driver's name and description of the status. The whole mapping, by
    /// status alone:
    ///
    /// - `SUCCESS`: `Ok`;
    /// - `OUT_OF_MEMORY`: [`Error::OutOfMemory`];
    /// - `STUB_LIBRARY` (the toolkit's stub), `NO_DEVICE`, `NOT_INITIALIZED`,
    ///   `INSUFFICIENT_DRIVER`, `SYSTEM_DRIVER_MISMATCH`: [`Error::NoDevice`], in plain words;
    /// - `NOT_FOUND`: [`Error::NotFound`] (no such kernel or global in the module; every other
    ///   failure of those lookups keeps its own kind);
    /// - the sticky statuses ([`is_sticky`]: illegal address, trap, launch failure or timeout,
    ///   hardware and ECC errors, unknown): [`Error::DeviceFailure`], the context is unusable;
    /// - `LAUNCH_OUT_OF_RESOURCES`: [`Error::Driver`] saying to launch smaller blocks;
    /// - anything else: [`Error::Driver`] with the code.
    pub fn check(&self, status: c_int, call: &str) -> Result<()> {
        if status == SUCCESS {
            return Ok(());
        }
        let name = self.status_name(status);
        let text = self
            .lib
            .status_text(&self.error_string, c"cuGetErrorString", status)
            .unwrap_or_default();
        let detail = if text.is_empty() {
            name.clone()
        } else {
            format!("{name} ({text})")
        };
        Err(match status {
            OUT_OF_MEMORY => Error::OutOfMemory(format!("{call}: {detail}")),
            NOT_FOUND => Error::NotFound(format!("{call}: {detail}")),
            STUB_LIBRARY => Error::NoDevice(format!(
                "'{}' is the CUDA toolkit's stub library, not a driver ({call}: {detail}); install \
                 the NVIDIA driver",
                self.lib.path()
            )),
            NO_DEVICE => Error::NoDevice(format!(
                "the CUDA driver '{}' reports no CUDA-capable device ({call}: {detail})",
                self.lib.path()
            )),
            NOT_INITIALIZED | INSUFFICIENT_DRIVER | DRIVER_MISMATCH => Error::NoDevice(format!(
                "the CUDA driver '{}' cannot be used ({call}: {detail})",
                self.lib.path()
            )),
            // Faults of a kernel (illegal address, trap, launch failure, ...) leave the context
            // unusable: every later call of the process on this device fails too.
            code if is_sticky(code) => Error::DeviceFailure(format!(
                "{call}: {detail}; the device's context is now unusable, restart the process"
            )),
            LAUNCH_OUT_OF_RESOURCES => Error::Driver {
                code: i64::from(status),
                message: format!(
                    "{call} failed: {detail}: the block needs more registers or shared memory \
                     than a multiprocessor has for this kernel; launch smaller blocks"
                ),
            },
            code => Error::Driver {
                code: i64::from(code),
                message: format!("{call} failed: {detail}"),
            },
        })
    }
}

/// Device attributes used (`CUdevice_attribute`).
pub mod attribute {
    /// `CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK`
    pub const MAX_THREADS_PER_BLOCK: i32 = 1;
    /// `CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X` (Y, Z follow)
    pub const MAX_BLOCK_DIM_X: i32 = 2;
    /// `CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X` (Y, Z follow)
    pub const MAX_GRID_DIM_X: i32 = 5;
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK`
    pub const MAX_SHARED_MEMORY_PER_BLOCK: i32 = 8;
    /// `CU_DEVICE_ATTRIBUTE_WARP_SIZE`
    pub const WARP_SIZE: i32 = 10;
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`
    pub const MULTIPROCESSOR_COUNT: i32 = 16;
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`
    pub const COMPUTE_CAPABILITY_MAJOR: i32 = 75;
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`
    pub const COMPUTE_CAPABILITY_MINOR: i32 = 76;
    /// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`
    pub const MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: i32 = 97;
}

/// `CUfunction_attribute` values used.
pub mod function_attribute {
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`
    pub const MAX_THREADS_PER_BLOCK: i32 = 0;
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES` (static shared memory)
    pub const SHARED_SIZE_BYTES: i32 = 1;
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`
    pub const MAX_DYNAMIC_SHARED_SIZE_BYTES: i32 = 8;
}

/// `CUjit_option` values used.
pub mod jit_option {
    /// `CU_JIT_INFO_LOG_BUFFER`
    pub const INFO_LOG_BUFFER: i32 = 3;
    /// `CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES`
    pub const INFO_LOG_BUFFER_SIZE_BYTES: i32 = 4;
    /// `CU_JIT_ERROR_LOG_BUFFER`
    pub const ERROR_LOG_BUFFER: i32 = 5;
    /// `CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES`
    pub const ERROR_LOG_BUFFER_SIZE_BYTES: i32 = 6;
}

#[cfg(test)]
mod tests {
    use cudarc::driver::sys::{CUdevice_attribute, CUjit_option};

    #[test]
    fn sticky_statuses_are_those_that_leave_the_context_unusable() {
        use cudarc::driver::sys::cudaError_enum as E;
        for e in [
            E::CUDA_ERROR_ECC_UNCORRECTABLE,
            E::CUDA_ERROR_ILLEGAL_ADDRESS,
            E::CUDA_ERROR_LAUNCH_TIMEOUT,
            E::CUDA_ERROR_HARDWARE_STACK_ERROR,
            E::CUDA_ERROR_ILLEGAL_INSTRUCTION,
            E::CUDA_ERROR_MISALIGNED_ADDRESS,
            E::CUDA_ERROR_INVALID_ADDRESS_SPACE,
            E::CUDA_ERROR_INVALID_PC,
            E::CUDA_ERROR_LAUNCH_FAILED,
            E::CUDA_ERROR_UNKNOWN,
        ] {
            assert!(super::is_sticky(e as i32), "{e:?}");
        }
        for e in [
            E::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
            E::CUDA_ERROR_NOT_FOUND,
            E::CUDA_ERROR_OUT_OF_MEMORY,
            E::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        ] {
            assert!(!super::is_sticky(e as i32), "{e:?}");
        }
        assert_eq!(super::NOT_FOUND, E::CUDA_ERROR_NOT_FOUND as i32);
    }

    /// The constants here are cudarc's (the enums they stand for must not drift).
    #[test]
    fn constants_match_cudarc() {
        use super::{attribute as a, jit_option as j};
        assert_eq!(
            a::MAX_THREADS_PER_BLOCK,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK as i32
        );
        assert_eq!(
            a::MAX_BLOCK_DIM_X,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X as i32
        );
        assert_eq!(
            a::MAX_GRID_DIM_X,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X as i32
        );
        assert_eq!(
            a::MAX_SHARED_MEMORY_PER_BLOCK,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK as i32
        );
        assert_eq!(
            a::WARP_SIZE,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_WARP_SIZE as i32
        );
        assert_eq!(
            a::MULTIPROCESSOR_COUNT,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32
        );
        assert_eq!(
            a::COMPUTE_CAPABILITY_MAJOR,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as i32
        );
        assert_eq!(
            a::COMPUTE_CAPABILITY_MINOR,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as i32
        );
        assert_eq!(
            j::INFO_LOG_BUFFER,
            CUjit_option::CU_JIT_INFO_LOG_BUFFER as i32
        );
        assert_eq!(
            j::INFO_LOG_BUFFER_SIZE_BYTES,
            CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES as i32
        );
        assert_eq!(
            j::ERROR_LOG_BUFFER,
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER as i32
        );
        assert_eq!(
            j::ERROR_LOG_BUFFER_SIZE_BYTES,
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES as i32
        );
        assert_eq!(
            super::function_attribute::MAX_DYNAMIC_SHARED_SIZE_BYTES,
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES as i32
        );
        assert_eq!(
            super::INVALID_VALUE,
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE as i32
        );
        assert_eq!(
            super::STUB_LIBRARY,
            cudarc::driver::sys::cudaError_enum::CUDA_ERROR_STUB_LIBRARY as i32
        );
    }
}
