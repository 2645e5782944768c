//! What the library prints, in upstream's words (the suite compares them): `omptarget message:`,
//! `omptarget error:` and `omptarget fatal error N:` lines on stderr, and the `LIBOMPTARGET_INFO`
//! lines (`omptarget device D info: ...`) for the bits set in `LIBOMPTARGET_INFO` /
//! `OFFLOAD_INFO` or by `__tgt_set_info_flag`.

use crate::mapping::Entry;
use std::cell::Cell;
use std::sync::atomic::{AtomicU32, Ordering};

/// The `LIBOMPTARGET_INFO` bits this library prints for (upstream also has KERNEL_ARGS 0x1,
/// MAPPING_EXISTS 0x2, DUMP_TABLE 0x4 and EMPTY_MAPPING 0x40).
pub mod info {
    pub const MAPPING_CHANGED: u32 = 0x8;
    pub const PLUGIN_KERNEL: u32 = 0x10;
    pub const DATA_TRANSFER: u32 = 0x20;
}

static INFO: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// The OpenMP device the calling thread works on, for info lines.
    static DEVICE: Cell<i64> = const { Cell::new(0) };
}

/// Reads `LIBOMPTARGET_INFO` / `OFFLOAD_INFO` with the runtime's own reader (bits, or kinds by
/// name). A bad value is reported once, naming the variable, and counts as 0.
pub fn init_from_env() {
    match offload::diagnostics::Settings::from_env() {
        Ok(s) => INFO.store(s.info, Ordering::Relaxed),
        Err(e) => error(&format!("{e}; ignored")),
    }
}

/// `__tgt_set_info_flag`.
pub fn set_info(bits: u32) {
    INFO.store(bits, Ordering::Relaxed);
}

/// Whether any of `bits` is on.
pub fn enabled(bits: u32) -> bool {
    INFO.load(Ordering::Relaxed) & bits != 0
}

/// Sets the device named in info lines of this thread.
pub fn set_device(d: i64) {
    DEVICE.with(|c| c.set(d));
}

fn eprint(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `omptarget message: ...`
pub fn message(text: &str) {
    eprint(&format!("omptarget message: {text}"));
}

/// `omptarget error: ...`
pub fn error(text: &str) {
    eprint(&format!("omptarget error: {text}"));
}

/// `omptarget fatal error N: ...`, then `abort()`, as upstream ends.
pub fn fatal(code: i32, text: &str) -> ! {
    eprint(&format!("omptarget fatal error {code}: {text}"));
    std::process::abort()
}

/// `omptarget device D info: ...` when `bits` are on.
pub fn info_line(bits: u32, text: &str) {
    if enabled(bits) {
        let d = DEVICE.with(Cell::get);
        eprint(&format!("omptarget device {d} info: {text}"));
    }
}

fn name_suffix(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!(", Name={name}")
    }
}

pub fn info_copy_to_device(hst: usize, tgt: u64, size: usize, name: &str) {
    info_line(
        info::DATA_TRANSFER,
        &format!(
            "Copying data from host to device, HstPtr={hst:#018x}, TgtPtr={tgt:#018x}, Size={size}{}",
            name_suffix(name)
        ),
    );
}

pub fn info_copy_to_host(tgt: u64, hst: usize, size: usize, name: &str) {
    info_line(
        info::DATA_TRANSFER,
        &format!(
            "Copying data from device to host, TgtPtr={tgt:#018x}, HstPtr={hst:#018x}, Size={size}{}",
            name_suffix(name)
        ),
    );
}

fn count(c: u64) -> String {
    if c == crate::mapping::INF {
        "INF".into()
    } else {
        c.to_string()
    }
}

pub fn info_mapping_created(e: &Entry) {
    info_line(
        info::MAPPING_CHANGED,
        &format!(
            "Creating new map entry with HstPtrBase={:#018x}, HstPtrBegin={:#018x}, TgtPtrBegin={:#018x}, Size={}, DynRefCount={}, HoldRefCount={}{}",
            e.hst_base,
            e.hst_begin,
            e.tgt_begin,
            e.hst_end - e.hst_begin,
            count(e.dyn_ref),
            count(e.hold_ref),
            name_suffix(&e.name)
        ),
    );
}

pub fn info_mapping_removed(e: &Entry) {
    info_line(
        info::MAPPING_CHANGED,
        &format!(
            "Removing map entry with HstPtrBegin={:#018x}, TgtPtrBegin={:#018x}, Size={}{}",
            e.hst_begin,
            e.tgt_begin,
            e.hst_end - e.hst_begin,
            name_suffix(&e.name)
        ),
    );
}

/// The variable name of a `map_var_info_t` (`";file;name;line;col;;"`), or empty.
pub fn var_name(info: *const std::ffi::c_void) -> String {
    if info.is_null() {
        return String::new();
    }
    // SAFETY: clang passes a NUL-terminated string here.
    let s = unsafe { std::ffi::CStr::from_ptr(info.cast()) }.to_string_lossy();
    s.split(';').nth(2).unwrap_or("").to_string()
}
