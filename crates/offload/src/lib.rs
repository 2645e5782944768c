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
//! let rt = Runtime::builder().build()?; // fails, naming where it looked, if no plugin is found
//! let device = rt.default_device()?; // a GPU if there is one, else the host; or device_by_spec("cuda:1")
//! let image = std::fs::read("saxpy.so")?;
//! let program = device.load(&image)?;
//! let saxpy = program.kernel("saxpy")?;
//! let x: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//! let dx = device.upload(&x)?;
//! let dy = device.alloc::<f32>(x.len())?;
//! dy.fill(1.0)?;
//! program.launch(
//!     saxpy,
//!     &LaunchDims::for_elems(x.len() as u64, 256)?,
//!     &[KernelArg::I32(1024), KernelArg::F32(2.0), dx.arg(), dy.arg()],
//! )?;
//! let y: Vec<f32> = dy.to_vec()?;
//! # Ok(()) }
//! ```

pub mod diagnostics;
mod discovery;
mod queue;
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
pub use queue::{Event, Queue};
pub use runtime::{
    Device, DeviceBuffer, DeviceCopy, ENV_DEFAULT_DEVICE, Kernel, PluginSlot, PluginStatus,
    Program, Runtime, RuntimeBuilder, jit_client,
};
