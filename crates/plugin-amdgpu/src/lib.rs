//! # The AMD GPU backend
//!
//! A crate of hooks on the generic device layer. Serves `EM_AMDGPU` (224) code objects (v4 to
//! v6, linked: `ET_DYN`) and amdgcn bitcode (compiled by the JIT worker for the device's exact
//! processor and target-id features, then linked by `ld.lld` into a code object). The HSA
//! runtime is loaded at run time ([`hsa`]), only when the plugin is first used: a machine without
//! it, or without an AMD GPU, reports 0 devices with the reason, never a panic.
//!
//! - Compute-unit kind: the agent's processor (`gfx90a`); its xnack/sramecc settings are the
//!   device's target features (`+sramecc,-xnack`), passed to the JIT.
//! - Code objects are checked before the runtime sees them ([`target`], [`metadata`]): OS/ABI,
//!   version, processor and target-id features against the device, the metadata note, and an
//!   exported descriptor (`<kernel>.kd`) for every kernel.
//! - Launch arguments are laid out as the metadata says (offsets, sizes, hidden arguments).

pub mod hsa;
pub mod metadata;
pub mod msgpack;
pub mod target;

mod device;

use device::AmdDevice;
use hsa::{Handle, Hsa, agent_info};
use offload_core::image::{ElfRequirements, ImageKind, elf_type, machine};
use offload_core::{ElfImage, Error, ImageClaim, Result};
use offload_plugin_common::Backend;
use std::ffi::{c_int, c_void};
use std::sync::{Arc, OnceLock};

/// The LLVM triple of AMD GPUs.
pub const TRIPLE: &str = "amdgcn-amd-amdhsa";

fn requirements() -> ElfRequirements<'static> {
    ElfRequirements {
        plugin: "amdgpu",
        machine: machine::AMDGPU,
        file_types: &[elf_type::DYN],
    }
}

/// Plugin-level check of a code object (without a device): structure, header fields, metadata,
/// and an exported kernel descriptor for every kernel the metadata lists.
pub fn check_native(image: &[u8], kind: &ImageKind) -> Result<()> {
    let ImageKind::Elf(info) = kind else {
        return Err(Error::InvalidImage(format!(
            "a {} is not an AMD code object",
            other_describe(kind)
        )));
    };
    if info.file_type == elf_type::REL {
        return Err(Error::InvalidImage(
            "the image is a relocatable object (ET_REL, e_type at offset 16): it needs linking \
             into a code object first (ld.lld -shared, or clang without -c)"
                .into(),
        ));
    }
    let elf = ElfImage::parse_as(image, kind, &requirements())?;
    // ROCr's loader maps and relocates a code object much as glibc's does a shared object.
    offload_core::image::elf_dyn::validate(image)?;
    target::code_object_target(info, image.get(8).copied().unwrap_or(0))?;
    let meta = metadata::read(image)?;
    for k in &meta.kernels {
        let exported = elf
            .symbols
            .iter()
            .any(|s| s.name == k.symbol && !s.is_function);
        if !exported {
            return Err(Error::InvalidImage(format!(
                "kernel '{}': its descriptor '{}' is not an exported symbol of the code object",
                k.name, k.symbol
            )));
        }
    }
    Ok(())
}

fn other_describe(kind: &ImageKind) -> String {
    kind.describe().to_string()
}

/// The runtime and the agents found on `init`.
#[derive(Debug)]
struct Found {
    hsa: Arc<Hsa>,
    cpu: Handle,
    gpus: Vec<Handle>,
}

/// The AMD GPU backend: the runtime is loaded on `init`.
#[derive(Debug)]
pub struct AmdgpuBackend {
    found: OnceLock<Found>,
}

impl AmdgpuBackend {
    /// A backend that has not touched the runtime yet.
    ///
    /// # Safety
    /// The backend hands out raw devices ([`Backend::device`](offload_plugin_common::Backend::device)):
    /// their hooks copy through, launch with and free the pointers they are given, unchecked.
    /// The caller uses it only as `offload_plugin_common::Plugin` does (through
    /// [`Plugin::new`](offload_plugin_common::Plugin::new), which checks every pointer against the
    /// regions it tracks before a hook sees it) or keeps those checks itself.
    pub unsafe fn new() -> Self {
        AmdgpuBackend {
            found: OnceLock::new(),
        }
    }
}

unsafe extern "C" fn collect_agent(agent: Handle, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `(Vec<(Handle, u32)>, usize)` of `init`, whose `usize` is the
    // address of a live `Hsa`.
    let (agents, hsa) = unsafe { &mut *data.cast::<(Vec<(Handle, u32)>, usize)>() };
    // SAFETY: as above.
    let hsa = unsafe { &*(*hsa as *const Hsa) };
    let mut kind = u32::MAX;
    // SAFETY: a u32 out-value.
    if unsafe { hsa.hsa_agent_get_info(agent, agent_info::DEVICE, (&mut kind as *mut u32).cast()) }
        .is_ok()
    {
        agents.push((agent, kind));
    }
    hsa::SUCCESS
}

