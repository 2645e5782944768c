//! A plugin of the layer ([`Plugin`]): the [`GenericPlugin`](offload_core::GenericPlugin) a backend's [`Backend`] hooks
//! become, with its devices made once.

use crate::device::Device;
use crate::{Backend, jit, select};
use offload_core::image::ImageKind;
use offload_core::jit::JitService;
use offload_core::{Error, GenericDevice, GenericPlugin, ImageClaim, JitStats, Result};
use std::sync::{Arc, Mutex};

/// A plugin made from a [`Backend`] (see [`export_backend!`](crate::export_backend)).
pub struct Plugin<B: Backend> {
    backend: Arc<B>,
    served: Arc<select::PluginClaims>,
    jit: Arc<jit::Jit>,
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
            devices: Mutex::default(),
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The layer's device `index` (for backends' own tests).
    pub fn layer_device(&self, index: usize) -> Result<Arc<Device<B::Device>>> {
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
        self.backend.init()
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
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
