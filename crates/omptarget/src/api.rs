//! The OpenMP device-memory API (`omp_target_*`, `omp_get_mapped_ptr`, `llvm_omp_target_*`),
//! the device queries, and the corners that are not supported (interop, OMPT) with upstream's
//! answers. Everything is synchronous; the `_async` forms finish before they return.

use crate::abi::{FAIL, SUCCESS};
use crate::mapping::{self, DeviceMemory};
use crate::messages;
use crate::rtl::{self, OmpDevice, lock};
use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

/// libomp's `kmp_depend_info_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct DependInfo {
    base_addr: isize,
    len: usize,
    flags: u8,
}

/// Waits until the dependences of `depobj_list` (`omp_depend_t` objects, each pointing at
/// its `kmp_depend_info_t` entries, the count in the entry before) are satisfied, as a
/// `taskwait depend` would: the `_async` forms then run synchronously in their place, after
/// the tasks they depend on and before any task created after them.
///
/// # Safety
/// `depobj_list` holds `count` depend objects made by `#pragma omp depobj`.
unsafe fn wait_for_depobjs(count: c_int, depobj_list: *mut c_void) {
    if count <= 0 || depobj_list.is_null() {
        return;
    }
    let mut deps: Vec<DependInfo> = Vec::new();
    for i in 0..count as usize {
        // SAFETY: the caller's depend objects: a pointer each, to entries whose count is in
        // the entry before them (libomp's `__kmpc_depobj` layout).
        unsafe {
            let p = *(depobj_list as *const *const DependInfo).add(i);
            if p.is_null() {
                continue;
            }
            let n = (*p.sub(1)).base_addr.clamp(0, 1 << 16) as usize;
            deps.extend_from_slice(std::slice::from_raw_parts(p, n));
        }
    }
    if deps.is_empty() {
        return;
    }
    type Gtid = unsafe extern "C" fn(*const c_void) -> i32;
    type WaitDeps =
        unsafe extern "C" fn(*const c_void, i32, i32, *const DependInfo, i32, *const DependInfo);
    // SAFETY: dlsym of libomp's entry points, with their C signatures.
    unsafe {
        let gtid = libc::dlsym(libc::RTLD_DEFAULT, c"__kmpc_global_thread_num".as_ptr());
        let wait = libc::dlsym(libc::RTLD_DEFAULT, c"__kmpc_omp_wait_deps".as_ptr());
        if gtid.is_null() || wait.is_null() {
            return;
        }
        let gtid = std::mem::transmute::<*mut c_void, Gtid>(gtid)(std::ptr::null());
        std::mem::transmute::<*mut c_void, WaitDeps>(wait)(
            std::ptr::null(),
            gtid,
            deps.len() as i32,
            deps.as_ptr(),
            0,
            std::ptr::null(),
        );
    }
}

fn num_devices() -> c_int {
    rtl::get().map_or(0, |r| r.device_count() as c_int)
}

/// The device for `dev`, or `None` for the initial (host) device; out of range is fatal.
fn device(dev: c_int, what: &str) -> Result<Option<Arc<OmpDevice>>, ()> {
    let n = num_devices();
    if dev == n {
        return Ok(None);
    }
    let Some(rtl) = rtl::get() else {
        return Err(());
    };
    if dev < 0 || dev > n {
        messages::fatal(
            dev,
            &format!("Device number '{dev}' out of range, only {n} devices available"),
        );
    }
    let Some(d) = rtl.device(dev as usize) else {
        return Err(());
    };
    if let Err(e) = rtl.init_device(&d) {
        messages::error(&format!("{what}: device {dev}: {e}"));
        return Err(());
    }
    Ok(Some(d))
}

#[unsafe(no_mangle)]
pub extern "C" fn omp_get_num_devices() -> c_int {
    crate::guard::call("omp_get_num_devices", 0, num_devices)
}

#[unsafe(no_mangle)]
pub extern "C" fn omp_get_initial_device() -> c_int {
    crate::guard::call("omp_get_initial_device", crate::abi::FAIL, num_devices)
}

#[unsafe(no_mangle)]
pub extern "C" fn omp_get_device_num() -> c_int {
    crate::guard::call("omp_get_device_num", crate::abi::FAIL, num_devices)
}

