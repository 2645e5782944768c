//! The doors below the safe API: the plugin's raw device and the raw plugin. A launch with
//! arguments as they are is the launch builder's, made [`crate::Launch::unchecked`] and given
//! [`crate::Launch::args_raw`]: one way to launch, checked or not.
//!
//! They are for front ends that speak a raw protocol of their own and keep its rules
//! themselves: the drop-in `libomptarget` (`crates/omptarget`), which maps OpenMP's data
//! and passes device addresses the program computed, and a future liboffload (`ol*`) front
//! end; and for tests and benchmarks that measure the layer below the safe API. A Rust program
//! needs none of them: [`Device`], [`crate::DeviceBuffer`], [`crate::Queue`] and
//! a checked [`crate::Kernel::launch`] check what these do not.
//!
//! **What a caller of this module promises**, for every door here and for every unchecked
//! launch:
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

use crate::{Device, PluginSlot};
use offload_core::{GenericDevice, GenericPlugin};
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
