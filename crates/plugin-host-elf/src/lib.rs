//! # The host CPU backend
//!
//! Runs kernels compiled for the machine this process runs on (x86-64 here, aarch64 on
//! aarch64), written against `include/offload_kernel.h` and linked as ELF shared objects. It is
//! a crate of hooks on the generic device layer (`plugin-common`), which owns handles, memory
//! tracking, queues, events, argument checks, container unpacking and the JIT.
//!
//! - Images are loaded from memory through a sealed `memfd`: no file is ever written.
//! - A launch of grid G and block B runs every work item once. Blocks are spread over one
//!   worker pool per plugin (sized to the machine, `OFFLOAD_HOST_THREADS` overrides; idle
//!   workers wait by `OFFLOAD_HOST_WAIT`, see `pool.rs`); the work items of a block run on one
//!   worker. The kernel reads its IDs from a context the plugin owns, through a function
//!   pointer it sets at load.
//! - A kernel of a shared object is called once per work item, by a direct call whose
//!   registers and stack slots are prepared once per launch with the C ABI's rules (`float`
//!   and `double` arguments in float registers); libffi only where those rules are not
//!   written out (more arguments than the prepared slots, other architectures). Kernels with
//!   barriers run their work items as fibers (`cpp/exec.c`).
//! - A kernel the JIT compiled from bitcode is called once per range of blocks through its
//!   work-group function (`__offload_wg_<kernel>`): the work items are loops inside it.
//! - Device memory is host memory; the layer checks every copy and pointer argument against
//!   the device's live allocations and keeps memory alive while work uses it. What cannot be
//!   checked: a kernel reading or writing outside the buffers it was given (the docs say so).
//! - `OFFLOAD_HOST_DEVICES` (default 1) sets how many devices the plugin reports, so that
//!   multi-device behaviour can be tested without a GPU.
//! - LLVM bitcode (or textual IR) for the host triple is compiled by the JIT for the exact host
//!   CPU (named by LLVM's own detection, linked statically: see [`host_cpu`]) and linked into a
//!   shared object with lld. This library never links LLVM.

mod device;
mod host_cpu;
mod launch;
mod pool;
mod probe;
mod program;

use device::HostDevice;
use offload_core::image::{ElfRequirements, ImageKind, elf_type, machine};
use offload_core::jit::JitTarget;
use offload_core::{ElfImage, Error, ImageClaim, Result};
use offload_plugin_common::Backend;
pub use pool::{DEFAULT_SPIN_US, ENV_SPIN_US, ENV_WAIT};
use std::sync::{Arc, OnceLock};

pub use launch::HostContext;
pub use program::WORK_GROUP_ABI;

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

/// Everything checked of a native image (classified as `kind`) before the dynamic loader sees
/// it: the ELF structure, what the loader trusts (`offload_core::image::elf_dyn`), and the
/// kernel header's context variable. Returns the parsed image, its layout and whether it has
/// the context variable.
pub(crate) fn check_image(
    image: &[u8],
    kind: &ImageKind,
) -> Result<(ElfImage, offload_core::image::elf_dyn::Layout, bool)> {
    let elf = ElfImage::parse_as(image, kind, &requirements())?;
    let layout = offload_core::image::elf_dyn::validate(image)?;
    let has_context = program::check_context(&elf, &layout)?;
    Ok((elf, layout, has_context))
}

/// The host as the JIT targets it.
pub(crate) struct HostJit;

impl HostJit {
    /// The host triple, CPU and features.
    pub fn target() -> JitTarget {
        let (cpu, features) = host_cpu::host_cpu();
        JitTarget {
            triple: HOST_TRIPLE.into(),
            cpu: cpu.clone(),
            features: features.clone(),
        }
    }
}

/// The host backend: its worker pool and devices are made on `init`.
#[derive(Debug)]
pub struct HostBackend {
    pool: OnceLock<(Arc<pool::Pool>, u32)>,
}

impl HostBackend {
    /// A backend that has not touched anything yet.
    ///
    /// # Safety
    /// The backend hands out raw devices ([`Backend::device`](offload_plugin_common::Backend::device)):
    /// their hooks copy through, launch with and free the pointers they are given, unchecked.
    /// The caller uses it only as `offload_plugin_common::Plugin` does (through
    /// [`Plugin::new`](offload_plugin_common::Plugin::new), which checks every pointer against the
    /// regions it tracks before a hook sees it) or keeps those checks itself.
    pub unsafe fn new() -> Self {
        HostBackend {
            pool: OnceLock::new(),
        }
    }
}

impl Backend for HostBackend {
    type Device = HostDevice;

    fn name(&self) -> &'static str {
        "host"
    }

    fn elf_machine(&self) -> u16 {
        machine::host()
    }

    fn target_triple(&self) -> &'static str {
        HOST_TRIPLE
    }

    fn claims(&self) -> Vec<ImageClaim> {
        vec![
            ImageClaim::Elf {
                machine: machine::host(),
            },
            ImageClaim::Bitcode {
                triple: HOST_TRIPLE.into(),
            },
        ]
    }

    fn init(&self) -> Result<usize> {
        let count = offload_core::env::u32_in_range(&[ENV_DEVICES], 0, 256, 1)?;
        let default_threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        let threads = offload_core::env::u32_in_range(&[ENV_THREADS], 1, 1024, default_threads)?;
        let wait = pool::Wait::from_env()?;
        let pool = pool::Pool::new(threads as usize, wait)?;
        let _ = self.pool.set((Arc::new(pool), threads));
        Ok(count as usize)
    }

    fn device(&self, index: usize) -> Result<HostDevice> {
        let (pool, threads) = self
            .pool
            .get()
            .ok_or_else(|| Error::InvalidArgument("host plugin used before init".into()))?;
        Ok(HostDevice::new(index, pool.clone(), *threads))
    }

    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()> {
        check_image(image, kind).map(|_| ())
    }

    fn properties(&self) -> Vec<(String, String)> {
        vec![
            (
                "bitcode".into(),
                "JIT to an object for the host CPU, linked into a shared object".into(),
            ),
            (
                "trial load".into(),
                match probe::probe_path() {
                    Some(p) => format!("every image is first loaded by {}", p.display()),
                    None => format!(
                        "{} not found next to the plugin or the executable: images are loaded \
                         directly, and one that crashes the dynamic loader crashes the process",
                        probe::PROBE
                    ),
                },
            ),
        ]
    }
}

// The ABI entry symbol is defined by the `plugin-host` package (liboffload_plugin_host.so).
