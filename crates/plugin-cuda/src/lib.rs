//! # The NVIDIA CUDA backend
//!
//! A crate of hooks on the generic device layer. Serves `EM_CUDA` (190) cubins, PTX text, CUDA
//! fat binaries and nvptx64 bitcode (compiled by the JIT worker to PTX, then assembled by
//! `ptxas` into a cubin for the device's exact SM; without `ptxas` the PTX goes to the
//! driver's JIT). The driver library is loaded at run time ([`driver`]), only when the plugin
//! is first used: a machine without it reports 0 devices with the reason, never a panic and
//! never a link error.
//!
//! - Compute-unit kind: `sm_XY` from the compute capability, `sm_90a` (the `a` variant) for
//!   devices from 9.0 on, which have their architecture's specific features.
//! - Images are checked against the device before the driver sees them ([`sm`]): a cubin must
//!   be for the same major architecture with an equal or older minor version, PTX for an
//!   architecture at most the device's; fat binaries give the device their best entry
//!   ([`fatbin`]).
//! - Queues are the layer's; each puts its operations on a CUDA stream of its own, back to
//!   back, and the layer releases what they use only after a synchronize of that stream, so
//!   memory is never freed under a running kernel.

pub mod driver;
pub mod fatbin;
pub mod params;
pub mod sm;

mod device;

use device::CudaDevice;
use driver::Driver;
use offload_core::image::{ElfRequirements, ImageKind, elf_type, machine};
use offload_core::{ElfImage, Error, ImageClaim, Result};
use offload_plugin_common::Backend;
use std::sync::{Arc, OnceLock};

/// The LLVM triple of CUDA devices.
pub const TRIPLE: &str = "nvptx64-nvidia-cuda";

fn requirements() -> ElfRequirements<'static> {
    ElfRequirements {
        plugin: "cuda",
        machine: machine::CUDA,
        file_types: &[elf_type::EXEC, elf_type::DYN],
    }
}

/// Plugin-level check of an image the plugin claims (without a device).
pub fn check_native(image: &[u8], kind: &ImageKind) -> Result<()> {
    match kind {
        ImageKind::Elf(_) => {
            ElfImage::parse_as(image, kind, &requirements())?;
            sm::cubin_sm(image).map(|_| ())
        }
        ImageKind::Ptx => sm::ptx_target(image).map(|_| ()),
        ImageKind::CudaFatbin => {
            // Every entry the plugin may hand to the driver is checked as its own image would
            // be: the driver reads a cubin by the extents its header declares.
            for e in fatbin::entries(image)? {
                let checked = match (e.kind, e.compressed) {
                    (fatbin::EntryKind::Cubin, false) => {
                        ElfImage::parse(e.payload, &requirements())
                            .and_then(|_| sm::cubin_sm(e.payload).map(|_| ()))
                    }
                    (fatbin::EntryKind::Ptx, false) => sm::ptx_target(e.payload).map(|_| ()),
                    _ => Ok(()),
                };
                checked.map_err(|err| {
                    Error::InvalidImage(format!(
                        "CUDA fatbin entry at byte {} ({}): {}",
                        e.offset,
                        e.label(),
                        err.message()
                    ))
                })?;
            }
            Ok(())
        }
        other => Err(Error::InvalidImage(format!(
            "a {} is not a CUDA image",
            other.describe()
        ))),
    }
}

/// The CUDA backend: the driver is loaded on `init`.
#[derive(Debug)]
pub struct CudaBackend {
    driver: OnceLock<Arc<Driver>>,
    ptxas: OnceLock<Result<Option<offload_jit_client::ptxas::Ptxas>>>,
}

impl CudaBackend {
    /// A backend that has not touched the driver yet.
    ///
    /// # Safety
    /// The backend hands out raw devices ([`Backend::device`](offload_plugin_common::Backend::device)):
    /// their hooks copy through, launch with and free the pointers they are given, unchecked.
    /// The caller uses it only as `offload_plugin_common::Plugin` does (through
    /// [`Plugin::new`](offload_plugin_common::Plugin::new), which checks every pointer against the
    /// regions it tracks before a hook sees it) or keeps those checks itself.
    pub unsafe fn new() -> Self {
        CudaBackend {
            driver: OnceLock::new(),
            ptxas: OnceLock::new(),
        }
    }
}

impl CudaBackend {
    fn ptxas(&self) -> Result<Option<offload_jit_client::ptxas::Ptxas>> {
        self.ptxas
            .get_or_init(offload_jit_client::ptxas::find)
            .clone()
    }
}

impl Backend for CudaBackend {
    type Device = CudaDevice;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn elf_machine(&self) -> u16 {
        machine::CUDA
    }

    fn target_triple(&self) -> &'static str {
        TRIPLE
    }

    fn claims(&self) -> Vec<ImageClaim> {
        vec![
            ImageClaim::Elf {
                machine: machine::CUDA,
            },
            ImageClaim::Ptx,
            ImageClaim::CudaFatbin,
            ImageClaim::Bitcode {
                triple: TRIPLE.into(),
            },
        ]
    }

    fn init(&self) -> Result<usize> {
        let driver = Arc::new(Driver::load()?);
        let mut count = 0;
        // SAFETY: live out-pointer; the driver is initialised.
        unsafe { driver.cuDeviceGetCount(&mut count)? };
        if count <= 0 {
            return Err(Error::NoDevice(format!(
                "the CUDA driver '{}' reports no device",
                driver.path()
            )));
        }
        let _ = self.driver.set(driver);
        Ok(count as usize)
    }

    fn device(&self, index: usize) -> Result<CudaDevice> {
        let driver = self
            .driver
            .get()
            .ok_or_else(|| Error::InvalidArgument("cuda plugin used before init".into()))?;
        CudaDevice::open(driver.clone(), index, self.ptxas()?)
    }

    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()> {
        check_native(image, kind)
    }

    fn properties(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(d) = self.driver.get() {
            let mut version = 0;
            // SAFETY: live out-pointer.
            let v = unsafe { d.cuDriverGetVersion(&mut version) }
                .map(|()| format!(" (CUDA {}.{})", version / 1000, (version % 1000) / 10))
                .unwrap_or_default();
            out.push(("driver".into(), format!("{}{v}", d.path())));
        }
        let (ptxas, bitcode) = match self.ptxas() {
            Ok(Some(p)) => (
                format!("{} ({})", p.path, p.version),
                "JIT to PTX, assembled by ptxas into a cubin".to_string(),
            ),
            Ok(None) => (
                "not found (OFFLOAD_PTXAS, PATH, CUDA_HOME, /usr/local/cuda)".into(),
                "JIT to PTX, compiled by the driver's JIT".to_string(),
            ),
            Err(e) => (e.to_string(), "unavailable".to_string()),
        };
        out.push(("ptxas".into(), ptxas));
        out.push(("bitcode".into(), bitcode));
        out
    }
}

// The ABI entry symbol is defined by crates/plugins/cuda (liboffload_plugin_cuda.so).
