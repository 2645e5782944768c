//! # The Intel GPU backend: oneAPI Level Zero
//!
//! A crate of hooks on the generic device layer. Serves SPIR-V modules (the portable IL Level
//! Zero drivers compile for the device), Intel native binaries (zebin: ELF `EM_INTELGT`, 205) and
//! `spirv64` bitcode (through the JIT, where its LLVM has the SPIR-V target). The loader
//! (`libze_loader.so.1`) is opened at run time, only when the plugin is first used ([`ze`]): a
//! machine without it, or without a GPU driver, reports 0 devices with the reason.
//!
//! - Compute-unit kind: the device's graphics IP version (`intel-gpu-12.60.7`), or its PCI
//!   device id when the driver does not give the IP version.
//! - Images are checked before the driver sees them: SPIR-V structurally ([`spirv`]), zebins as
//!   ELF ([`zebin`]).
//! - Queues are the layer's; each appends its operations to an immediate command list of its
//!   own, back to back, and the layer releases what they use only after the list's event has
//!   been signalled and waited for, so memory is never freed under a running kernel.

pub mod device;
pub mod spirv;
pub mod ze;
pub mod zebin;

use device::{Context, TRIPLE, ZeDevice};
use offload_core::image::{ImageKind, machine};
use offload_core::{Error, ImageClaim, Result};
use offload_plugin_common::Backend;
use std::sync::{Arc, OnceLock};
use ze::{Handle, Ze};

/// Plugin-level check of an image the plugin claims (without a device).
pub fn check_native(image: &[u8], kind: &ImageKind) -> Result<()> {
    match kind {
        ImageKind::SpirV => {
            let m = spirv::parse(image)?;
            if m.kernel_names().is_empty() {
                return Err(Error::InvalidImage(
                    "SPIR-V module has no kernel (no OpEntryPoint Kernel)".into(),
                ));
            }
            Ok(())
        }
        // Read at load too: a `.ze_info` that cannot be read refuses the image here.
        ImageKind::Elf(_) => zebin::read(image).map(drop),
        other => Err(Error::InvalidImage(format!(
            "a {} is not a Level Zero image",
            other.describe()
        ))),
    }
}

/// The GPUs the drivers report: (driver, device).
struct Gpus(Vec<(Handle, Handle)>);

// SAFETY: Level Zero handles may be used from any thread.
unsafe impl Send for Gpus {}
// SAFETY: see above.
unsafe impl Sync for Gpus {}

/// The Level Zero backend: the loader is opened on `init`.
pub struct LevelZeroBackend {
    ze: OnceLock<Arc<Ze>>,
    gpus: OnceLock<Gpus>,
    /// One context per driver, made for its first device, shared by the others.
    contexts: std::sync::Mutex<Vec<(usize, std::sync::Weak<Context>)>>,
}

impl LevelZeroBackend {
    /// A backend that has not touched the loader yet.
    ///
    /// # Safety
    /// The backend hands out raw devices ([`Backend::device`](offload_plugin_common::Backend::device)):
    /// their hooks copy through, launch with and free the pointers they are given, unchecked.
    /// The caller uses it only as `offload_plugin_common::Plugin` does (through
    /// [`Plugin::new`](offload_plugin_common::Plugin::new), which checks every pointer against the
    /// regions it tracks before a hook sees it) or keeps those checks itself.
    pub unsafe fn new() -> Self {
        LevelZeroBackend {
            ze: OnceLock::new(),
            gpus: OnceLock::new(),
            contexts: std::sync::Mutex::new(Vec::new()),
        }
    }
}

impl std::fmt::Debug for LevelZeroBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LevelZeroBackend({:?})", self.ze.get())
    }
}

