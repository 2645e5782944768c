//! The checks every plugin gets, whichever way it is reached: through the C ABI
//! (`offload_abi::export` wraps every exported plugin in a [`CheckedPlugin`]) or linked into
//! the process (the runtime wraps in-process plugins the same way). LLVM's plugin interface
//! makes them in its generic layer; here they sit in front of every backend:
//!
//! - `init` runs once and its outcome is kept; a device is used only after `init`, and only
//!   below the count it gave; each device object is made once and shared (so its identity is
//!   stable);
//! - images are not empty, kernel names are not empty, allocations are not of 0 bytes, frees
//!   are not of null, copies with null pointers are refused and copies of 0 bytes do nothing;
//! - launch shapes are checked against the device's limits (kept from its first `info`).

use crate::error::{Error, Result};
use crate::jit::JitService;
use crate::traits::{GenericDevice, GenericPlugin};
use crate::types::{
    DeviceInfo, DevicePtr, EventHandle, GlobalSymbol, ImageClaim, JitStats, KernelArg,
    KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle,
};
use std::sync::{Arc, Mutex, OnceLock};

/// A plugin with the checks in front of it.
pub struct CheckedPlugin {
    plugin: Box<dyn GenericPlugin>,
    init: OnceLock<std::result::Result<usize, Error>>,
    devices: Mutex<Vec<Option<Arc<CheckedDevice>>>>,
}

impl std::fmt::Debug for CheckedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CheckedPlugin({})", self.plugin.name())
    }
}

impl CheckedPlugin {
    /// Wraps `plugin`.
    ///
    /// # Safety
    /// The result is a raw plugin: its devices' `unsafe` methods take unchecked pointers, and
    /// the safe API that wraps it trusts what `plugin` reports. `plugin` keeps the contract of
    /// [`GenericDevice`] (the paragraph the safe API relies on: synchronous operations wait for
    /// queued ones on the same memory, memory stays allocated until the work that uses it has
    /// run, host memory it hands out is this process's) and reports its devices' limits truly.
    pub unsafe fn new(plugin: Box<dyn GenericPlugin>) -> CheckedPlugin {
        CheckedPlugin {
            plugin,
            init: OnceLock::new(),
            devices: Mutex::new(Vec::new()),
        }
    }

    /// Device `index`, checked and shared.
    pub fn checked_device(&self, index: usize) -> Result<Arc<CheckedDevice>> {
        let count = match self.init.get() {
            Some(Ok(n)) => *n,
            Some(Err(e)) => return Err(e.clone()),
            None => {
                return Err(Error::InvalidArgument(format!(
                    "plugin '{}' used before init",
                    self.plugin.name()
                )));
            }
        };
        if index >= count {
            return Err(Error::NotFound(format!(
                "device {index} of plugin '{}' (it has {count} device{})",
                self.plugin.name(),
                if count == 1 { "" } else { "s" }
            )));
        }
        let mut devices = crate::sync::lock(&self.devices);
        if devices.len() < count {
            devices.resize_with(count, || None);
        }
        if let Some(d) = &devices[index] {
            return Ok(d.clone());
        }
        let d = Arc::new(CheckedDevice {
            device: self.plugin.device(index)?,
            info: OnceLock::new(),
        });
        devices[index] = Some(d.clone());
        Ok(d)
    }
}

impl GenericPlugin for CheckedPlugin {
    fn name(&self) -> &str {
        self.plugin.name()
    }
    fn elf_machine(&self) -> u16 {
        self.plugin.elf_machine()
    }
    fn target_triple(&self) -> &str {
        self.plugin.target_triple()
    }
    fn init(&self) -> Result<usize> {
        self.init.get_or_init(|| self.plugin.init()).clone()
    }
    fn check_image(&self, image: &[u8]) -> Result<()> {
        not_empty(image)?;
        self.plugin.check_image(image)
    }
    fn image_claims(&self) -> Vec<ImageClaim> {
        self.plugin.image_claims()
    }
    fn device(&self, index: usize) -> Result<Arc<dyn GenericDevice>> {
        Ok(self.checked_device(index)?)
    }
    fn properties(&self) -> Vec<(String, String)> {
        self.plugin.properties()
    }
    fn jit_stats(&self) -> Option<JitStats> {
        self.plugin.jit_stats()
    }
    fn set_jit_service(&self, service: Arc<dyn JitService>) -> Result<()> {
        self.plugin.set_jit_service(service)
    }
}

