//! What the engine needs from LLVM's C++ API (see `cpp/target_info.cpp`): processor and
//! feature tables, target machines with llc's options, and parsing with the target's layout.

use inkwell::context::{AsContextRef, Context};
use inkwell::module::Module;
use inkwell::targets::{Target, TargetMachine};
use offload_core::{Error, Result};
use std::ffi::{CStr, CString, c_char, c_void};

unsafe extern "C" {
    fn offload_jit_cpu_is_valid(target_machine: *mut c_void, cpu: *const c_char) -> i32;
    fn offload_jit_cpu_names(
        target_machine: *mut c_void,
        sink: extern "C" fn(*mut c_void, *const c_char, usize),
        ctx: *mut c_void,
    );
    fn offload_jit_feature_names(
        target_machine: *mut c_void,
        sink: extern "C" fn(*mut c_void, *const c_char, usize),
        ctx: *mut c_void,
    );
    fn offload_jit_create_target_machine(
        target: inkwell::llvm_sys::target_machine::LLVMTargetRef,
        triple: *const c_char,
        cpu: *const c_char,
        features: *const c_char,
        opt: i32,
        reloc: i32,
    ) -> inkwell::llvm_sys::target_machine::LLVMTargetMachineRef;
    fn offload_jit_parse_module(
        context: inkwell::llvm_sys::prelude::LLVMContextRef,
        data: *const c_char,
        len: usize,
        name: *const c_char,
        default_layout: *const c_char,
        error: *mut *mut c_char,
    ) -> inkwell::llvm_sys::prelude::LLVMModuleRef;
}

fn c_string(what: &str, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::InvalidArgument(format!("{what} '{s}' contains a NUL byte")))
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
    // SAFETY: `ctx` is the Vec passed by the caller; `name` is valid for `len` bytes.
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

/// Every feature name the target knows (without `+`/`-`).
pub fn feature_names(tm: &TargetMachine) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    // SAFETY: as `cpu_names`.
    unsafe {
        offload_jit_feature_names(
            tm.as_mut_ptr() as *mut c_void,
            push_name,
            &mut names as *mut Vec<String> as *mut c_void,
        )
    };
    names
}

/// A target machine made the way llc makes one (static constructors in `.init_array`).
pub fn create_target_machine(
    target: &Target,
    triple: &str,
    cpu: &str,
    features: &str,
    opt: u8,
    pic: bool,
) -> Result<TargetMachine> {
    let (t, c, f) = (
        c_string("triple", triple)?,
        c_string("CPU", cpu)?,
        c_string("features", features)?,
    );
    // SAFETY: live target and C strings; the helper returns a new machine or null.
    let raw = unsafe {
        offload_jit_create_target_machine(
            target.as_mut_ptr(),
            t.as_ptr(),
            c.as_ptr(),
            f.as_ptr(),
            i32::from(opt),
            i32::from(pic),
        )
    };
    if raw.is_null() {
        return Err(Error::Unsupported(format!(
            "LLVM cannot create a target machine for '{triple}'"
        )));
    }
    // SAFETY: a fresh, non-null target machine that the wrapper now owns.
    Ok(unsafe { TargetMachine::new(raw) })
}

/// Parses bitcode or IR into `context`; a module without a data layout gets `layout`.
pub fn parse_module<'ctx>(
    context: &'ctx Context,
    bytes: &[u8],
    name: &str,
    layout: &str,
) -> std::result::Result<Module<'ctx>, String> {
    let (n, l) = (
        CString::new(name.replace('\0', "?")).expect("NULs replaced"),
        CString::new(layout.replace('\0', "?")).expect("NULs replaced"),
    );
    let mut error: *mut c_char = std::ptr::null_mut();
    // SAFETY: live context; the data slice and C strings are valid for the call; the helper
    // copies the data.
    let raw = unsafe {
        offload_jit_parse_module(
            context.as_ctx_ref(),
            bytes.as_ptr() as *const c_char,
            bytes.len(),
            n.as_ptr(),
            l.as_ptr(),
            &mut error,
        )
    };
    if raw.is_null() {
        let text = if error.is_null() {
            "unreadable module".to_string()
        } else {
            // SAFETY: a malloc'ed, NUL-terminated message from the helper, freed here.
            unsafe {
                let t = CStr::from_ptr(error).to_string_lossy().into_owned();
                libc::free(error as *mut c_void);
                t
            }
        };
        return Err(text);
    }
    // SAFETY: a fresh module in `context`, owned by the wrapper from here on.
    Ok(unsafe { Module::new(raw) })
}