/// Every GPU device of every driver.
fn find_gpus(ze: &Ze) -> Result<Vec<(Handle, Handle)>> {
    let mut count = 0u32;
    // SAFETY: a count query after a successful zeInit.
    unsafe { ze.zeDriverGet(&mut count, std::ptr::null_mut())? };
    let mut drivers: Vec<Handle> = vec![std::ptr::null_mut(); count.min(64) as usize];
    let mut n = drivers.len() as u32;
    // SAFETY: `n` handles.
    unsafe { ze.zeDriverGet(&mut n, drivers.as_mut_ptr())? };
    drivers.truncate(n as usize);
    let mut gpus = Vec::new();
    for driver in drivers {
        let mut count = 0u32;
        // SAFETY: a driver the loader gave.
        unsafe { ze.zeDeviceGet(driver, &mut count, std::ptr::null_mut())? };
        let mut devices: Vec<Handle> = vec![std::ptr::null_mut(); count.min(1024) as usize];
        let mut n = devices.len() as u32;
        // SAFETY: `n` handles.
        unsafe { ze.zeDeviceGet(driver, &mut n, devices.as_mut_ptr())? };
        devices.truncate(n as usize);
        for device in devices {
            let mut props = ze::DeviceProperties::default();
            // SAFETY: a device the driver gave; live out-structure.
            unsafe { ze.zeDeviceGetProperties(device, &mut props)? };
            if props.device_type == ze::DEVICE_TYPE_GPU {
                gpus.push((driver, device));
            }
        }
    }
    Ok(gpus)
}

impl Backend for LevelZeroBackend {
    type Device = ZeDevice;

    fn name(&self) -> &'static str {
        "level-zero"
    }

    fn elf_machine(&self) -> u16 {
        machine::INTELGT
    }

    fn target_triple(&self) -> &'static str {
        TRIPLE
    }

    fn claims(&self) -> Vec<ImageClaim> {
        vec![
            ImageClaim::Elf {
                machine: machine::INTELGT,
            },
            ImageClaim::SpirV,
            ImageClaim::Bitcode {
                triple: TRIPLE.into(),
            },
        ]
    }

    fn init(&self) -> Result<usize> {
        let ze = Arc::new(Ze::load()?);
        let gpus = find_gpus(&ze)?;
        if gpus.is_empty() {
            return Err(Error::NoDevice(format!(
                "the Level Zero driver(s) behind '{}' report no GPU",
                ze.path()
            )));
        }
        let count = gpus.len();
        let _ = self.gpus.set(Gpus(gpus));
        let _ = self.ze.set(ze);
        Ok(count)
    }

    fn device(&self, index: usize) -> Result<ZeDevice> {
        let (ze, gpus) = match (self.ze.get(), self.gpus.get()) {
            (Some(z), Some(g)) => (z, g),
            _ => {
                return Err(Error::InvalidArgument(
                    "level-zero plugin used before init".into(),
                ));
            }
        };
        let (driver, device) = *gpus
            .0
            .get(index)
            .ok_or_else(|| Error::NotFound(format!("level-zero device {index}")))?;
        let context = {
            let mut contexts = offload_core::sync::lock(&self.contexts);
            let live = contexts
                .iter()
                .find(|(d, _)| *d == driver as usize)
                .and_then(|(_, c)| c.upgrade());
            match live {
                Some(c) => c,
                None => {
                    let c = Arc::new(Context::create(ze.clone(), driver)?);
                    contexts.retain(|(d, _)| *d != driver as usize);
                    contexts.push((driver as usize, Arc::downgrade(&c)));
                    c
                }
            }
        };
        ZeDevice::open(ze.clone(), context, device)
    }

    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()> {
        check_native(image, kind)
    }

    fn properties(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(z) = self.ze.get() {
            out.push(("loader".into(), z.path().to_string()));
        }
        out.push((
            "drivers".into(),
            offload_core::env::raw(&["ZE_ENABLE_ALT_DRIVERS"])
                .ok()
                .flatten()
                .map(|(_, d)| format!("{d} (ZE_ENABLE_ALT_DRIVERS)"))
                .unwrap_or_else(|| ze::DEFAULT_DRIVER.to_string()),
        ));
        out.push((
            "bitcode".into(),
            "JIT to SPIR-V where the JIT's LLVM has the SPIR-V target (Debian's LLVM 19 has \
             none: compile to SPIR-V ahead of time)"
                .into(),
        ));
        out
    }
}

// The ABI entry symbol is defined by crates/plugins/level-zero (liboffload_plugin_level_zero.so).
