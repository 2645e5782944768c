//! A plugin of the layer ([`Plugin`]): the [`GenericPlugin`](offload_core::GenericPlugin) a
//! backend's [`Backend`] hooks become. The one place a plugin's init-once state and its
//! devices' identity live: `init` runs once and its outcome is kept; a device is used only after
//! `init`, below the count it gave, and each device object is made once and shared. (The
//! runtime keeps its own proxies of a plugin library's devices, once each, on its side of the
//! ABI.)

use crate::device::Device;
use crate::{Backend, jit, select};
use offload_core::image::ImageKind;
use offload_core::jit::JitService;
use offload_core::{Error, GenericDevice, GenericPlugin, ImageClaim, JitStats, Result};
use std::sync::{Arc, Mutex, OnceLock};

/// A plugin made from a [`Backend`] (see [`export_backend!`](crate::export_backend)).
pub struct Plugin<B: Backend> {
    backend: Arc<B>,
    served: Arc<select::PluginClaims>,
    jit: Arc<jit::Jit>,
    init: OnceLock<Result<usize>>,
    devices: Mutex<Vec<Option<LayerDevice<B>>>>,
}

/// A device of a plugin made from backend `B`.
pub type LayerDevice<B> = Arc<Device<<B as Backend>::Device>>;

impl<B: Backend> std::fmt::Debug for Plugin<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Plugin({})", self.backend.name())
    }
}

impl<B: Backend> Plugin<B> {
    /// Wraps a backend (cheap: nothing is initialised).
    ///
    /// # Safety
    /// The plugin's devices are raw ([`GenericDevice`]), and the safe API above trusts what they
    /// report: the backend keeps [`DeviceBackend`](crate::DeviceBackend)'s contract. `alloc` returns memory of the
    /// kind asked for, `size` bytes long, which only `free` ends, and host and shared memory
    /// are memory of this process when [`Backend`] says so. `execute` does what its `Op` says
    /// and touches nothing else. `load` and `kernel` describe the image truly (the parameter
    /// types they return are the kernel's).
    pub unsafe fn new(backend: B) -> Self {
        let backend = Arc::new(backend);
        let checker = backend.clone();
        let served = Arc::new(select::PluginClaims {
            plugin: backend.name(),
            triple: backend.target_triple(),
            claims: backend.claims(),
            native: Arc::new(move |bytes: &[u8], kind: &ImageKind| {
                checker.check_native(bytes, kind)
            }),
        });
        let jit = Arc::new(jit::Jit::new(backend.name()));
        Plugin {
            backend,
            served,
            jit,
            init: OnceLock::new(),
            devices: Mutex::default(),
        }
    }

    /// The layer's device `index`, after `init` and below its count (also for backends' own
    /// tests).
    pub fn layer_device(&self, index: usize) -> Result<Arc<Device<B::Device>>> {
        let name = self.backend.name();
        let count = match self.init.get() {
            Some(Ok(n)) => *n,
            Some(Err(e)) => return Err(e.clone()),
            None => {
                return Err(Error::InvalidArgument(format!(
                    "plugin '{name}' used before init"
                )));
            }
        };
        if index >= count {
            return Err(Error::NotFound(format!(
                "device {index} of plugin '{name}' (it has {count} device{})",
                if count == 1 { "" } else { "s" }
            )));
        }
        let mut devices = offload_core::sync::lock(&self.devices);
        if devices.len() <= index {
            devices.resize_with(index + 1, || None);
        }
        if let Some(d) = &devices[index] {
            return Ok(d.clone());
        }
        let d = Arc::new(Device::new(
            index,
            self.backend.device(index)?,
            self.served.clone(),
            self.jit.clone(),
        ));
        devices[index] = Some(d.clone());
        Ok(d)
    }
}

impl<B: Backend> GenericPlugin for Plugin<B> {
    fn name(&self) -> &str {
        self.backend.name()
    }

    fn elf_machine(&self) -> u16 {
        self.backend.elf_machine()
    }

    fn target_triple(&self) -> &str {
        self.backend.target_triple()
    }

    fn init(&self) -> Result<usize> {
        self.init.get_or_init(|| self.backend.init()).clone()
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        if image.is_empty() {
            return Err(Error::InvalidImage("image is empty (0 bytes)".into()));
        }
        select::check_plugin(&self.served, image)
    }

    fn image_claims(&self) -> Vec<ImageClaim> {
        self.served.claims.clone()
    }

    fn properties(&self) -> Vec<(String, String)> {
        self.backend.properties()
    }

    fn device(&self, index: usize) -> Result<Arc<dyn GenericDevice>> {
        Ok(self.layer_device(index)? as Arc<dyn GenericDevice>)
    }

    fn jit_stats(&self) -> Option<JitStats> {
        self.jit.stats()
    }

    fn set_jit_service(&self, service: Arc<dyn JitService>) -> Result<()> {
        if !self
            .served
            .claims
            .iter()
            .any(|c| matches!(c, ImageClaim::Bitcode { .. }))
        {
            return Err(Error::Unsupported(format!(
                "plugin '{}' compiles no bitcode",
                self.backend.name()
            )));
        }
        self.jit.offer(service);
        Ok(())
    }
}