fn not_empty(image: &[u8]) -> Result<()> {
    if image.is_empty() {
        return Err(Error::InvalidImage("image is empty (0 bytes)".into()));
    }
    Ok(())
}

/// A device with the checks in front of it ([`CheckedPlugin::checked_device`]).
pub struct CheckedDevice {
    device: Arc<dyn GenericDevice>,
    info: OnceLock<DeviceInfo>,
}

impl std::fmt::Debug for CheckedDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CheckedDevice({})", self.device.index())
    }
}

impl CheckedDevice {
    /// The device's information, asked once and kept.
    pub fn info_ref(&self) -> Result<&DeviceInfo> {
        if let Some(info) = self.info.get() {
            return Ok(info);
        }
        let info = self.device.info()?;
        Ok(self.info.get_or_init(|| info))
    }
}

impl GenericDevice for CheckedDevice {
    fn index(&self) -> usize {
        self.device.index()
    }
    fn info(&self) -> Result<DeviceInfo> {
        self.info_ref().cloned()
    }
    fn check_image(&self, image: &[u8]) -> Result<()> {
        not_empty(image)?;
        self.device.check_image(image)
    }
    unsafe fn load_image(&self, image: &[u8]) -> Result<ProgramHandle> {
        not_empty(image)?;
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.device.load_image(image) }
    }
    unsafe fn unload_image(&self, program: ProgramHandle) -> Result<()> {
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.device.unload_image(program) }
    }
    fn kernel(&self, program: ProgramHandle, name: &str) -> Result<KernelHandle> {
        if name.is_empty() {
            return Err(Error::InvalidArgument("kernel name is empty".into()));
        }
        self.device.kernel(program, name)
    }
    fn global(&self, program: ProgramHandle, name: &str) -> Result<GlobalSymbol> {
        self.device.global(program, name)
    }
    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr> {
        if size == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        self.device.alloc(size, kind)
    }
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.0 == 0 {
            return Err(Error::InvalidArgument(
                "free of a null device pointer".into(),
            ));
        }
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.device.free(ptr) }
    }
    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if src.is_null() || dst.0 == 0 {
            return Err(Error::InvalidArgument(
                "copy to device with a null pointer".into(),
            ));
        }
        // SAFETY: forwarded contract.
        unsafe { self.device.copy_to_device(dst, src, len, queue) }
    }
    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if dst.is_null() || src.0 == 0 {
            return Err(Error::InvalidArgument(
                "copy from device with a null pointer".into(),
            ));
        }
        // SAFETY: forwarded contract.
        unsafe { self.device.copy_from_device(dst, src, len, queue) }
    }
    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if dst.0 == 0 || src.0 == 0 {
            return Err(Error::InvalidArgument(
                "device copy with a null pointer".into(),
            ));
        }
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.device.copy_device_to_device(dst, src, len, queue) }
    }
    unsafe fn launch(
        &self,
        kernel: KernelHandle,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        dims.validate(&self.info_ref()?.limits)?;
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { self.device.launch(kernel, dims, args, queue) }
    }
    fn queue_create(&self) -> Result<QueueHandle> {
        self.device.queue_create()
    }
    fn queue_synchronize(&self, queue: QueueHandle) -> Result<()> {
        self.device.queue_synchronize(queue)
    }
    fn queue_destroy(&self, queue: QueueHandle) -> Result<()> {
        self.device.queue_destroy(queue)
    }
    fn event_create(&self) -> Result<EventHandle> {
        self.device.event_create()
    }
    fn event_record(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        self.device.event_record(event, queue)
    }
    fn event_wait(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        self.device.event_wait(event, queue)
    }
    fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        self.device.event_synchronize(event)
    }
    fn event_query(&self, event: EventHandle) -> Result<bool> {
        self.device.event_query(event)
    }
    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        self.device.event_destroy(event)
    }
    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<std::time::Duration> {
        self.device.event_elapsed(start, end)
    }
}
