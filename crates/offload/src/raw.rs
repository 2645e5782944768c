//! The doors below the safe API: the plugin's raw device, the raw plugin, and a launch with
//! arguments as they are.
//!
//! They are for front ends that speak a raw protocol of their own and keep its rules
//! themselves: the drop-in `libomptarget` (`crates/omptarget`), which maps OpenMP's data
//! and passes device addresses the program computed, and a future liboffload (`ol*`) front
//! end; and for tests and benchmarks that measure the layer below the safe API. A Rust program
//! needs none of them: [`Device`], [`crate::DeviceBuffer`], [`crate::Queue`] and
//! [`crate::Kernel::launch`] check what these do not.
//!
//! **What a caller of this module promises**, for every door here:
//!
//! - **Memory.** Every device address it passes (a copy's ends, a launch's pointer
//!   arguments, an address inside a scalar argument) lies in memory that is allocated and
//!   stays allocated until the operation has run (queued: until its queue is synchronised), as
//!   long as the operation or the kernel touches; and memory an operation writes is nobody
//!   else's meanwhile, as a Rust `&mut` would promise. That includes the safe API's own: a
//!   [`crate::HostBuffer`]'s slices, a buffer a [`crate::QueueScope`] has lent to queued work,
//!   a [`crate::DeviceBuffer`] the caller still holds (free it through the raw device, and the
//!   buffer's drop frees it again).
//! - **Kernels.** The arguments of a raw launch are the kernel's parameters, in number and
//!   type; the layer checks what the kernel declares (types, counts), never extents.
//! - **Images.** What [`Device::load_trusted`] asks: the image is code the caller trusts.
//!
//! What the layer below still checks, whatever the caller does: handles (a freed or unknown
//! allocation, program, kernel or queue is an error), launch shapes against the device's
//! limits, and, on the host backend, that pointer arguments point into live allocations.

use crate::{Device, Kernel, PluginSlot, Program, Queue};
use offload_core::{GenericDevice, GenericPlugin, KernelArg, LaunchDims, Result};
use std::sync::Arc;

/// The device's plugin-side trait object, for operations the safe API does not wrap.
///
/// # Safety
/// The module's promises, for every `unsafe` method called on it (copies, frees, loads,
/// launches); its safe methods (`info`, `alloc`, `kernel`, queue and event handles) need none.
pub unsafe fn device(device: &Device) -> &Arc<dyn GenericDevice> {
    device.inner()
}

/// The loaded plugin, if loading succeeded; its devices are those of [`device`].
///
/// # Safety
/// As [`device`], for each of its devices.
pub unsafe fn plugin(slot: &PluginSlot) -> Option<&Arc<dyn GenericPlugin>> {
    slot.loaded()
}

/// Launches `kernel` (of `program`) with `args` as they are: synchronously, or enqueued on
/// `queue` (of the program's device; the launch runs after the queue's earlier work, and what
/// it uses stays alive until it has run). [`Kernel::launch`] is the checked launch.
///
/// # Safety
/// The module's promises: every buffer a pointer argument reaches is as long as the kernel
/// touches for these arguments, and no other work uses memory the kernel writes.
pub unsafe fn launch(
    program: &Program,
    queue: Option<&Queue>,
    kernel: &Kernel,
    dims: &LaunchDims,
    args: &[KernelArg],
) -> Result<()> {
    program.check_kernel(kernel)?;
    let inner = program.shared();
    if let Some(q) = queue {
        inner.check_queue(q)?;
    }
    // SAFETY: the caller's contract.
    unsafe { inner.launch(kernel, dims, args, queue.map(Queue::handle)) }
}