fn alloc(size: usize, dev: c_int, what: &str) -> *mut c_void {
    if size == 0 {
        return std::ptr::null_mut();
    }
    match device(dev, what) {
        // SAFETY: plain malloc for the host device, as upstream.
        Ok(None) => unsafe { libc::malloc(size) },
        Ok(Some(d)) => d
            .alloc(size as u64, 0)
            .map_or(std::ptr::null_mut(), |p| p as *mut c_void),
        Err(()) => std::ptr::null_mut(),
    }
}

fn free(ptr: *mut c_void, dev: c_int, what: &str) {
    if ptr.is_null() {
        return;
    }
    match device(dev, what) {
        // SAFETY: memory `alloc` gave for the host device.
        Ok(None) => unsafe { libc::free(ptr) },
        Ok(Some(d)) => d.free(ptr as u64),
        Err(()) => {}
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn omp_target_alloc(size: usize, dev: c_int) -> *mut c_void {
    crate::guard::call("omp_target_alloc", std::ptr::null_mut(), || {
        alloc(size, dev, "omp_target_alloc")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn llvm_omp_target_alloc_device(size: usize, dev: c_int) -> *mut c_void {
    crate::guard::call("llvm_omp_target_alloc_device", std::ptr::null_mut(), || {
        alloc(size, dev, "llvm_omp_target_alloc_device")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn llvm_omp_target_alloc_host(size: usize, dev: c_int) -> *mut c_void {
    crate::guard::call("llvm_omp_target_alloc_host", std::ptr::null_mut(), || {
        alloc(size, dev, "llvm_omp_target_alloc_host")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn llvm_omp_target_alloc_shared(size: usize, dev: c_int) -> *mut c_void {
    crate::guard::call("llvm_omp_target_alloc_shared", std::ptr::null_mut(), || {
        alloc(size, dev, "llvm_omp_target_alloc_shared")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_free(ptr: *mut c_void, dev: c_int) {
    crate::guard::call("omp_target_free", (), || free(ptr, dev, "omp_target_free"))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn llvm_omp_target_free_device(ptr: *mut c_void, dev: c_int) {
    crate::guard::call("llvm_omp_target_free_device", (), || {
        free(ptr, dev, "llvm_omp_target_free_device")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn llvm_omp_target_free_host(ptr: *mut c_void, dev: c_int) {
    crate::guard::call("llvm_omp_target_free_host", (), || {
        free(ptr, dev, "llvm_omp_target_free_host")
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn llvm_omp_target_free_shared(ptr: *mut c_void, dev: c_int) {
    crate::guard::call("llvm_omp_target_free_shared", (), || {
        free(ptr, dev, "llvm_omp_target_free_shared")
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn llvm_omp_target_dynamic_shared_alloc() -> *mut c_void {
    crate::guard::call(
        "llvm_omp_target_dynamic_shared_alloc",
        std::ptr::null_mut(),
        std::ptr::null_mut,
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn llvm_omp_target_lock_mem(
    ptr: *mut c_void,
    _size: usize,
    _dev: c_int,
) -> *mut c_void {
    crate::guard::call("llvm_omp_target_lock_mem", std::ptr::null_mut(), || ptr)
}

#[unsafe(no_mangle)]
pub extern "C" fn llvm_omp_target_unlock_mem(_ptr: *mut c_void, _dev: c_int) {}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_is_present(ptr: *const c_void, dev: c_int) -> c_int {
    crate::guard::call("omp_target_is_present", 0, || {
        if ptr.is_null() {
            return 0;
        }
        match device(dev, "omp_target_is_present") {
            Ok(None) => 1,
            Ok(Some(d)) => {
                // One byte, as upstream checks (the size of the storage is not known).
                let r = lock(&d.state).table.get_tgt_ptr_begin(
                    ptr as usize,
                    1,
                    false,
                    false,
                    false,
                    false,
                );
                c_int::from(r.is_present)
            }
            Err(()) => 0,
        }
    })
}

/// One synchronous copy between any two devices (the host is the initial device).
fn copy(dst: usize, src: usize, len: usize, dst_dev: c_int, src_dev: c_int) -> c_int {
    if len == 0 {
        return SUCCESS;
    }
    if dst == 0 || src == 0 {
        return FAIL;
    }
    let (Ok(to), Ok(from)) = (
        device(dst_dev, "omp_target_memcpy"),
        device(src_dev, "omp_target_memcpy"),
    ) else {
        return FAIL;
    };
    let ok = match (to, from) {
        (None, None) => {
            // SAFETY: the caller's `len` bytes at each (they may overlap: memmove).
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
            true
        }
        (Some(t), None) => t.submit(dst as u64, src, len as u64),
        (None, Some(f)) => f.retrieve(dst, src as u64, len as u64),
        (Some(t), Some(f)) => {
            let mut staging = vec![0u8; len];
            f.retrieve(staging.as_mut_ptr() as usize, src as u64, len as u64)
                && t.submit(dst as u64, staging.as_ptr() as usize, len as u64)
        }
    };
    if ok { SUCCESS } else { FAIL }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_memcpy(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
    dst_off: usize,
    src_off: usize,
    dst_dev: c_int,
    src_dev: c_int,
) -> c_int {
    crate::guard::call("omp_target_memcpy", crate::abi::FAIL, || {
        if len == 0 {
            return SUCCESS;
        }
        if dst.is_null() || src.is_null() {
            return FAIL;
        }
        copy(
            dst as usize + dst_off,
            src as usize + src_off,
            len,
            dst_dev,
            src_dev,
        )
    })
}

#[expect(clippy::too_many_arguments, reason = "the C ABI's argument lists")]
unsafe fn rect(
    dst: usize,
    src: usize,
    elem: usize,
    dims: usize,
    volume: *const usize,
    dst_offs: *const usize,
    src_offs: *const usize,
    dst_dims: *const usize,
    src_dims: *const usize,
    dst_dev: c_int,
    src_dev: c_int,
) -> c_int {
    // SAFETY: arrays of `dims` entries (caller's contract).
    unsafe {
        if dims == 1 {
            return copy(
                dst + elem * *dst_offs,
                src + elem * *src_offs,
                elem * *volume,
                dst_dev,
                src_dev,
            );
        }
        // The size of one slice of the lower dimensions.
        let mut dst_slice = elem;
        let mut src_slice = elem;
        for i in 1..dims {
            dst_slice *= *dst_dims.add(i);
            src_slice *= *src_dims.add(i);
        }
        for i in 0..*volume {
            let r = rect(
                dst + dst_slice * (*dst_offs + i),
                src + src_slice * (*src_offs + i),
                elem,
                dims - 1,
                volume.add(1),
                dst_offs.add(1),
                src_offs.add(1),
                dst_dims.add(1),
                src_dims.add(1),
                dst_dev,
                src_dev,
            );
            if r != SUCCESS {
                return r;
            }
        }
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_memcpy_rect(
    dst: *mut c_void,
    src: *const c_void,
    elem: usize,
    dims: c_int,
    volume: *const usize,
    dst_offs: *const usize,
    src_offs: *const usize,
    dst_dims: *const usize,
    src_dims: *const usize,
    dst_dev: c_int,
    src_dev: c_int,
) -> c_int {
    crate::guard::call("omp_target_memcpy_rect", crate::abi::FAIL, || {
        if dst.is_null() && src.is_null() {
            return c_int::MAX;
        }
        if dst.is_null()
            || src.is_null()
            || elem == 0
            || dims < 1
            || volume.is_null()
            || dst_offs.is_null()
            || src_offs.is_null()
            || dst_dims.is_null()
            || src_dims.is_null()
        {
            return FAIL;
        }
        // SAFETY: the caller's arrays of `dims` entries.
        unsafe {
            rect(
                dst as usize,
                src as usize,
                elem,
                dims as usize,
                volume,
                dst_offs,
                src_offs,
                dst_dims,
                src_dims,
                dst_dev,
                src_dev,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    len: usize,
    dst_off: usize,
    src_off: usize,
    dst_dev: c_int,
    src_dev: c_int,
    depobj_count: c_int,
    depobj_list: *mut c_void,
) -> c_int {
    crate::guard::call("omp_target_memcpy_async", crate::abi::FAIL, || {
        // SAFETY: forwarded; done before it returns, after what it depends on.
        unsafe {
            wait_for_depobjs(depobj_count, depobj_list);
            omp_target_memcpy(dst, src, len, dst_off, src_off, dst_dev, src_dev)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_memcpy_rect_async(
    dst: *mut c_void,
    src: *const c_void,
    elem: usize,
    dims: c_int,
    volume: *const usize,
    dst_offs: *const usize,
    src_offs: *const usize,
    dst_dims: *const usize,
    src_dims: *const usize,
    dst_dev: c_int,
    src_dev: c_int,
    depobj_count: c_int,
    depobj_list: *mut c_void,
) -> c_int {
    crate::guard::call("omp_target_memcpy_rect_async", crate::abi::FAIL, || {
        // SAFETY: forwarded; done before it returns, after what it depends on.
        unsafe {
            wait_for_depobjs(depobj_count, depobj_list);
            omp_target_memcpy_rect(
                dst, src, elem, dims, volume, dst_offs, src_offs, dst_dims, src_dims, dst_dev,
                src_dev,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_memset(
    ptr: *mut c_void,
    value: c_int,
    len: usize,
    dev: c_int,
) -> *mut c_void {
    // `ptr` whatever happens, as upstream's.
    crate::guard::call("omp_target_memset", ptr, || {
        if ptr.is_null() || len == 0 {
            return ptr;
        }
        match device(dev, "omp_target_memset") {
            // SAFETY: the caller's `len` bytes.
            Ok(None) => unsafe {
                libc::memset(ptr, value, len);
            },
            Ok(Some(d)) => {
                let buf = vec![value as u8; len];
                d.submit(ptr as u64, buf.as_ptr() as usize, len as u64);
            }
            Err(()) => {}
        }
        ptr
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_memset_async(
    ptr: *mut c_void,
    value: c_int,
    len: usize,
    dev: c_int,
    depobj_count: c_int,
    depobj_list: *mut c_void,
) -> *mut c_void {
    crate::guard::call("omp_target_memset_async", ptr, || {
        // SAFETY: forwarded; done before it returns, after what it depends on.
        unsafe {
            wait_for_depobjs(depobj_count, depobj_list);
            omp_target_memset(ptr, value, len, dev)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_associate_ptr(
    host: *const c_void,
    dev_ptr: *const c_void,
    size: usize,
    dev_off: usize,
    dev: c_int,
) -> c_int {
    crate::guard::call("omp_target_associate_ptr", crate::abi::FAIL, || {
        if host.is_null() || dev_ptr.is_null() || size == 0 || dev == num_devices() {
            return FAIL;
        }
        let Ok(Some(d)) = device(dev, "omp_target_associate_ptr") else {
            return FAIL;
        };
        let mut st = lock(&d.state);
        let (h, tgt) = (host as usize, dev_ptr as u64 + dev_off as u64);
        if let Some(e) = st.table.entries.get(&h) {
            // The same association again is fine; another one is not.
            return if e.hst_end == h + size && e.tgt_begin == tgt {
                SUCCESS
            } else {
                messages::error(
                    "Not allowed to re-associate an existing host pointer with a different device pointer.",
                );
                FAIL
            };
        }
        st.table.entries.insert(
            h,
            mapping::Entry {
                hst_base: h,
                hst_begin: h,
                hst_end: h + size,
                tgt_alloc: tgt,
                tgt_begin: tgt,
                dyn_ref: mapping::INF,
                hold_ref: 0,
                name: String::new(),
                decl: "unknown at unknown:0:0".into(),
                shadows: Default::default(),
                owned: false,
                fence: None,
                users: Vec::new(),
            },
        );
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_target_disassociate_ptr(host: *const c_void, dev: c_int) -> c_int {
    crate::guard::call("omp_target_disassociate_ptr", crate::abi::FAIL, || {
        if host.is_null() || dev == num_devices() {
            return FAIL;
        }
        let Ok(Some(d)) = device(dev, "omp_target_disassociate_ptr") else {
            return FAIL;
        };
        let mut st = lock(&d.state);
        let h = host as usize;
        match st.table.entries.get(&h) {
            // The hold count is checked first, whatever the dynamic count (upstream's order).
            Some(e) if e.hold_ref != 0 => {
                messages::error(
                    "Trying to disassociate a pointer with a non-zero hold reference count",
                );
                FAIL
            }
            Some(e) if e.dyn_ref == mapping::INF => {
                st.table.entries.remove(&h);
                SUCCESS
            }
            Some(_) => {
                messages::error(
                    "Trying to disassociate a pointer which was not mapped via omp_target_associate_ptr",
                );
                FAIL
            }
            None => {
                messages::error("Association not found");
                FAIL
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_get_mapped_ptr(ptr: *const c_void, dev: c_int) -> *mut c_void {
    crate::guard::call("omp_get_mapped_ptr", std::ptr::null_mut(), || {
        if ptr.is_null() {
            return std::ptr::null_mut();
        }
        let n = num_devices();
        if dev == n {
            return ptr as *mut c_void;
        }
        if dev > n || dev < 0 {
            return std::ptr::null_mut();
        }
        match device(dev, "omp_get_mapped_ptr") {
            Ok(Some(d)) => {
                let r = lock(&d.state).table.get_tgt_ptr_begin(
                    ptr as usize,
                    1,
                    false,
                    false,
                    false,
                    false,
                );
                match r.tgt {
                    Some(t) if r.is_present => t as *mut c_void,
                    _ => std::ptr::null_mut(),
                }
            }
            _ => std::ptr::null_mut(),
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn ompx_dump_mapping_tables() {
    crate::guard::call("ompx_dump_mapping_tables", (), || {
        let Some(rtl) = rtl::get() else { return };
        rtl.dump_tables("libomptarget:0:0", true, false);
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_print_device_info(dev: i64) -> i32 {
    // Upstream's result is a boolean (0: not printed).
    crate::guard::call("__tgt_print_device_info", 0, || {
        let Some(rtl) = rtl::get() else { return 0 };
        match rtl.device(dev.max(0) as usize) {
            Some(d) => {
                match d.device.info() {
                    Ok(i) => println!("Device {dev}: {} ({})", i.name, i.compute_unit_kind),
                    Err(e) => println!("Device {dev}: {e}"),
                }
                1
            }
            None => 0,
        }
    })
}

// Interop is not supported by the host device (upstream's host plugin refuses it too).

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_interop_init(
    _loc: *mut c_void,
    _gtid: i32,
    interop: *mut *mut c_void,
    _ty: i32,
    _dev: i32,
    _ndeps: i32,
    _deps: *mut c_void,
    _nowait: i32,
) {
    crate::guard::call("__tgt_interop_init", (), || {
        if !interop.is_null() {
            // SAFETY: the caller's slot.
            unsafe { *interop = std::ptr::null_mut() };
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_interop_use(
    _loc: *mut c_void,
    _gtid: i32,
    _interop: *mut c_void,
    _dev: i32,
    _ndeps: i32,
    _deps: *mut c_void,
    _nowait: i32,
) {
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_interop_destroy(
    _loc: *mut c_void,
    _gtid: i32,
    _interop: *mut *mut c_void,
    _dev: i32,
    _ndeps: i32,
    _deps: *mut c_void,
    _nowait: i32,
) {
}

/// `omp_irc_no_value` etc.: every property of a NULL interop object is absent.
const OMP_IRC_EMPTY: c_int = -6;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_get_interop_int(
    _interop: *const c_void,
    _id: c_int,
    err: *mut c_int,
) -> isize {
    crate::guard::call("omp_get_interop_int", 0, || {
        if !err.is_null() {
            // SAFETY: the caller's slot.
            unsafe { *err = OMP_IRC_EMPTY };
        }
        0
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_get_interop_ptr(
    _interop: *const c_void,
    _id: c_int,
    err: *mut c_int,
) -> *mut c_void {
    crate::guard::call("omp_get_interop_ptr", std::ptr::null_mut(), || {
        if !err.is_null() {
            // SAFETY: the caller's slot.
            unsafe { *err = OMP_IRC_EMPTY };
        }
        std::ptr::null_mut()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn omp_get_interop_str(
    _interop: *const c_void,
    _id: c_int,
    err: *mut c_int,
) -> *const c_char {
    crate::guard::call("omp_get_interop_str", std::ptr::null(), || {
        if !err.is_null() {
            // SAFETY: the caller's slot.
            unsafe { *err = OMP_IRC_EMPTY };
        }
        std::ptr::null()
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn omp_get_interop_name(_interop: *const c_void, _id: c_int) -> *const c_char {
    crate::guard::call("omp_get_interop_name", std::ptr::null(), || {
        std::ptr::null()
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn omp_get_interop_type_desc(_interop: *const c_void, _id: c_int) -> *const c_char {
    crate::guard::call("omp_get_interop_type_desc", std::ptr::null(), || {
        std::ptr::null()
    })
}

/// OMPT: no tool is connected yet (the device-side callbacks are future work).
#[unsafe(no_mangle)]
pub extern "C" fn ompt_libomptarget_connect(_result: *mut c_void) {}

// Every export of this file under version node `VERS1.0` (`exports.map` defines the node; rustc
// links a cdylib with an unversioned script of its own). In this file, so that the directives
// are assembled with the definitions they name.
std::arch::global_asm!(
    ".symver __tgt_interop_destroy, __tgt_interop_destroy@@VERS1.0",
    ".symver __tgt_interop_init, __tgt_interop_init@@VERS1.0",
    ".symver __tgt_interop_use, __tgt_interop_use@@VERS1.0",
    ".symver __tgt_print_device_info, __tgt_print_device_info@@VERS1.0",
    ".symver llvm_omp_target_alloc_device, llvm_omp_target_alloc_device@@VERS1.0",
    ".symver llvm_omp_target_alloc_host, llvm_omp_target_alloc_host@@VERS1.0",
    ".symver llvm_omp_target_alloc_shared, llvm_omp_target_alloc_shared@@VERS1.0",
    ".symver llvm_omp_target_dynamic_shared_alloc, llvm_omp_target_dynamic_shared_alloc@@VERS1.0",
    ".symver llvm_omp_target_free_device, llvm_omp_target_free_device@@VERS1.0",
    ".symver llvm_omp_target_free_host, llvm_omp_target_free_host@@VERS1.0",
    ".symver llvm_omp_target_free_shared, llvm_omp_target_free_shared@@VERS1.0",
    ".symver llvm_omp_target_lock_mem, llvm_omp_target_lock_mem@@VERS1.0",
    ".symver llvm_omp_target_unlock_mem, llvm_omp_target_unlock_mem@@VERS1.0",
    ".symver omp_get_device_num, omp_get_device_num@@VERS1.0",
    ".symver omp_get_initial_device, omp_get_initial_device@@VERS1.0",
    ".symver omp_get_interop_int, omp_get_interop_int@@VERS1.0",
    ".symver omp_get_interop_name, omp_get_interop_name@@VERS1.0",
    ".symver omp_get_interop_ptr, omp_get_interop_ptr@@VERS1.0",
    ".symver omp_get_interop_str, omp_get_interop_str@@VERS1.0",
    ".symver omp_get_interop_type_desc, omp_get_interop_type_desc@@VERS1.0",
    ".symver omp_get_mapped_ptr, omp_get_mapped_ptr@@VERS1.0",
    ".symver omp_get_num_devices, omp_get_num_devices@@VERS1.0",
    ".symver omp_target_alloc, omp_target_alloc@@VERS1.0",
    ".symver omp_target_associate_ptr, omp_target_associate_ptr@@VERS1.0",
    ".symver omp_target_disassociate_ptr, omp_target_disassociate_ptr@@VERS1.0",
    ".symver omp_target_free, omp_target_free@@VERS1.0",
    ".symver omp_target_is_present, omp_target_is_present@@VERS1.0",
    ".symver omp_target_memcpy, omp_target_memcpy@@VERS1.0",
    ".symver omp_target_memcpy_async, omp_target_memcpy_async@@VERS1.0",
    ".symver omp_target_memcpy_rect, omp_target_memcpy_rect@@VERS1.0",
    ".symver omp_target_memcpy_rect_async, omp_target_memcpy_rect_async@@VERS1.0",
    ".symver omp_target_memset, omp_target_memset@@VERS1.0",
    ".symver omp_target_memset_async, omp_target_memset_async@@VERS1.0",
    ".symver ompt_libomptarget_connect, ompt_libomptarget_connect@@VERS1.0",
    ".symver ompx_dump_mapping_tables, ompx_dump_mapping_tables@@VERS1.0",
);
