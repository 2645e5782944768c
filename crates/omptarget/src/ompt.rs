//! OMPT, the OpenMP tools interface, for the device side: a tool that registers the target
//! callbacks with libomp (`ompt_set_callback`) hears of device initialisation, image loads,
//! target constructs, their data operations and kernel submissions.
//!
//! How the two libraries find each other: upstream's libomptarget `dlopen`s "libomp.so" and
//! calls its `ompt_libomp_connect`; a libomp loaded from another directory than the program's
//! is a second, tool-less copy, which is why Debian's library fails
//! `ompt/veccopy_no_device_init.c` when it is not next to the program's libomp. This library
//! asks the process for the `ompt_libomp_connect` it already has (`dlsym(RTLD_DEFAULT)`), so
//! it always meets the libomp the program and its tool use. libomp then calls
//! [`initialize`] with its lookup function, through which the tool's callbacks are read.
//!
//! The callbacks are the non-EMI ones (`ompt_callback_target`, `_target_data_op`,
//! `_target_submit`, `_device_initialize`, `_device_finalize`, `_device_load`); `codeptr_ra`
//! is the construct's own address in the program (the region's id for a target region, the
//! source-location record for a data construct), not the return address of the call.

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

type Lookup = unsafe extern "C" fn(*const c_char) -> *mut c_void;
type GetCallback = unsafe extern "C" fn(c_int, *mut *mut c_void) -> c_int;
type GetTaskData = unsafe extern "C" fn() -> *mut c_void;

#[repr(C)]
struct StartToolResult {
    initialize: unsafe extern "C" fn(Lookup, c_int, *mut u64) -> c_int,
    finalize: unsafe extern "C" fn(*mut u64),
    tool_data: u64,
}

// Codes of `ompt_callbacks_t` (omp-tools.h).
const TARGET: c_int = 8;
const TARGET_DATA_OP: c_int = 9;
const TARGET_SUBMIT: c_int = 10;
const DEVICE_INITIALIZE: c_int = 12;
const DEVICE_FINALIZE: c_int = 13;
const DEVICE_LOAD: c_int = 14;

/// `ompt_target_t`.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Target = 1,
    EnterData = 2,
    ExitData = 3,
    Update = 4,
}

/// `ompt_target_data_op_t`.
#[derive(Debug, Clone, Copy)]
pub enum DataOp {
    Alloc = 1,
    ToDevice = 2,
    FromDevice = 3,
    Delete = 4,
}

/// The tool's callbacks (addresses; 0: not registered).
#[derive(Debug, Default)]
struct Callbacks {
    target: usize,
    data_op: usize,
    submit: usize,
    device_initialize: usize,
    device_finalize: usize,
    device_load: usize,
    task_data: usize,
}

static CALLBACKS: OnceLock<Callbacks> = OnceLock::new();
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// The initial device's number (the number of devices).
static HOST_DEVICE: AtomicU64 = AtomicU64::new(0);

/// Records the initial device's number, for the data operations' host side.
pub fn set_host_device(n: usize) {
    HOST_DEVICE.store(n as u64, Ordering::Relaxed);
}

/// The initial device's number.
pub fn host_device() -> i64 {
    HOST_DEVICE.load(Ordering::Relaxed) as i64
}

thread_local! {
    /// The target construct this thread is in (0: none), and its `codeptr_ra`.
    static CURRENT: std::cell::Cell<(u64, usize)> = const { std::cell::Cell::new((0, 0)) };
}

static RESULT: StartToolResult = StartToolResult {
    initialize,
    finalize,
    tool_data: 0,
};

/// Meets the libomp of this process, once (at the runtime's start).
pub fn connect() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
        let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"ompt_libomp_connect".as_ptr()) };
        if f.is_null() {
            return;
        }
        // SAFETY: libomp's `void ompt_libomp_connect(ompt_start_tool_result_t *)`; the result
        // is static, as libomp keeps it to call `finalize` at its end.
        unsafe {
            let connect: unsafe extern "C" fn(*const StartToolResult) = std::mem::transmute(f);
            connect(&RESULT);
        }
    });
}

