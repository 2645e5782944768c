//! # offload
//!
//! The runtime programs link: it finds backend plugin libraries, loads them through the C
//! plugin ABI, initialises each on first need, and routes a device image to the plugin that
//! serves its ELF machine and then to a compatible device.
//!
//! ```
//! use offload::{LaunchDims, Runtime};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("offload-doctest-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # std::fs::write(dir.join("saxpy.c"), "#include \"offload_kernel.h\"\n\
//! #   OFFLOAD_KERNEL void saxpy(int n, float a, const float *x, float *y) {\n\
//! #     unsigned i = offload_global_id_x(); if (i < (unsigned)n) y[i] = a * x[i] + y[i]; }\n\
//! #   OFFLOAD_PARAMS(saxpy, int n, float a, const float x[n], float y[n]);\n")?;
//! # let kernels = offload_build::Build::new()
//! #     .file(dir.join("saxpy.c"))
//! #     .include(concat!(env!("CARGO_MANIFEST_DIR"), "/../../include"))
//! #     .compile_to(&dir, "saxpy")?;
//! # let image = std::fs::read(&kernels)?;
//! // kernels/saxpy.c:
//! //   OFFLOAD_KERNEL void saxpy(int n, float a, const float *x, float *y) { ... }
//! //   OFFLOAD_PARAMS(saxpy, int n, float a, const float x[n], float y[n]);
//! // compiled by build.rs with offload_build::Build::new().file("kernels/saxpy.c").compile("saxpy")
//! let rt = Runtime::builder().build()?; // fails, naming where it looked, if no plugin is found
//! let device = rt.default_device()?; // a GPU if there is one, else the host; or device_by_spec("cuda:1")
//! // The one `unsafe` call: the image's code runs and its parameter record is believed. In a
//! // crate: device.load_trusted(offload::include_kernels!("saxpy")).
//! // SAFETY: the kernel above, whose record is true to its code.
//! let program = unsafe { device.load_trusted(&image) }?;
//! let x: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//! let dx = device.upload(&x)?;
//! let mut dy = device.alloc::<f32>(x.len())?;
//! dy.fill(1.0)?;
//! program
//!     .kernel("saxpy")?
//!     .launch(LaunchDims::for_elems(x.len() as u64, 256)?)
//!     .arg(x.len() as i32)
//!     .arg(2.0f32)
//!     .arg(&dx)
//!     .arg(&mut dy)
//!     .run()?; // checked: a buffer shorter than n is refused, naming the parameter
//! let y: Vec<f32> = dy.to_vec()?;
//! assert_eq!(y[10], 21.0);
//! # Ok(()) }
//! ```

mod buffer;
mod device;
pub mod diagnostics;
mod discovery;
mod json;
mod launch;
pub mod params;
mod plugins;
mod program;
mod queue;
pub mod raw;
mod route;
mod runtime;
mod typed;

pub use crate::params::{CType, KernelParams, Param, ParamKind, Pointer};
pub use buffer::{BufferView, BufferViewMut, HostBuffer};
pub use launch::{KernelArgument, Launch, LaunchQueue, Unchecked};
pub use typed::{In, Out, ParamType, ParamTypes, ParamValue, ParamValues, TypedKernel};

pub use buffer::{DeviceBuffer, DeviceCopy};
pub use device::Device;
pub use discovery::{
    ENV_PLUGIN_PATH, ENV_PLUGINS, PLUGIN_PREFIX, PLUGIN_SUFFIX, default_plugin_dirs, dirs_beside,
    plugin_filter, plugin_path_entries,
};
/// The vocabulary crate, for what the device API's traits name beyond the re-exports above.
pub use offload_core;
pub use offload_core::{
    DeviceInfo, DeviceKind, DeviceLimits, DevicePtr, Error, ErrorKind, EventHandle, GenericDevice,
    GenericPlugin, GlobalSymbol, ImageClaim, JitStats, KernelArg, KernelHandle, LaunchDims,
    MemoryKind, ProgramHandle, QueueHandle, Result, ScalarType,
};
pub use offload_jit_client::{DiskMode, JitClient};
pub use plugins::{PluginSlot, PluginStatus, jit_client};
pub use program::{Kernel, Program};
pub use queue::{Event, Queue, QueueScope};
pub use runtime::{ENV_DEFAULT_DEVICE, LINKED, Runtime, RuntimeBuilder};

/// The kernel container `offload_build::Build::compile("<name>")` wrote in this crate's build
/// script, embedded: `unsafe { device.load_trusted(offload::include_kernels!("saxpy")) }?`
/// loads the image for that device (its native one, else bitcode through the JIT).
#[macro_export]
macro_rules! include_kernels {
    ($name:literal) => {
        include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".offload")) as &[u8]
    };
}

/// With the `bytemuck` feature: implements [`DeviceCopy`] for types that are `bytemuck::Pod`
/// (no padding, every bit pattern valid, no pointers: `DeviceCopy`'s contract), so that plain
/// data structs cross to the device without `unsafe` in the program:
///
/// ```ignore
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// #[repr(C)]
/// struct Particle { pos: [f32; 3], id: u32 }
/// offload::device_copy_pod!(Particle);
/// ```
#[cfg(feature = "bytemuck")]
#[macro_export]
macro_rules! device_copy_pod {
    ($($t:ty),* $(,)?) => { $(
        const _: () = {
            fn pod<T: $crate::__bytemuck::Pod + Send + Sync>() {}
            let _ = pod::<$t>;
        };
        // SAFETY: the type is `bytemuck::Pod` (checked at compile time above): Copy, no
        // padding, every bit pattern (all zeros included) valid, no pointers; and Send + Sync.
        unsafe impl $crate::DeviceCopy for $t {}
    )* };
}

#[cfg(feature = "bytemuck")]
#[doc(hidden)]
pub use bytemuck as __bytemuck;
