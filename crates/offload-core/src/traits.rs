//! The two traits every backend implements and the runtime consumes.
//!
//! A backend crate implements the generic device layer's hooks (`plugin-common`), which turns
//! them into [`GenericPlugin`] and [`GenericDevice`] and exports them with
//! `offload_abi::export_plugin!`. The runtime loads the library and gets the same traits back
//! through `offload_abi::loader`, so both sides only ever hold `dyn GenericPlugin` and
//! `dyn GenericDevice`. Checks common to every backend (init once, device index in range,
//! launch shape within the device's limits, null pointers, empty images) are the layer's, made
//! once for every backend built on it, so backends implement only their own part; a plugin
//! that implements these traits itself makes them itself.

use crate::error::Result;
use crate::jit::JitService;
use crate::types::{
    DeviceInfo, DevicePtr, EventHandle, GlobalSymbol, ImageClaim, JitStats, KernelArg,
    KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle,
};
use std::sync::Arc;

/// A backend: one device family (NVIDIA GPUs, AMD GPUs, the host CPU, ...).
///
/// Creating the plugin object must be cheap and must not touch a driver: drivers are loaded
/// and initialised in [`GenericPlugin::init`], which the runtime calls on first need.
pub trait GenericPlugin: Send + Sync {
    /// Short name used by `OFFLOAD_PLUGINS` and `--device NAME:INDEX` (`host`, `cuda`).
    fn name(&self) -> &str;

    /// The ELF machine (`e_machine`) of the native images this plugin loads.
    fn elf_machine(&self) -> u16;

    /// The LLVM target triple of the plugin's devices (used to route bitcode).
    fn target_triple(&self) -> &str;

    /// Initialises the backend (loads the driver, enumerates devices) and returns the number of
    /// devices. Called at most once (the generic layer keeps the outcome); a missing driver is `Ok(0)` or an error
    /// that says why, never a panic.
    fn init(&self) -> Result<usize>;

    /// Whether this plugin can load `image` on some device; the error says why not.
    fn check_image(&self, image: &[u8]) -> Result<()>;

    /// The image kinds this plugin serves. The default: ELF of its machine and bitcode for its
    /// triple.
    fn image_claims(&self) -> Vec<ImageClaim> {
        vec![
            ImageClaim::Elf {
                machine: self.elf_machine(),
            },
            ImageClaim::Bitcode {
                triple: self.target_triple().to_string(),
            },
        ]
    }

    /// Device `index` (`0..init()`). The generic layer checks the range.
    fn device(&self, index: usize) -> Result<Arc<dyn GenericDevice>>;

    /// Facts about the plugin for users (`offload info`): which driver library it loaded,
    /// which assembler it uses, and the like, as `(key, value)` pairs.
    fn properties(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Counters of the plugin's own JIT client; `None` for a plugin without one (or one that
    /// uses the runtime's, which keeps the counters itself).
    fn jit_stats(&self) -> Option<JitStats> {
        None
    }

    /// Offers the runtime's process-wide JIT. A plugin that compiles bitcode keeps the first one
    /// offered and uses it for every compile; one that compiles nothing refuses with
    /// `Unsupported` (the default). Called before [`GenericPlugin::init`].
    fn set_jit_service(&self, service: Arc<dyn JitService>) -> Result<()> {
        drop(service);
        Err(crate::Error::Unsupported(format!(
            "plugin '{}' compiles no bitcode",
            self.name()
        )))
    }
}

/// One device of a plugin.
///
/// Queue arguments: `None` runs the operation synchronously on the calling thread; `Some(q)`
/// enqueues it on queue `q` (in order with the queue's other work, asynchronously to the
/// caller) and [`GenericDevice::queue_synchronize`] waits for it and reports its errors.
///
/// Contract the safe API (the `offload` crate) relies on, which the generic device layer
/// (`plugin-common`) keeps for every backend built on it: a synchronous operation on memory
/// first waits for the queued operations, on any queue, that use the same allocation or
/// global; memory an operation uses stays allocated until it has run, even if freed first;
/// `MemoryKind::Host` and `Shared` allocations that are memory of the calling process may be
/// handed out as host slices (the runtime checks that they are before it does).
pub trait GenericDevice: Send + Sync {
    /// Index of the device within its plugin.
    fn index(&self) -> usize;

