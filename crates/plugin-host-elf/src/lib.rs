//! # The host CPU backend
//!
//! Runs kernels compiled for the machine this process runs on (x86-64 here, aarch64 on
//! aarch64), written against `include/offload_kernel.h` and linked as ELF shared objects.
//!
//! - Images are loaded from memory through a sealed `memfd`: no file is ever written.
//! - A launch of grid G and block B runs the kernel once per work item (G·B calls). Blocks are
//!   spread over one worker pool per plugin (sized to the machine, `OFFLOAD_HOST_THREADS`
//!   overrides); the work items of a block run in order on one worker. The kernel reads its
//!   IDs from a context the plugin owns, through a function pointer it sets at load.
//! - Arguments are passed with the real C ABI through libffi, so `float`/`double` arguments
//!   arrive in float registers.
//! - Device memory is host memory, but every copy and pointer argument is checked against the
//!   device's live allocations, so a bad pointer is an error instead of a corrupted process.
//! - `OFFLOAD_HOST_DEVICES` (default 1) sets how many devices the plugin reports, so that
//!   multi-device behaviour can be tested without a GPU.
//! - LLVM bitcode (or textual IR) for the host triple is compiled by the JIT for the exact host
//!   CPU (named by LLVM's own detection, linked statically: see [`host_cpu`]), linked into a
//!   shared object with lld and loaded like any other image. Compiles go through the runtime's
//!   JIT service (one worker process and one cache for every plugin of the process); a plugin
//!   used without the runtime starts its own client. This library never links LLVM.

mod device;
mod host_cpu;
mod launch;
mod memory;
mod program;
mod queue;

use device::HostDevice;
use offload_core::image::{ElfRequirements, elf_type, machine};
use offload_core::jit::{CompileRequest, JitOutput, JitService, JitTarget, PostProcess};
use offload_core::{ElfImage, Error, GenericDevice, GenericPlugin, JitStats, Result};
use offload_jit_client::JitClient;
use std::path::PathBuf;
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

/// The directory this plugin library was loaded from (where its own JIT client looks for the
/// worker when no runtime offers one).
fn library_dir() -> Vec<PathBuf> {
    // SAFETY: dladdr only reads the loader's tables; the address is a function of this library.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(library_dir as *const libc::c_void, &mut info) == 0
            || info.dli_fname.is_null()
        {
            return Vec::new();
        }
        let path = std::ffi::CStr::from_ptr(info.dli_fname)
            .to_string_lossy()
            .into_owned();
        PathBuf::from(path)
            .parent()
            .map(|p| vec![p.to_path_buf()])
            .unwrap_or_default()
    }
}

/// The JIT as the host plugin uses it.
#[derive(Default)]
pub(crate) struct HostJit {
    service: OnceLock<Arc<dyn JitService>>,
    own: OnceLock<Arc<JitClient>>,
}

impl std::fmt::Debug for HostJit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostJit")
            .field("runtime_service", &self.service.get().is_some())
            .field("own_client", &self.own.get().is_some())
            .finish()
    }
}

impl HostJit {
    /// Whether the bytes are JIT input (bitcode or IR) rather than an ELF image.
    pub fn is_input(bytes: &[u8]) -> bool {
        offload_jit_client::is_jit_input(bytes)
    }

    /// The device as the JIT targets it: the host triple, CPU and features.
    pub fn target() -> JitTarget {
        let (cpu, features) = host_cpu::host_cpu();
        JitTarget {
            triple: HOST_TRIPLE.into(),
            cpu: cpu.clone(),
            features: features.clone(),
        }
    }

    fn service(&self) -> &Arc<dyn JitService> {
        self.service.get_or_init(|| {
            let client = self
                .own
                .get_or_init(|| Arc::new(JitClient::from_env(library_dir())));
            client.service("host")
        })
    }

    /// Compiles (or finds in the cache) the shared object for `bitcode`.
    pub fn compile(&self, bitcode: &[u8]) -> Result<JitOutput> {
        self.service().compile(&CompileRequest {
            image: bitcode,
            target: Self::target(),
            post: PostProcess::LinkHostSharedObject,
        })
    }
}

/// The host plugin.
#[derive(Debug, Default)]
pub struct HostPlugin {
    devices: OnceLock<Vec<Arc<HostDevice>>>,
    jit: Arc<HostJit>,
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
            .map(|i| Arc::new(HostDevice::new(i, pool.clone(), threads, self.jit.clone())))
            .collect();
        Ok(self.devices.get_or_init(|| devices).len())
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        check_image(image)
    }

    fn jit_stats(&self) -> Option<JitStats> {
        self.jit.own.get().and_then(|c| c.stats_for("host"))
    }

    fn set_jit_service(&self, service: Arc<dyn JitService>) -> Result<()> {
        // The first service offered wins: every runtime of a process offers the same one.
        let _ = self.jit.service.set(service);
        Ok(())
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

/// Plugin- and device-level image check: bitcode/IR by triple (read without LLVM; a module
/// without a triple is compiled for the host's), ELF by header and structure.
pub(crate) fn check_image(image: &[u8]) -> Result<()> {
    if HostJit::is_input(image) {
        let triple = offload_core::bitcode::module_triple(image)?;
        if triple.is_empty() || offload_core::triple::triples_match(&triple, HOST_TRIPLE) {
            return Ok(());
        }
        return Err(Error::InvalidImage(format!(
            "bitcode is for '{triple}', the host plugin compiles for '{HOST_TRIPLE}'"
        )));
    }
    ElfImage::parse(image, &requirements()).map(|_| ())
}

offload_core::export_plugin!(HostPlugin::new);
