//! # The host CPU backend
//!
//! Runs kernels compiled for the machine this process runs on (x86-64 here, aarch64 on
//! aarch64), written against `include/offload_kernel.h` and linked as ELF shared objects.
//!
//! - Images are loaded from memory through a sealed `memfd`: no file is ever written.
//! - A launch of grid G and block B runs the kernel once per work item (G·B calls). Blocks are
//!   spread over one worker pool per plugin (sized to the machine, `OFFLOAD_HOST_THREADS`
//!   overrides); the work items of a block run in order on one worker. The kernel reads its
//!   IDs from a thread-local context the header declares and the worker fills in.
//! - Arguments are passed with the real C ABI through libffi, so `float`/`double` arguments
//!   arrive in float registers.
//! - Device memory is host memory, but every copy and pointer argument is checked against the
//!   device's live allocations, so a bad pointer is an error instead of a corrupted process.
//! - `OFFLOAD_HOST_DEVICES` (default 1) sets how many devices the plugin reports, so that
//!   multi-device behaviour can be tested without a GPU.

mod device;
mod launch;
mod memory;
mod program;
mod queue;

use device::HostDevice;
use offload_core::image::{ElfRequirements, elf_type, machine};
use offload_core::{ElfImage, Error, GenericDevice, GenericPlugin, Result};
use std::sync::{Arc, OnceLock};

pub use launch::HostContext;

/// Variable that sets the number of host devices (default 1).
pub const ENV_DEVICES: &str = "OFFLOAD_HOST_DEVICES";
/// Variable that sets the number of worker threads (default: available parallelism).
pub const ENV_THREADS: &str = "OFFLOAD_HOST_THREADS";

/// LLVM target triple of this machine, as clang spells it for Linux.
pub const HOST_TRIPLE: &str = if cfg!(target_arch = "x86_64") {
    "x86_64-unknown-linux-gnu"
} else if cfg!(target_arch = "aarch64") {
    "aarch64-unknown-linux-gnu"
} else {
    "unknown-unknown-linux-gnu"
};

pub(crate) fn requirements() -> ElfRequirements<'static> {
    ElfRequirements {
        plugin: "host",
        machine: machine::host(),
        file_types: &[elf_type::DYN],
    }
}

/// The host plugin.
#[derive(Debug, Default)]
pub struct HostPlugin {
    devices: OnceLock<Vec<Arc<HostDevice>>>,
}

impl HostPlugin {
    /// A plugin that has not touched anything yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl GenericPlugin for HostPlugin {
    fn name(&self) -> &str {
        "host"
    }

    fn elf_machine(&self) -> u16 {
        machine::host()
    }

    fn target_triple(&self) -> &str {
        HOST_TRIPLE
    }

    fn init(&self) -> Result<usize> {
        if let Some(d) = self.devices.get() {
            return Ok(d.len());
        }
        let count = offload_core::env::u32_in_range(&[ENV_DEVICES], 0, 256, 1)?;
        let default_threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let threads = offload_core::env::u32_in_range(&[ENV_THREADS], 1, 1024, default_threads)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads as usize)
            .thread_name(|i| format!("offload-host-{i}"))
            .build()
            .map_err(|e| {
                Error::System(format!("cannot start {threads} host worker threads: {e}"))
            })?;
        let pool = Arc::new(pool);
        let devices = (0..count as usize)
            .map(|i| Arc::new(HostDevice::new(i, pool.clone(), threads)))
            .collect();
        Ok(self.devices.get_or_init(|| devices).len())
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        ElfImage::parse(image, &requirements()).map(|_| ())
    }

    fn device(&self, index: usize) -> Result<Arc<dyn GenericDevice>> {
        let devices = self
            .devices
            .get()
            .ok_or_else(|| Error::InvalidArgument("host plugin used before init".into()))?;
        devices
            .get(index)
            .map(|d| d.clone() as Arc<dyn GenericDevice>)
            .ok_or_else(|| Error::NotFound(format!("host device {index}")))
    }
}

offload_core::export_plugin!(HostPlugin::new);
