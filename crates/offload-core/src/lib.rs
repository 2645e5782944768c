//! # offload-core
//!
//! The vocabulary every part of the offload runtime shares:
//!
//! - [`GenericPlugin`] / [`GenericDevice`]: what a backend implements and what the runtime
//!   calls. Backends are `cdylib`s loaded at run time; the `offload-abi` crate carries the
//!   traits across the library boundary as a versioned C table, so neither side writes FFI by
//!   hand.
//! - [`Error`]: one error type whose variants callers match on. Caller bugs
//!   ([`Error::InvalidArgument`], [`Error::NotFound`], [`Error::InvalidImage`]) are kept apart
//!   from runtime failures ([`Error::OutOfMemory`], [`Error::Driver`], ...).
//! - [`image`]: everything read out of device images, with an error naming the byte or field
//!   for every malformed input: classification (native ELF with the fields routing needs, LLVM
//!   bitcode, or neither), what the dynamic loader trusts of an ELF ([`image::elf_dyn`]), the
//!   containers that hold images ([`image::container`]), and the target triple of a bitcode or
//!   IR module and whether it fits an engine ([`image::bitcode`], [`image::triple`]), read
//!   without LLVM (routing happens in processes that never load it).
//! - [`jit`]: what plugins ask of the JIT and get back, and the byte format that crosses the
//!   plugin ABI and the pipe to the JIT worker process.
//! - [`types`]: device pointers, handles, launch dimensions, typed kernel arguments and device
//!   information.
//!
//! There is no LLVM here: the JIT engine lives in `offload-jit`.

pub mod diag;
pub mod env;
pub mod error;
pub mod fs;
pub mod image;
pub mod jit;
pub mod panic;
pub mod rand;
pub mod sync;
pub mod text;
pub mod traits;
pub mod types;

pub use error::{Error, ErrorKind, Result};
pub use image::{ElfImage, ElfInfo, ElfRequirements, ImageKind, classify};
pub use traits::{GenericDevice, GenericPlugin};
pub use types::{
    DeviceInfo, DeviceKind, DeviceLimits, DevicePtr, EventHandle, GlobalSymbol, ImageClaim,
    JitStats, KernelArg, KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle,
    ScalarType,
};
