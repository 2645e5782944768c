//! The host CPU as LLVM names it (`sapphirerapids`, `znver3`) and its feature list, from LLVM's
//! own detection code linked statically (see `cpp/host_cpu.cpp` and `build.rs`): the JIT gets
//! exactly the CPU LLVM would pick, and the plugin never maps libLLVM.

use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

unsafe extern "C" {
    fn offload_host_cpu_name(
        sink: extern "C" fn(*mut c_void, *const c_char, usize),
        ctx: *mut c_void,
    );
    fn offload_host_cpu_features(
        sink: extern "C" fn(*mut c_void, *const c_char, usize),
        ctx: *mut c_void,
    );
}

extern "C" fn set(ctx: *mut c_void, text: *const c_char, len: usize) {
    // SAFETY: `ctx` is the `String` of `read`, live for the call; `text` is valid for `len`
    // bytes per the helper's contract.
    unsafe {
        let s = &mut *(ctx as *mut String);
        *s = String::from_utf8_lossy(std::slice::from_raw_parts(text as *const u8, len))
            .into_owned();
    }
}

fn read(
    f: unsafe extern "C" fn(extern "C" fn(*mut c_void, *const c_char, usize), *mut c_void),
) -> String {
    let mut s = String::new();
    // SAFETY: the helper calls `set` once with a valid slice; `s` outlives the call.
    unsafe { f(set, &mut s as *mut String as *mut c_void) };
    s
}

/// `(cpu name, features)`, detected once.
pub fn host_cpu() -> &'static (String, String) {
    static CPU: OnceLock<(String, String)> = OnceLock::new();
    CPU.get_or_init(|| (read(offload_host_cpu_name), read(offload_host_cpu_features)))
}
