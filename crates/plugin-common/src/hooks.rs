//! The hooks a backend implements ([`Backend`] for its plugin, [`DeviceBackend`] for each
//! device) and the operations the layer hands them ([`Op`]).

use offload_core::image::ImageKind;
use offload_core::jit::{JitTarget, ParamType, PostProcess};
use offload_core::{
    DeviceInfo, DevicePtr, GlobalSymbol, ImageClaim, KernelArg, LaunchDims, MemoryKind, Result,
};

/// How well an image labelled for one compute-unit kind suits a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fit {
    /// Made for exactly this device.
    Exact,
    /// Runs here (a generic build, an older minor architecture).
    Compatible,
    /// Does not run here, and why.
    No(String),
}

/// A backend: one device family. Creating it must be cheap and touch no driver.
pub trait Backend: Send + Sync + 'static {
    /// The backend's devices.
    type Device: DeviceBackend;
    /// Short name (`host`, `cuda`).
    fn name(&self) -> &'static str;
    /// The ELF machine of its native images.
    fn elf_machine(&self) -> u16;
    /// The LLVM triple of its devices (what bitcode is compiled for).
    fn target_triple(&self) -> &'static str;
    /// The image kinds it serves (ELF of a machine, bitcode for a triple, PTX, fatbins).
    fn claims(&self) -> Vec<ImageClaim>;
    /// Loads the driver and counts the devices; called at most once. A missing driver is
    /// `Ok(0)` or `Error::NoDevice` with the reason, never a panic.
    fn init(&self) -> Result<usize>;
    /// Device `index` (`0..init()`), made once.
    fn device(&self, index: usize) -> Result<Self::Device>;
    /// Whether a native image of a kind it claims is well formed for this backend (without
    /// asking a device).
    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()>;
    /// Facts for `offload info` (driver library, assembler, ...).
    fn properties(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Host memory an operation reads or writes; valid until the operation has run (the
/// `copy_*_device` contracts of `GenericDevice`).
#[derive(Debug, Clone, Copy)]
pub struct HostPtr(pub *mut u8);

// SAFETY: the `copy_*_device` contracts make the caller keep the memory valid and untouched
// until the operation has run, which is what makes handing the pointer to a queue sound.
unsafe impl Send for HostPtr {}

/// One operation for a device to run.
#[derive(Debug)]
pub enum Op<'a, D: DeviceBackend> {
    /// `len` host bytes at `src` to device memory at `dst`.
    CopyToDevice {
        /// Destination.
        dst: DevicePtr,
        /// Source.
        src: HostPtr,
        /// Bytes.
        len: usize,
    },
    /// `len` device bytes at `src` to host memory at `dst`.
    CopyFromDevice {
        /// Destination.
        dst: HostPtr,
        /// Source.
        src: DevicePtr,
        /// Bytes.
        len: usize,
    },
    /// `len` bytes between two device ranges that do not overlap (GPU copy engines give no
    /// result for overlapping ones; the layer splits or stages those, `copy_within`).
    CopyDeviceToDevice {
        /// Destination.
        dst: DevicePtr,
        /// Source.
        src: DevicePtr,
        /// Bytes.
        len: u64,
    },
    /// A kernel launch.
    Launch {
        /// The kernel.
        kernel: &'a D::Kernel,
        /// The program it belongs to.
        program: &'a D::Program,
        /// Its name.
        name: &'a str,
        /// Grid, block, dynamic shared memory.
        dims: LaunchDims,
        /// Arguments (already checked against the kernel's signature when one is known).
        args: &'a [KernelArg],
    },
}

/// One device of a backend: the hooks the layer calls. Every hook may assume the layer's
/// checks: handles resolved, ranges inside live regions of this device, arguments matching a
/// known signature, launch shapes within the device's limits.
pub trait DeviceBackend: Send + Sync + Sized + 'static {
    /// A loaded program.
    type Program: Send + Sync + 'static;
    /// A kernel of a program.
    type Kernel: Send + Sync + 'static;
    /// What a queue runs its operations on (a CUDA stream; `()` on the host).
    type Stream: Send + Sync + 'static;

    /// Name, compute-unit kind, features, memory and limits.
    fn info(&self) -> Result<DeviceInfo>;
    /// Called before every other hook, on the calling thread (make a driver context current).
    fn enter(&self) -> Result<()> {
        Ok(())
    }
    /// How bitcode becomes an image for this device: the JIT target and post-processing step;
    /// `None` if the device loads no bitcode.
    fn jit_target(&self) -> Option<(JitTarget, PostProcess)> {
        None
    }
    /// How an image labelled `arch` (in a container) suits this device, when the label is not
    /// the device's exact compute-unit kind. The default: unlabelled images are compatible.
    fn fits(&self, arch: &str) -> Fit {
        if arch.is_empty() || arch == "generic" {
            Fit::Compatible
        } else {
            Fit::No(format!("built for '{arch}'"))
        }
    }
    /// Whether this device runs a native image of a kind its plugin claims.
    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()>;
    /// Loads a native image (the JIT's output for bitcode).
    fn load(&self, image: &[u8], kind: &ImageKind) -> Result<Self::Program>;
    /// Looks up a kernel, with its parameter types when the image says them.
    fn kernel(
        &self,
        program: &Self::Program,
        name: &str,
    ) -> Result<(Self::Kernel, Option<Vec<ParamType>>)>;
    /// Checks a launch against what the device itself knows of the kernel: its parameters (a
    /// driver's parameter sizes) beyond the image's signature that the layer checks, and its
    /// own limits (threads per block, shared memory) beyond the device's; called before the
    /// launch is queued. The default knows nothing more.
    fn check_launch(
        &self,
        kernel: &Self::Kernel,
        name: &str,
        dims: &LaunchDims,
        args: &[KernelArg],
    ) -> Result<()> {
        let _ = (kernel, name, dims, args);
        Ok(())
    }
    /// Looks up a global variable.
    fn global(&self, program: &Self::Program, name: &str) -> Result<GlobalSymbol>;
    /// Allocates `size` bytes (> 0).
    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr>;
    /// Frees an allocation of `kind`; called once, when no operation uses it any more.
    fn free(&self, ptr: DevicePtr, size: u64, kind: MemoryKind);
    /// Where this process addresses the device memory at `ptr` (inside an allocation the
    /// layer checked), if the device's memory is the process's own (the host: yes, its device
    /// pointers are addresses; a GPU: no, the default). See [`GenericDevice::host_access`].
    ///
    /// [`GenericDevice::host_access`]: offload_core::GenericDevice::host_access
    fn host_address(&self, ptr: DevicePtr) -> Option<*mut u8> {
        let _ = ptr;
        None
    }
    /// Whether every non-null pointer argument must lie in (or just past the end of) a region
    /// the layer tracks (the host: yes, its kernels run in this process; a GPU: no, its kernels
    /// may get memory another runtime of the process allocated, and a stray pointer faults on
    /// the GPU, not here).
    fn strict_pointers(&self) -> bool {
        true
    }
    /// Whether an operation holds the layer's lock of every region it uses while it runs, so
    /// that two operations on the same memory never run at the same time. The host: yes (its
    /// copies and kernels touch the memory from host threads). A GPU: no (the default is yes):
    /// its streams order the work, and a lock held across GPU work would keep kernels on
    /// different queues that only read a buffer from running together and deadlock kernels
    /// that wait for each other through memory. Queued work still keeps what it uses alive,
    /// and synchronous operations still wait for queued work on the same memory.
    fn locks_regions(&self) -> bool {
        true
    }
    /// Makes what one queue runs on.
    fn stream_create(&self) -> Result<Self::Stream>;
    /// Whether the device's streams order its work (CUDA streams: yes; the default: no). Then
    /// `execute` given a queue's stream only puts the operation on it, and returns; the layer
    /// keeps what the operation uses alive, and counts it as done, only once
    /// [`DeviceBackend::sync_stream`] has returned after it (see [`queue`](crate::queue)). Without a stream,
    /// `execute` still runs the operation to completion. Only asked of a backend that does not
    /// lock regions ([`DeviceBackend::locks_regions`]).
    fn stream_ordered(&self) -> bool {
        false
    }
    /// Waits until every operation put on `stream` has run; the error of one that failed. Only
    /// called when [`DeviceBackend::stream_ordered`] says yes.
    fn sync_stream(&self, stream: &Self::Stream) -> Result<()> {
        let _ = stream;
        Ok(())
    }
    /// Runs `op` to completion on the calling thread, or, queued (`stream`: the queue's) on a
    /// [stream-ordered](DeviceBackend::stream_ordered) device, puts it on the stream.
    fn execute(&self, op: Op<'_, Self>, stream: Option<&Self::Stream>) -> Result<()>;
}
