//! # offload
//!
//! The runtime programs link: it finds backend plugin libraries, loads them through the C
//! plugin ABI, initialises each on first need, and routes a device image to the plugin that
//! serves its ELF machine and then to a compatible device.
//!
//! ```no_run
//! use offload::{Runtime, LaunchDims, KernelArg};
//! # fn main() -> offload::Result<()> {
//! let rt = Runtime::from_env()?;
//! let image = std::fs::read("saxpy.so")?;
//! let device = rt.route(&image)?;
//! let program = device.load(&image)?;
//! let kernel = program.kernel("saxpy")?;
//! let y = device.alloc_buffer(4 * 1024)?;
//! program.launch(kernel, &LaunchDims::linear(4, 256), &[KernelArg::I32(1024), KernelArg::Ptr(y.ptr())])?;
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
    DeviceInfo, DevicePtr, Error, EventHandle, GenericDevice, GenericPlugin, KernelArg,
    KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle, Result, ScalarType,
};
pub use runtime::{
    Device, DeviceBuffer, Kernel, PluginSlot, PluginStatus, Program, Runtime, jit_client,
};
