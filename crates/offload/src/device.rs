//! A device of a plugin, as the safe API holds it: information, loading (the trust point),
//! memory and queues.

use crate::{DeviceBuffer, DeviceCopy, Program};
use offload_core::{DeviceInfo, Error, GenericDevice, MemoryKind, Result};
use std::sync::Arc;

/// A device of a plugin, with its address (`plugin:index`) for messages.
#[derive(Clone)]
pub struct Device {
    pub(crate) plugin: String,
    pub(crate) index: usize,
    pub(crate) kind: offload_core::DeviceKind,
    pub(crate) inner: Arc<dyn GenericDevice>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}:{})", self.plugin, self.index)
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.plugin, self.index)
    }
}

impl Device {
    /// Identifies the device object (for binding kernels to their program's device).
    pub(crate) fn identity(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }

    /// The plugin's name.
    pub fn plugin_name(&self) -> &str {
        &self.plugin
    }

    /// Index within the plugin.
    pub fn index(&self) -> usize {
        self.index
    }

    /// What kind of processor it is (from its plugin's ELF machine).
    pub fn kind(&self) -> offload_core::DeviceKind {
        self.kind
    }

    /// The device API, for this crate's own checked wrappers.
    pub(crate) fn inner(&self) -> &Arc<dyn GenericDevice> {
        &self.inner
    }

    /// Device information.
    pub fn info(&self) -> Result<DeviceInfo> {
        self.inner.info()
    }

    /// Loads an image that this program trusts as its own code; it is unloaded when the
    /// [`Program`] is dropped. This is the safe API's one trust point for device code: after
    /// it, kernels launch through checked, safe calls ([`Kernel::launch`](crate::Kernel::launch), [`TypedKernel`]).
    ///
    /// The layer checks what an image is (its format, ELF machine, target and symbols; a
    /// container's entries; bitcode's triple) and refuses one this device cannot run, naming
    /// why. It cannot check what the image's code does, so it believes two things about it:
    ///
    /// - **Its code.** Loading runs the image's initialisers (a host image's `.init_array`, a
    ///   GPU image's constructor kernels) in this process or on the device, and a kernel does
    ///   whatever its code says with the memory its arguments reach.
    /// - **What it says of its kernels.** A launch checks the arguments against the kernel's
    ///   parameter record (`OFFLOAD_PARAMS`: each buffer's element type and how many elements
    ///   the kernel reads or writes, as expressions of the scalar arguments) and, where the
    ///   image declares them, against its parameter types (bitcode signatures; a host ELF's
    ///   `OFFLOAD_SIGNATURE`; a SPIR-V module's entry point). The record is the image's word
    ///   about itself: a record that says `float y[n]` for a kernel that writes `2n` elements
    ///   is memory corruption, and no check here can see it. A kernel without a record is
    ///   checked for its argument count and types only where the image declares them, and
    ///   for no extent.
    ///
    /// # Safety
    /// `image` is code the caller would run as its own native code, as wgpu's
    /// `create_shader_module_trusted` asks of a shader: built by or for this program (its
    /// build script's `offload_build` output, [`include_kernels!`](crate::include_kernels), a
    /// file it ships), with each kernel's parameter record true to its code (a kernel touches
    /// no element of a buffer beyond what its record says, and writes only buffers its record
    /// calls writable). Bytes from elsewhere (a network, a user's upload) are not.
    ///
    /// [`TypedKernel`]: crate::TypedKernel
    pub unsafe fn load_trusted(&self, image: &[u8]) -> Result<Program> {
        let _span = tracing::info_span!(
            target: "offload::image",
            "image load",
            device = %self,
            bytes = image.len(),
            "load a {}-byte image on {self}", image.len()
        )
        .entered();
        // SAFETY: the caller trusts the image (this function's contract).
        let handle = unsafe { self.inner.load_image(image) }?;
        Ok(Program::loaded(self.clone(), handle))
    }

    /// Allocates device memory, freed when the [`DeviceBuffer`] is dropped.
    pub fn alloc_buffer(&self, size: u64) -> Result<DeviceBuffer> {
        let len = usize::try_from(size).map_err(|_| {
            Error::OutOfMemory(format!("{size} bytes cannot be addressed on this host"))
        })?;
        self.alloc::<u8>(len)
    }

    /// A buffer of `len` elements of `T` (contents unspecified: any bits, which `T` allows).
    /// Zero elements are an error, as a zero-byte allocation is.
    pub fn alloc<T: DeviceCopy>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let size = Self::byte_size::<T>(len)?;
        let ptr = self.inner.alloc(size, MemoryKind::Device)?;
        tracing::info!(target: "offload::memory", device = %self, "allocated {size} bytes at {ptr} on {self}");
        Ok(DeviceBuffer::from_raw(self.inner.clone(), ptr, len))
    }

    /// `len` elements of host memory the device reaches (pinned on CUDA), which the host
    /// reads and writes in place ([`crate::HostBuffer`]); zero-copy on the host backend.
    pub fn alloc_host<T: DeviceCopy>(&self, len: usize) -> Result<crate::HostBuffer<T>> {
        self.alloc_kind(len, MemoryKind::Host)
    }

    /// `len` elements of memory host and device share (managed memory on GPUs), read and
    /// written in place by the host ([`crate::HostBuffer`]).
    pub fn alloc_shared<T: DeviceCopy>(&self, len: usize) -> Result<crate::HostBuffer<T>> {
        self.alloc_kind(len, MemoryKind::Shared)
    }

    fn alloc_kind<T: DeviceCopy>(
        &self,
        len: usize,
        kind: MemoryKind,
    ) -> Result<crate::HostBuffer<T>> {
        let size = Self::byte_size::<T>(len)?;
        let ptr = self.inner.alloc(size, kind)?;
        tracing::info!(target: "offload::memory", device = %self, "allocated {size} bytes of {kind:?} memory at {ptr} on {self}");
        crate::HostBuffer::new(
            DeviceBuffer::from_raw(self.inner.clone(), ptr, len),
            kind,
            &self.to_string(),
        )
    }

    fn byte_size<T: DeviceCopy>(len: usize) -> Result<u64> {
        Ok(len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|s| *s > 0 || std::mem::size_of::<T>() == 0)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a buffer of {len} elements of {} ({} bytes each) cannot be allocated",
                    std::any::type_name::<T>(),
                    std::mem::size_of::<T>()
                ))
            })? as u64)
    }

    /// A queue of this device: work enqueued on it runs in order, asynchronously to the
    /// caller ([`crate::Queue`]).
    pub fn queue(&self) -> Result<crate::Queue> {
        crate::Queue::new(self.clone())
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: DeviceCopy>(&self, data: &[T]) -> Result<DeviceBuffer<T>> {
        let buf = self.alloc::<T>(data.len())?;
        buf.write(data)?;
        Ok(buf)
    }
}
