//! Questions about a target machine that need LLVM's C++ API (see `cpp/target_info.cpp`).

use inkwell::targets::TargetMachine;
use std::ffi::{CString, c_char, c_void};

unsafe extern "C" {
    fn offload_jit_cpu_is_valid(target_machine: *mut c_void, cpu: *const c_char) -> i32;
    fn offload_jit_cpu_names(
        target_machine: *mut c_void,
        sink: extern "C" fn(*mut c_void, *const c_char, usize),
        ctx: *mut c_void,
    );
}

/// Whether `cpu` is in the target's processor table.
pub fn cpu_is_valid(tm: &TargetMachine, cpu: &str) -> bool {
    let Ok(c) = CString::new(cpu) else {
        return false;
    };
    // SAFETY: `tm` is a live target machine; the helper only reads its subtarget info.
    unsafe { offload_jit_cpu_is_valid(tm.as_mut_ptr() as *mut c_void, c.as_ptr()) != 0 }
}

extern "C" fn push_name(ctx: *mut c_void, name: *const c_char, len: usize) {
    // SAFETY: `ctx` is the Vec passed by `cpu_names`; `name` is valid for `len` bytes.
    unsafe {
        let names = &mut *(ctx as *mut Vec<String>);
        let bytes = std::slice::from_raw_parts(name as *const u8, len);
        names.push(String::from_utf8_lossy(bytes).into_owned());
    }
}

/// Every CPU name the target knows.
pub fn cpu_names(tm: &TargetMachine) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    // SAFETY: live target machine; the sink appends to `names`, which outlives the call.
    unsafe {
        offload_jit_cpu_names(
            tm.as_mut_ptr() as *mut c_void,
            push_name,
            &mut names as *mut Vec<String> as *mut c_void,
        )
    };
    names
}