impl Backend for AmdgpuBackend {
    type Device = AmdDevice;

    fn name(&self) -> &'static str {
        "amdgpu"
    }

    fn elf_machine(&self) -> u16 {
        machine::AMDGPU
    }

    fn target_triple(&self) -> &'static str {
        TRIPLE
    }

    fn claims(&self) -> Vec<ImageClaim> {
        vec![
            ImageClaim::Elf {
                machine: machine::AMDGPU,
            },
            ImageClaim::Bitcode {
                triple: TRIPLE.into(),
            },
        ]
    }

    fn init(&self) -> Result<usize> {
        if let Some(f) = self.found.get() {
            return Ok(f.gpus.len());
        }
        let hsa = Arc::new(Hsa::load()?);
        let mut agents: (Vec<(Handle, u32)>, usize) = (Vec::new(), &*hsa as *const Hsa as usize);
        // SAFETY: the callback appends to `agents`, which outlives the call.
        unsafe {
            hsa.hsa_iterate_agents(
                collect_agent,
                (&mut agents as *mut (Vec<(Handle, u32)>, usize)).cast(),
            )?
        };
        // GPUs that run kernels (an agent without kernel dispatch is not one to launch on).
        let dispatches = |agent: Handle| {
            let mut features = 0u32;
            // SAFETY: a u32 out-value.
            unsafe {
                hsa.hsa_agent_get_info(
                    agent,
                    agent_info::FEATURE,
                    (&mut features as *mut u32).cast(),
                )
            }
            .is_ok_and(|()| features & agent_info::FEATURE_KERNEL_DISPATCH != 0)
        };
        let gpus: Vec<Handle> = agents
            .0
            .iter()
            .filter(|(a, k)| *k == agent_info::DEVICE_GPU && dispatches(*a))
            .map(|(a, _)| *a)
            .collect();
        let cpu = agents
            .0
            .iter()
            .find(|(_, k)| *k == agent_info::DEVICE_CPU)
            .map(|(a, _)| *a);
        let gpu_agents = agents
            .0
            .iter()
            .filter(|(_, k)| *k == agent_info::DEVICE_GPU)
            .count();
        if gpus.is_empty() && gpu_agents > 0 {
            return Err(Error::NoDevice(format!(
                "the HSA runtime '{}' reports {gpu_agents} GPU agent(s), none of which runs \
                 kernels (no HSA_AGENT_FEATURE_KERNEL_DISPATCH)",
                hsa.path()
            )));
        }
        if gpus.is_empty() {
            return Err(Error::NoDevice(format!(
                "the HSA runtime '{}' reports no AMD GPU{}",
                hsa.path(),
                hsa::kfd_problem()
                    .map(|w| format!(": {w}"))
                    .unwrap_or_default()
            )));
        }
        let cpu = cpu.ok_or_else(|| {
            Error::NoDevice(format!(
                "the HSA runtime '{}' reports GPUs but no CPU agent to allocate host memory from",
                hsa.path()
            ))
        })?;
        // A memory fault must fail its launch, not end the process (ROCr's default).
        device::handle_memory_faults(&hsa)?;
        let _ = self.found.set(Found { hsa, cpu, gpus });
        Ok(self.found.get().map_or(0, |f| f.gpus.len()))
    }

    fn device(&self, index: usize) -> Result<AmdDevice> {
        let f = self
            .found
            .get()
            .ok_or_else(|| Error::InvalidArgument("amdgpu plugin used before init".into()))?;
        let agent = *f
            .gpus
            .get(index)
            .ok_or_else(|| Error::InvalidArgument(format!("no amdgpu device {index}")))?;
        let pools = device::find_pools(&f.hsa, agent, f.cpu)?.ok_or_else(|| {
            Error::DeviceFailure(format!(
                "amdgpu:{index}: the runtime offers no device memory pool, pinned host pool or kernel-argument pool for it"
            ))
        })?;
        AmdDevice::open(f.hsa.clone(), agent, f.cpu, pools)
    }

    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()> {
        check_native(image, kind)
    }

    fn properties(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(f) = self.found.get() {
            out.push(("runtime".into(), f.hsa.path().to_string()));
        }
        out.push((
            "bitcode".into(),
            "JIT to an object, linked by ld.lld into a code object (OFFLOAD_LLD)".into(),
        ));
        out
    }
}

// The ABI entry symbol is defined by crates/plugins/amdgpu (liboffload_plugin_amdgpu.so).
