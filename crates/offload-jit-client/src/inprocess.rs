//! In-process compiles (`OFFLOAD_JIT_ISOLATION=inprocess`): the engine library
//! (`liboffload_jit.so`, built from `offload-jit`) is opened in the calling process and handed
//! the same payloads the worker gets. No process start, but **not crash-safe**: whatever makes
//! LLVM abort or crash takes the caller with it, and the time and memory limits do not apply.
//! The library is opened on the first compile only, so a process that never compiles still
//! never maps LLVM.

use offload_core::jit::protocol::{self, WorkerOutput};
use offload_core::{Error, Result};
use std::ffi::c_void;
use std::path::{Path, PathBuf};

/// The entry point the engine library exports.
pub const ENTRY: &str = "offload_jit_compile_payload";

type Sink = unsafe extern "C" fn(ctx: *mut c_void, bytes: *const u8, len: usize);
type Entry =
    unsafe extern "C" fn(payload: *const u8, len: usize, sink: Sink, ctx: *mut c_void) -> i32;

/// The engine library, opened once and never closed.
#[derive(Debug)]
pub struct InProcess {
    path: PathBuf,
    entry: Entry,
}

unsafe extern "C" fn collect(ctx: *mut c_void, bytes: *const u8, len: usize) {
    if bytes.is_null() || len == 0 {
        return;
    }
    // SAFETY: `ctx` is the `Vec<u8>` of `InProcess::compile`, live for the call; `bytes` is
    // valid for `len` bytes per the entry's contract.
    unsafe {
        (*(ctx as *mut Vec<u8>)).extend_from_slice(std::slice::from_raw_parts(bytes, len));
    }
}

impl InProcess {
    /// Opens the engine library.
    pub fn open(path: &Path) -> Result<Self> {
        let shown = path.display();
        // SAFETY: opening the engine library runs LLVM's initialisers, which is what
        // in-process mode asks for; it is never closed.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
            Error::System(format!("cannot open the JIT engine library '{shown}': {e}"))
        })?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: the symbol has the `Entry` type by the engine library's contract.
        let entry: libloading::Symbol<'static, Entry> = unsafe { lib.get(ENTRY.as_bytes()) }
            .map_err(|e| Error::System(format!("'{shown}' is not the JIT engine library: {e}")))?;
        Ok(InProcess {
            path: path.to_path_buf(),
            entry: *entry,
        })
    }

    /// The library's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs one [`protocol::COMPILE`] payload.
    pub fn compile(&self, payload: &[u8]) -> Result<Result<WorkerOutput>> {
        let mut out: Vec<u8> = Vec::new();
        // SAFETY: the payload slice and the output vector are live for the call; the entry
        // catches its own panics.
        let status = unsafe {
            (self.entry)(
                payload.as_ptr(),
                payload.len(),
                collect,
                &mut out as *mut Vec<u8> as *mut c_void,
            )
        };
        if status != 0 {
            return Err(Error::System(format!(
                "the JIT engine library '{}' failed with status {status}",
                self.path.display()
            )));
        }
        protocol::decode_result(&out)
    }
}
