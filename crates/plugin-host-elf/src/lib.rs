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
//! - LLVM bitcode (or textual IR) for the host triple is compiled by the plugin's JIT engine
//!   for the exact host CPU, linked into a shared object with lld, cached by content and then
//!   loaded like any other image; all devices share the engine, so they compile once.

mod device;
mod launch;
mod memory;
mod program;
mod queue;

use device::HostDevice;
use offload_core::image::{ElfRequirements, elf_type, machine};
use offload_core::{ElfImage, Error, GenericDevice, GenericPlugin, JitStats, Result};
use offload_jit::{JitEngine, JitTarget, LinkSharedObject};
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

/// The JIT state shared by all host devices.
#[derive(Debug)]
pub(crate) struct HostJit {
    pub engine: JitEngine,
    pub target: JitTarget,
    /// Made on first use: finding lld costs a process start, and ELF-only users never need it.
    pub link: OnceLock<Result<LinkSharedObject>>,
}

impl HostJit {
    /// Whether the bytes are JIT input (bitcode or IR) rather than an ELF image.
    pub fn is_input(bytes: &[u8]) -> bool {
        JitEngine::is_jit_input(bytes)
    }

    /// Compiles (or finds in the cache) the shared object for `bitcode`.
    pub fn compile(&self, bitcode: &[u8]) -> Result<offload_jit::JitOutput> {
        let link = self
            .link
            .get_or_init(LinkSharedObject::host)
            .as_ref()
            .map_err(Clone::clone)?;
        self.engine.compile(bitcode, &self.target, link)
    }
}

/// The host plugin.
#[derive(Debug, Default)]
pub struct HostPlugin {
    devices: OnceLock<Vec<Arc<HostDevice>>>,
    jit: OnceLock<Arc<HostJit>>,
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
        let (cpu, features) = offload_jit::host_cpu();
        let jit = Arc::new(HostJit {
            engine: JitEngine::new(HOST_TRIPLE)?,
            target: JitTarget {
                compute_unit_kind: cpu,
                features,
            },
            link: OnceLock::new(),
        });
        let jit = self.jit.get_or_init(|| jit).clone();
        let devices = (0..count as usize)
            .map(|i| Arc::new(HostDevice::new(i, pool.clone(), threads, jit.clone())))
            .collect();
        Ok(self.devices.get_or_init(|| devices).len())
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        check_image(self.jit.get(), image)
    }

    fn jit_stats(&self) -> Option<JitStats> {
        self.jit.get().map(|j| j.engine.stats())
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

/// Plugin- and device-level image check: bitcode/IR by triple (through the JIT engine), ELF by
/// header and structure.
pub(crate) fn check_image(jit: Option<&Arc<HostJit>>, image: &[u8]) -> Result<()> {
    if HostJit::is_input(image) {
        return match jit {
            Some(j) => j.engine.check_image(image),
            None => Err(Error::InvalidArgument(
                "host plugin used before init".into(),
            )),
        };
    }
    ElfImage::parse(image, &requirements()).map(|_| ())
}

offload_core::export_plugin!(HostPlugin::new);
