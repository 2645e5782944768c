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
    pub const KERNEL_ARGS: u32 = 0x1;
    pub const MAPPING_EXISTS: u32 = 0x2;
    pub const DUMP_TABLE: u32 = 0x4;
    pub const MAPPING_CHANGED: u32 = 0x8;
    pub const PLUGIN_KERNEL: u32 = 0x10;
    pub const DATA_TRANSFER: u32 = 0x20;
    pub const EMPTY_MAPPING: u32 = 0x40;
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
/// An info line, if `bits` are enabled (`text` is only made then: the constructs' fast path
/// formats nothing).
pub fn info_line(bits: u32, text: impl FnOnce() -> String) {
    if enabled(bits) {
        let d = DEVICE.with(Cell::get);
        eprint(&format!("omptarget device {d} info: {}", text()));
    }
}

/// The plugin's info line (`"PluginInterface" device D info: ...`, quotes included, as
/// upstream's plugins print it).
pub fn plugin_info_line(bits: u32, text: impl FnOnce() -> String) {
    if enabled(bits) {
        let d = DEVICE.with(Cell::get);
        eprint(&format!("\"PluginInterface\" device {d} info: {}", text()));
    }
}

/// `dumpTargetPointerMappings` of device `dev`'s `table`, after the construct at `at`
/// (`file:line:col`), to standard error (info lines) or standard output
/// (`ompx_dump_mapping_tables`).
pub fn dump_table(dev: usize, at: &str, table: &crate::mapping::Table, to_stdout: bool) {
    let line = |text: &str| {
        let text = format!("omptarget device {dev} info: {text}");
        if to_stdout {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{text}");
            let _ = out.flush();
        } else {
            eprint(&text);
        }
    };
    if table.entries.is_empty() {
        line("OpenMP Host-Device pointer mappings table empty");
        return;
    }
    line(&format!(
        "OpenMP Host-Device pointer mappings after block at {at}:"
    ));
    line(&format!(
        "{:<18} {:<18} {} {} {} {}",
        "Host Ptr", "Target Ptr", "Size (B)", "DynRefCount", "HoldRefCount", "Declaration"
    ));
    for e in table.entries.values() {
        line(&format!(
            "{:#018x} {:#018x} {:<8} {:<11} {:<12} {}",
            e.hst_begin,
            e.tgt_begin,
            e.hst_end - e.hst_begin,
            count(e.dyn_ref),
            count(e.hold_ref),
            e.decl
        ));
    }
}

/// A variable's name in info lines (upstream's `getNameFromMapping`: `unknown` without one).
pub fn shown(name: &str) -> &str {
    if name.is_empty() { "unknown" } else { name }
}

pub fn info_copy_to_device(hst: usize, tgt: u64, size: usize, name: &str) {
    info_line(info::DATA_TRANSFER, || {
        format!(
            "Copying data from host to device, HstPtr={hst:#018x}, TgtPtr={tgt:#018x}, Size={size}, Name={}",
            shown(name)
        )
    });
}

pub fn info_copy_to_host(tgt: u64, hst: usize, size: usize, name: &str) {
    info_line(info::DATA_TRANSFER, || {
        format!(
            "Copying data from device to host, TgtPtr={tgt:#018x}, HstPtr={hst:#018x}, Size={size}, Name={}",
            shown(name)
        )
    });
}

/// A reference count as upstream prints it.
pub fn count(c: u64) -> String {
    if c == crate::mapping::INF {
        "INF".into()
    } else {
        c.to_string()
    }
}

pub fn info_mapping_created(e: &Entry) {
    info_line(info::MAPPING_CHANGED, || {
        format!(
            "Creating new map entry with HstPtrBase={:#018x}, HstPtrBegin={:#018x}, TgtAllocBegin={:#018x}, TgtPtrBegin={:#018x}, Size={}, DynRefCount={}, HoldRefCount={}, Name={}",
            e.hst_base,
            e.hst_begin,
            e.tgt_alloc,
            e.tgt_begin,
            e.hst_end - e.hst_begin,
            count(e.dyn_ref),
            count(e.hold_ref),
            shown(&e.name)
        )
    });
}

/// `Mapping exists ...` for `hp` (`size` bytes) found in `e`; `action` (` (incremented)`, ...)
/// goes to the hold count if `hold`, else to the dynamic one. `name`: on the way in (the
/// argument's), none on the way out, as upstream prints them.
pub fn info_mapping_exists(
    implicit: bool,
    (hp, tgt, size): (usize, u64, usize),
    e: &Entry,
    (action, hold): (&str, bool),
    name: Option<&str>,
) {
    if !enabled(info::MAPPING_EXISTS) {
        return;
    }
    let (dyn_action, hold_action) = if hold { ("", action) } else { (action, "") };
    info_line(info::MAPPING_EXISTS, || {
        format!(
            "Mapping exists{} with HstPtrBegin={hp:#018x}, TgtPtrBegin={tgt:#018x}, Size={size}, DynRefCount={}{dyn_action}, HoldRefCount={}{hold_action}{}",
            if implicit { " (implicit)" } else { "" },
            count(e.dyn_ref),
            count(e.hold_ref),
            name.map(|n| format!(", Name={}", shown(n)))
                .unwrap_or_default()
        )
    });
}

pub fn info_mapping_removed(e: &Entry, size: usize) {
    info_line(info::MAPPING_CHANGED, || {
        format!(
            "Removing map entry with HstPtrBegin={:#018x}, TgtPtrBegin={:#018x}, Size={size}, Name={}",
            e.hst_begin,
            e.tgt_begin,
            shown(&e.name)
        )
    });
}

/// Where a source location (`ident_t`'s `";file;function;line;col;;"`) points: the file's
/// name without its directories, the line and the column (`unknown`, 0, 0 without one).
pub fn location_parts(psource: Option<&str>) -> (String, String, String) {
    let parts: Vec<&str> = psource.unwrap_or("").split(';').collect();
    match parts.as_slice() {
        [_, file, _, line, col, ..] if !file.is_empty() => {
            (basename(file).to_string(), number(line), number(col))
        }
        _ => ("unknown".into(), "0".into(), "0".into()),
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn number(s: &str) -> String {
    s.trim().parse::<i64>().unwrap_or(0).to_string()
}

/// `name at file:line:col` of a `map_var_info_t` (`";name;file;line;col;;"`); a plain string
/// (a `declare target` variable's entry name) is the name, at `unknown:0:0`.
pub fn var_decl(info: &str) -> String {
    let parts: Vec<&str> = info.split(';').collect();
    match parts.as_slice() {
        [_, name, file, line, col, ..] => format!(
            "{} at {}:{}:{}",
            shown(name),
            basename(file),
            number(line),
            number(col)
        ),
        _ => format!("{} at unknown:0:0", shown(info)),
    }
}

/// The name and declaration ([`var_decl`]) of a `map_var_info_t`; null: no name, `unknown`.
pub fn var(info: *const std::ffi::c_void) -> (String, String) {
    if info.is_null() {
        return (String::new(), "unknown at unknown:0:0".into());
    }
    // SAFETY: clang passes a NUL-terminated string here.
    let s = unsafe { std::ffi::CStr::from_ptr(info.cast()) }.to_string_lossy();
    (s.split(';').nth(1).unwrap_or("").to_string(), var_decl(&s))
}
