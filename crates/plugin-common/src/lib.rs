//! # plugin-common: the generic device layer
//!
//! Upstream's `GenericDeviceTy` role: the work every backend needs is done here, once, and a
//! backend is a crate of small `*_impl`-style hooks ([`Backend`], [`DeviceBackend`]) that
//! [`export_backend!`] turns into a complete plugin.
//!
//! What the layer does around the hooks:
//! - **Loading** ([`select`]): classify the image; unpack containers (LLVM offload binaries,
//!   clang offload bundles, both also inside ELF sections) and pick the entry for the device
//!   (exact compute-unit kind, then a compatible one, then bitcode); compile bitcode and IR
//!   through the JIT ([`jit`]: the runtime's process-wide service, or a client of its own) with
//!   the device's target and post-processing step; then [`DeviceBackend::load`].
//! - **Handles** ([`handles`]): programs, kernels, queues and events get handles bound to their
//!   device and kind, never reused; misuse is a clear error, never another object.
//! - **Memory** ([`memory`]): allocations and looked-up globals are tracked; every copy and
//!   pointer argument must lie in a live region of this device (for backends that ask for it);
//!   the work that uses a region keeps it alive until it has run, so `free` (and dropping a
//!   buffer) never releases memory under queued or running work; operations on the same memory
//!   never run at the same time.
//! - **Launches**: arguments are checked against the kernel's signature when one is known (JIT
//!   images always have one).
//! - **Queues and events** ([`queue`]): in-order queues that fail cleanly (a failing or
//!   panicking job fails the queue; `synchronize` reports it and never hangs), events that
//!   order work across queues.
//! - **Context**: [`DeviceBackend::enter`] runs before every hook, on whatever thread calls in
//!   (CUDA makes its context current there).

pub mod args;
mod device;
pub mod dylib;
pub mod handles;
pub mod health;
mod hooks;
pub mod jit;
pub mod memory;
mod plugin;
pub mod queue;
pub mod select;
pub mod staging;

pub use device::{Device, MAX_COPY_PIECES};
pub use hooks::{Backend, DeviceBackend, Fit, HostPtr, Op};
pub use memory::Hold;
pub use offload_abi;
pub use offload_core;
pub use plugin::{LayerDevice, Plugin};

/// Turns a backend into a plugin library's entry point:
/// `offload_plugin_common::export_backend!(unsafe MyBackend::new);`.
///
/// The `unsafe` is the exporting crate's word for what [`Plugin::new`] asks (its backend keeps
/// [`DeviceBackend`]'s contract) and for what `MyBackend::new` asks, if it is an `unsafe fn`
/// (the layer is the only user of its raw devices): the macro calls both.
#[macro_export]
macro_rules! export_backend {
    (unsafe $ctor:path) => {
        $crate::offload_abi::export_plugin!(unsafe || {
            // SAFETY: the invocation says `unsafe`: the exporting crate promises that its
            // backend keeps the hooks' contract, and only the layer uses its devices.
            #[allow(unused_unsafe)]
            unsafe {
                $crate::Plugin::new($ctor())
            }
        });
    };
}
