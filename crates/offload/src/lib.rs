//! # offload
//!
//! The runtime programs link: it finds backend plugin libraries, loads them through the C
//! plugin ABI, initialises each on first need, and routes a device image to the plugin that
//! serves its ELF machine and then to a compatible device.
//!
//! ```no_run
//! use offload::{KernelArg, LaunchDims, Runtime};
//! # fn main() -> offload::Result<()> {
//! // `void saxpy(int n, float a, const float *x, float *y)`, built with the kernel header.
//! let rt = Runtime::from_env()?;
//! let image = std::fs::read("saxpy.so")?;
//! let device = rt.route(&image)?; // or rt.default_device()?, rt.device_by_spec("cuda:1")?
//! let program = device.load(&image)?;
//! let kernel = program.kernel("saxpy")?;
//! let n = 1024u32;
//! let (x, y) = (device.alloc_buffer(4 * u64::from(n))?, device.alloc_buffer(4 * u64::from(n))?);
//! x.write(&vec![0u8; 4 * n as usize])?;
//! y.write(&vec![0u8; 4 * n as usize])?;
//! program.launch(
//!     kernel,
//!     &LaunchDims::for_elems(u64::from(n), 256)?,
//!     &[KernelArg::U32(n), KernelArg::F32(2.0), KernelArg::Ptr(x.ptr()), KernelArg::Ptr(y.ptr())],
//! )?;
//! # Ok(()) }
//! ```

pub mod diagnostics;
mod discovery;
mod runtime;

pub use discovery::{
    ENV_PLUGIN_PATH, ENV_PLUGINS, PLUGIN_PREFIX, PLUGIN_SUFFIX, default_plugin_dirs, dirs_beside,
    plugin_filter, plugin_path_entries,
};
pub use offload_core::{
    DeviceInfo, DeviceKind, DevicePtr, Error, EventHandle, GenericDevice, GenericPlugin, KernelArg,
    KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle, Result, ScalarType,
};
pub use offload_jit_client::DiskMode;
pub use runtime::{
    Device, DeviceBuffer, ENV_DEFAULT_DEVICE, Kernel, PluginSlot, PluginStatus, Program, Runtime,
    RuntimeBuilder, jit_client,
};