    /// Name, compute-unit kind, target features, memory and limits.
    fn info(&self) -> Result<DeviceInfo>;

    /// Whether this particular device can run `image` (e.g. the right `gfx` target).
    fn check_image(&self, image: &[u8]) -> Result<()>;

    /// Loads an image and returns a handle that is never reused on this device.
    ///
    /// # Safety
    /// Loading runs the image's code: its initialisers (a host image's `.init_array`, a GPU
    /// image's constructor kernels) run now, and what its kernels do when launched is its own.
    /// The caller trusts `image` as it trusts code it links: it was built by, or for, this
    /// program. The layer checks the image's format, target and symbols; not what its code does.
    unsafe fn load_image(&self, image: &[u8]) -> Result<ProgramHandle>;

    /// Unloads a program. Kernels looked up in it become invalid.
    ///
    /// # Safety
    /// The caller holds no address into the program (a global's memory, a kernel's code) that
    /// it will use afterwards: the layer keeps the program loaded until the work that uses it
    /// has run, but it cannot know about pointers a caller kept.
    unsafe fn unload_image(&self, program: ProgramHandle) -> Result<()>;

    /// Looks up a kernel entry point by name.
    fn kernel(&self, program: ProgramHandle, name: &str) -> Result<KernelHandle>;

    /// Looks up a global variable by name.
    fn global(&self, program: ProgramHandle, name: &str) -> Result<GlobalSymbol>;

    /// Allocates `size` bytes (size > 0) of device memory.
    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr>;

    /// Frees an allocation returned by [`GenericDevice::alloc`].
    ///
    /// # Safety
    /// Nothing will use the allocation after this call: no host slice of it (host and shared
    /// memory), no kernel argument, no later copy. The generic layer refuses a pointer it did not
    /// hand out or already freed, and keeps the memory until queued work that uses it has run;
    /// it cannot know who else holds the address (the safe API's buffers do).
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()>;

    /// Copies `len` host bytes at `src` to device memory at `dst`.
    ///
    /// # Safety
    /// - `src` must be valid for reads of `len` bytes.
    /// - With a queue, `src` must stay valid and unmodified until the queue is synchronised.
    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()>;

    /// Copies `len` device bytes at `src` to host memory at `dst`.
    ///
    /// # Safety
    /// - `dst` must be valid for writes of `len` bytes.
    /// - With a queue, `dst` must stay valid and not be read or written by anyone else until
    ///   the queue is synchronised.
    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()>;

    /// Copies `len` bytes between two device allocations of this device.
    ///
    /// # Safety
    /// `dst..dst+len` is memory nobody else reads or writes until the copy has run (with a
    /// queue: until the queue is synchronised), as Rust's `&mut` would promise. The layer
    /// checks that both ranges lie in live allocations of this device; not who else uses them.
    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        queue: Option<QueueHandle>,
    ) -> Result<()>;