/// libomp's call once a tool is active: reads the tool's callbacks through `lookup`.
unsafe extern "C" fn initialize(lookup: Lookup, _initial_device: c_int, _data: *mut u64) -> c_int {
    // SAFETY: libomp's lookup function takes NUL-terminated names.
    let get = unsafe { lookup(c"ompt_get_callback".as_ptr()) };
    // SAFETY: as above.
    let task_data = unsafe { lookup(c"ompt_get_task_data".as_ptr()) } as usize;
    let read = |code: c_int| -> usize {
        if get.is_null() {
            return 0;
        }
        let mut cb: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ompt_get_callback(which, &callback)`; it writes the callback when set.
        let set = unsafe { std::mem::transmute::<*mut c_void, GetCallback>(get)(code, &mut cb) };
        if set > 0 { cb as usize } else { 0 }
    };
    let _ = CALLBACKS.set(Callbacks {
        target: read(TARGET),
        data_op: read(TARGET_DATA_OP),
        submit: read(TARGET_SUBMIT),
        device_initialize: read(DEVICE_INITIALIZE),
        device_finalize: read(DEVICE_FINALIZE),
        device_load: read(DEVICE_LOAD),
        task_data,
    });
    0
}

unsafe extern "C" fn finalize(_data: *mut u64) {}

fn callbacks() -> Option<&'static Callbacks> {
    CALLBACKS.get()
}

/// A new id for a construct or an operation.
fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// A lookup for the tracing entry points of a device: this library offers none.
unsafe extern "C" fn device_lookup(_name: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

/// `ompt_callback_device_initialize` for OpenMP device `dev` (of kind `kind`, e.g. "host").
pub fn device_initialize(dev: usize, kind: &std::ffi::CStr) {
    let Some(cb) = callbacks().filter(|c| c.device_initialize != 0) else {
        return;
    };
    type F = unsafe extern "C" fn(c_int, *const c_char, *mut c_void, Lookup, *const c_char);
    // SAFETY: the tool's `ompt_callback_device_initialize_t`.
    unsafe {
        std::mem::transmute::<usize, F>(cb.device_initialize)(
            dev as c_int,
            kind.as_ptr(),
            std::ptr::null_mut(),
            device_lookup,
            std::ptr::null(),
        )
    }
}

/// `ompt_callback_device_finalize`.
pub fn device_finalize(dev: usize) {
    let Some(cb) = callbacks().filter(|c| c.device_finalize != 0) else {
        return;
    };
    // SAFETY: the tool's `ompt_callback_device_finalize_t`.
    unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(c_int)>(cb.device_finalize)(dev as c_int)
    }
}

/// `ompt_callback_device_load`: image `bytes` (in the program's memory) loaded on `dev`.
pub fn device_load(dev: usize, image: &[u8], module: u64) {
    let Some(cb) = callbacks().filter(|c| c.device_load != 0) else {
        return;
    };
    type F = unsafe extern "C" fn(
        c_int,
        *const c_char,
        i64,
        *mut c_void,
        usize,
        *mut c_void,
        *mut c_void,
        u64,
    );
    // SAFETY: the tool's `ompt_callback_device_load_t`; no file backs the image.
    unsafe {
        std::mem::transmute::<usize, F>(cb.device_load)(
            dev as c_int,
            std::ptr::null(),
            0,
            std::ptr::null_mut(),
            image.len(),
            image.as_ptr() as *mut c_void,
            std::ptr::null_mut(),
            module,
        )
    }
}

/// The begin of a construct of `kind` on `dev`; `code` identifies it. Returns what
/// [`target_end`] needs.
pub fn target_begin(kind: Kind, dev: i64, code: usize) -> Option<(Kind, i64, u64, usize)> {
    let cb = callbacks()?;
    let id = next_id();
    CURRENT.with(|c| c.set((id, code)));
    if cb.target != 0 {
        target_call(cb, kind, 1, dev, id, code);
    }
    Some((kind, dev, id, code))
}

/// The end of the construct [`target_begin`] began.
pub fn target_end(begun: Option<(Kind, i64, u64, usize)>) {
    let Some((kind, dev, id, code)) = begun else {
        return;
    };
    CURRENT.with(|c| c.set((0, 0)));
    if let Some(cb) = callbacks().filter(|c| c.target != 0) {
        target_call(cb, kind, 2, dev, id, code);
    }
}

fn target_call(cb: &Callbacks, kind: Kind, endpoint: c_int, dev: i64, id: u64, code: usize) {
    let task = if cb.task_data == 0 {
        std::ptr::null_mut()
    } else {
        // SAFETY: libomp's `ompt_data_t *ompt_get_task_data(void)`.
        unsafe { std::mem::transmute::<usize, GetTaskData>(cb.task_data)() }
    };
    type F = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, u64, *const c_void);
    // SAFETY: the tool's `ompt_callback_target_t`.
    unsafe {
        std::mem::transmute::<usize, F>(cb.target)(
            kind as c_int,
            endpoint,
            dev as c_int,
            task,
            id,
            code as *const c_void,
        )
    }
}

/// `ompt_callback_target_data_op` for an operation of the current construct: from `src` on
/// device `src_dev` to `dst` on `dst_dev` (the host is the initial device, `host`).
pub fn data_op(op: DataOp, (src, src_dev): (usize, i64), (dst, dst_dev): (usize, i64), bytes: u64) {
    let Some(cb) = callbacks().filter(|c| c.data_op != 0) else {
        return;
    };
    let (target, code) = CURRENT.with(|c| c.get());
    type F = unsafe extern "C" fn(
        u64,
        u64,
        c_int,
        *mut c_void,
        c_int,
        *mut c_void,
        c_int,
        usize,
        *const c_void,
    );
    // SAFETY: the tool's `ompt_callback_target_data_op_t`.
    unsafe {
        std::mem::transmute::<usize, F>(cb.data_op)(
            target,
            next_id(),
            op as c_int,
            src as *mut c_void,
            src_dev as c_int,
            dst as *mut c_void,
            dst_dev as c_int,
            bytes as usize,
            code as *const c_void,
        )
    }
}

/// `ompt_callback_target_submit` of the current construct's kernel.
pub fn submit(requested_teams: u32) {
    let Some(cb) = callbacks().filter(|c| c.submit != 0) else {
        return;
    };
    let (target, _) = CURRENT.with(|c| c.get());
    // SAFETY: the tool's `ompt_callback_target_submit_t`.
    unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(u64, u64, u32)>(cb.submit)(
            target,
            next_id(),
            requested_teams,
        )
    }
}
