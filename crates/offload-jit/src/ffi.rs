//! The in-process entry point of the engine library (`liboffload_jit.so`), used by the JIT
//! client when `OFFLOAD_JIT_ISOLATION=inprocess`: the same payloads as the worker's pipe, as one
//! C call. Not crash-safe by nature: LLVM runs in the caller's process.

use std::ffi::c_void;

/// Receives the result payload.
pub type Sink = unsafe extern "C" fn(ctx: *mut c_void, bytes: *const u8, len: usize);

/// Compiles one `COMPILE` payload and writes the `RESULT` payload to `sink`. Returns 0, or 1 if
/// the arguments are null.
///
/// # Safety
/// - `payload` must be valid for reads of `len` bytes.
/// - `sink` must be callable with `ctx` and a byte slice.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn offload_jit_compile_payload(
    payload: *const u8,
    len: usize,
    sink: Option<Sink>,
    ctx: *mut c_void,
) -> i32 {
    let Some(sink) = sink else {
        return 1;
    };
    if payload.is_null() && len > 0 {
        return 1;
    }
    let bytes: &[u8] = if len == 0 {
        &[]
    } else {
        // SAFETY: non-null and valid for `len` bytes per the contract.
        unsafe { std::slice::from_raw_parts(payload, len) }
    };
    // `handle` catches panics of the engine itself.
    let result = crate::serve::handle(bytes);
    // SAFETY: per the contract; the result is live for the call.
    unsafe { sink(ctx, result.as_ptr(), result.len()) };
    0
}