    /// Launches a kernel with typed arguments.
    ///
    /// # Safety
    /// The kernel reads and writes memory through its arguments as its code says, and nothing
    /// here knows how far: the caller makes sure that every pointer the arguments carry
    /// (`KernelArg::Ptr`, or an address in a `Word`) points into memory that stays allocated
    /// until the launch has run (with a queue: until the queue is synchronised) and is as long
    /// as the kernel touches for these arguments, that no other work uses memory the kernel
    /// writes meanwhile, and that the arguments are the kernel's parameters. The layer checks
    /// the launch shape, and on the host backend that pointers point into live allocations
    /// and the types where the kernel declares them; not the extents.
    unsafe fn launch(
        &self,
        kernel: KernelHandle,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()>;

    /// Creates an in-order queue.
    fn queue_create(&self) -> Result<QueueHandle>;

    /// Waits until everything enqueued on `queue` has finished; returns the first error any of
    /// it hit (and clears it).
    fn queue_synchronize(&self, queue: QueueHandle) -> Result<()>;

    /// Waits for the queue to drain, then destroys it.
    fn queue_destroy(&self, queue: QueueHandle) -> Result<()>;

    /// Creates an event (not yet recorded: waiting for it returns at once).
    fn event_create(&self) -> Result<EventHandle> {
        Err(unsupported("events"))
    }

    /// Records `event` on `queue`: it completes when everything enqueued before it has.
    fn event_record(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        let _ = (event, queue);
        Err(unsupported("events"))
    }

    /// Makes `queue` wait, before its later work, until `event` completes.
    fn event_wait(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        let _ = (event, queue);
        Err(unsupported("events"))
    }

    /// Waits on the calling thread until `event` completes; returns the error of the work it
    /// followed, if that failed.
    fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        let _ = event;
        Err(unsupported("events"))
    }

    /// Whether `event` has completed.
    fn event_query(&self, event: EventHandle) -> Result<bool> {
        let _ = event;
        Err(unsupported("events"))
    }

    /// Destroys an event.
    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        let _ = event;
        Err(unsupported("events"))
    }

    /// The time from `start`'s completion to `end`'s, both recorded and completed (ABI 1.5).
    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<std::time::Duration> {
        let _ = (start, end);
        Err(unsupported("event timing"))
    }

    /// Runs `visit` on the device memory `ptr..ptr+len` as this process's own memory, where
    /// the device's memory is (the host backend's): `visit` is given its address, and may read
    /// and write those `len` bytes until it returns (ABI 1.6). Meanwhile the device's other
    /// work on that memory waits, as for a synchronous copy (so `visit` must not itself ask
    /// the device for work on that memory: it would wait for ever). The range is checked like
    /// a copy's; a device whose memory this process cannot address says `Unsupported`, and
    /// `visit` is not called. `visit`'s error is the call's.
    ///
    /// A proxy receives a copy's bytes straight into such memory (`offload-mpi-proxy`), where
    /// a copy would take them through a buffer of its own.
    ///
    /// # Safety
    /// As [`GenericDevice::copy_device_to_device`]'s destination: `ptr..ptr+len` is nobody
    /// else's to read or write meanwhile; `visit` touches no byte outside it and keeps no
    /// pointer into it after it returns.
    unsafe fn host_access(
        &self,
        ptr: DevicePtr,
        len: u64,
        visit: &mut dyn FnMut(*mut u8) -> Result<()>,
    ) -> Result<()> {
        let _ = (ptr, len, visit);
        Err(unsupported("host access to its memory"))
    }
}

fn unsupported(what: &str) -> crate::Error {
    crate::Error::Unsupported(format!("this device does not support {what}"))
}

impl dyn GenericDevice {
    /// Synchronous host-to-device copy of a whole slice.
    ///
    /// # Safety
    /// As [`GenericDevice::copy_device_to_device`]'s destination: `dst..dst+src.len()` is
    /// nobody else's to read or write meanwhile (on the host backend it is process memory).
    pub unsafe fn write(&self, dst: DevicePtr, src: &[u8]) -> Result<()> {
        // SAFETY: `src` is a live slice of `src.len()` bytes and the copy is synchronous, so it
        // is not used after this call returns; the destination is the caller's promise.
        unsafe { self.copy_to_device(dst, src.as_ptr(), src.len(), None) }
    }

    /// Synchronous device-to-host copy filling a whole slice.
    ///
    /// # Safety
    /// Nobody writes `src..src+dst.len()` meanwhile.
    pub unsafe fn read(&self, dst: &mut [u8], src: DevicePtr) -> Result<()> {
        // SAFETY: `dst` is an exclusively borrowed slice of `dst.len()` bytes and the copy is
        // synchronous; the source is the caller's promise.
        unsafe { self.copy_from_device(dst.as_mut_ptr(), src, dst.len(), None) }
    }
}
