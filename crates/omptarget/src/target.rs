//! The entry points compiled programs call for constructs: registration, target regions
//! (`__tgt_target_kernel` and the legacy forms), data regions (`__tgt_target_data_*`) and
//! mappers; the offload policy (`OMP_TARGET_OFFLOAD`, read from libomp) and the host fallback.

use crate::abi::{self, BinDesc, FAIL, Ident, KernelArgs, NonContig, SUCCESS, map};
use crate::mapping::{self, MapArg};
use crate::messages;
use crate::nowait;
use crate::ompt;
use crate::rtl::{self, OmpDevice, Rtl, lock};
use offload::KernelArg;
use std::ffi::{CStr, c_void};
use std::sync::{Arc, OnceLock};

/// `OMP_TARGET_OFFLOAD` as libomp parsed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Disabled,
    Mandatory,
}

fn libomp_symbol(name: &CStr) -> *mut c_void {
    // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name.
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }
}

/// The policy, computed once: DEFAULT becomes MANDATORY when any device exists.
pub fn policy(rtl: &Rtl) -> Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    *POLICY.get_or_init(|| {
        let f = libomp_symbol(c"__kmpc_get_target_offload");
        let raw = if f.is_null() {
            // Without libomp's parse (a libomp older than LLVM 13): the variable as it says.
            match offload_core::env::raw(&["OMP_TARGET_OFFLOAD"])
                .ok()
                .flatten()
                .map(|(_, v)| v.trim().to_ascii_lowercase())
                .unwrap_or_default()
                .as_str()
            {
                "disabled" => 0,
                "mandatory" => 2,
                _ => 1,
            }
        } else {
            // SAFETY: libomp's `int __kmpc_get_target_offload(void)`.
            unsafe { std::mem::transmute::<*mut c_void, extern "C" fn() -> i32>(f)() }
        };
        match raw {
            0 => Policy::Disabled,
            2 => Policy::Mandatory,
            _ if rtl.device_count() == 0 => Policy::Disabled,
            _ => Policy::Mandatory,
        }
    })
}

/// `omp_get_default_device()` of libomp (0 without libomp). The function is looked up once.
fn default_device() -> i64 {
    static F: OnceLock<usize> = OnceLock::new();
    let f = *F.get_or_init(|| libomp_symbol(c"omp_get_default_device") as usize);
    if f == 0 {
        return 0;
    }
    // SAFETY: libomp's `int omp_get_default_device(void)`.
    i64::from(unsafe { std::mem::transmute::<usize, extern "C" fn() -> i32>(f)() })
}

/// The `";file;func;line;col;;"` string of a source location.
fn psource(loc: *const Ident) -> Option<String> {
    if loc.is_null() {
        return None;
    }
    // SAFETY: clang's ident_t.
    let p = unsafe { (*loc).psource };
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `printKernelArguments` (`LIBOMPTARGET_INFO` bit 0x1): the construct and its map entries.
fn info_arguments(region: &str, loc: *const Ident, args: &[MapArg]) {
    if !messages::enabled(messages::info::KERNEL_ARGS) {
        return;
    }
    let (file, line, col) = messages::location_parts(psource(loc).as_deref());
    let all = u32::MAX;
    messages::info_line(all, || {
        format!(
            "{region} at {file}:{line}:{col} with {} arguments:",
            args.len()
        )
    });
    for a in args {
        let t = a.ty;
        let kind = if t & map::TO != 0 && t & map::FROM != 0 {
            "tofrom"
        } else if t & map::TO != 0 {
            "to"
        } else if t & map::FROM != 0 {
            "from"
        } else if t & map::PRIVATE != 0 {
            "private"
        } else if t & map::LITERAL != 0 {
            "firstprivate"
        } else if a.size != 0 {
            "alloc"
        } else {
            "use_address"
        };
        let implicit = if t & map::IMPLICIT != 0 {
            "(implicit)"
        } else {
            ""
        };
        messages::info_line(all, || {
            format!(
                "{kind}({})[{}] {implicit}",
                messages::shown(&a.name),
                a.size
            )
        });
    }
}

/// `dumpTargetPointerMappings` of every device (`LIBOMPTARGET_INFO` bit 0x4, or a failure
/// with it set).
fn dump_tables(rtl: &Rtl, loc: *const Ident) {
    let (file, line, col) = messages::location_parts(psource(loc).as_deref());
    rtl.dump_tables(&format!("{file}:{line}:{col}"), false, false);
}

fn source_location(loc: *const Ident) -> Option<String> {
    let s = psource(loc)?;
    let parts: Vec<&str> = s.split(';').collect();
    match parts.as_slice() {
        [_, file, _, line, col, ..] if *file != "unknown" && !file.is_empty() => {
            Some(format!("{file}:{line}:{col}"))
        }
        _ => None,
    }
}

/// `handleTargetOutcome`.
pub fn outcome(rtl: &Rtl, success: bool, loc: *const Ident) {
    match policy(rtl) {
        Policy::Disabled if success => {
            messages::fatal(1, "expected no offloading while offloading is disabled")
        }
        Policy::Mandatory if !success => {
            if messages::enabled(messages::info::DUMP_TABLE) {
                dump_tables(rtl, loc);
            } else {
                messages::error(
                    "Consult https://openmp.llvm.org/design/Runtimes.html for debugging options.",
                );
            }
            if rtl.device_count() == 0 {
                messages::error("No images found compatible with the installed hardware. ");
                let mut why = rtl.refusals();
                why.sort();
                why.dedup();
                for w in why {
                    messages::error(&format!("Not taken: {w}"));
                }
            }
            match source_location(loc) {
                Some(l) => messages::error(&format!("{l}: ")),
                None => messages::error(
                    "Source location information not present. Compile with -g or -gline-tables-only.",
                ),
            }
            messages::fatal(
                1,
                "failure of target construct while offloading is mandatory",
            )
        }
        _ => {}
    }
}

/// `checkDeviceAndCtors`: the device to offload to, or `None` to run on the host.
pub fn check_device(rtl: &Rtl, dev: i64, loc: *const Ident) -> Option<Arc<OmpDevice>> {
    if policy(rtl) == Policy::Disabled {
        return None;
    }
    let dev = if dev == -1 { default_device() } else { dev };
    let n = rtl.device_count() as i64;
    if n == 0 {
        outcome(rtl, false, loc);
        return None;
    }
    if dev == n {
        return None;
    }
    if dev < 0 || dev > n {
        messages::fatal(
            dev as i32,
            &format!("Device number '{dev}' out of range, only {n} devices available"),
        );
    }
    let Some(d) = rtl.device(dev as usize) else {
        outcome(rtl, false, loc);
        return None;
    };
    messages::set_device(dev);
    if let Err(e) = rtl.init_device(&d) {
        messages::error(&format!("Failed to init globals on device {dev}: {e}"));
        outcome(rtl, false, loc);
        return None;
    }
    Some(d)
}

/// A user-defined mapper function, as clang emits it.
type MapperFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, i64, i64, *mut c_void);

/// One component a mapper pushes (upstream's `MapComponentInfoTy`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Component {
    base: *mut c_void,
    begin: *mut c_void,
    size: i64,
    ty: i64,
    name: *mut c_void,
}

/// The mapper handle: laid out as upstream's `MapperComponentsTy` (a libstdc++
/// `std::vector<MapComponentInfoTy>`: begin, end, capacity), because programs may build one
/// themselves and call `__tgt_push_mapper_component` on it (LLVM's `declare_mapper_api.cpp`
/// does). Grown with `realloc`; libstdc++'s `operator delete` frees with `free`.
#[repr(C)]
#[derive(Debug)]
struct Components {
    begin: *mut Component,
    end: *mut Component,
    cap: *mut Component,
}

impl Components {
    fn len(&self) -> usize {
        if self.begin.is_null() {
            0
        } else {
            (self.end as usize - self.begin as usize) / std::mem::size_of::<Component>()
        }
    }

    /// # Safety
    /// `self` is a valid handle (ours, or an empty or grown `std::vector` of components).
    unsafe fn push(&mut self, c: Component) -> bool {
        if self.end == self.cap {
            let len = self.len();
            let cap = (len * 2).max(4);
            // SAFETY: `begin` is null or a malloc'ed block of `len` components.
            let grown =
                unsafe { libc::realloc(self.begin.cast(), cap * std::mem::size_of::<Component>()) }
                    as *mut Component;
            if grown.is_null() {
                return false;
            }
            self.begin = grown;
            // SAFETY: within the new block of `cap` components.
            unsafe {
                self.end = grown.add(len);
                self.cap = grown.add(cap);
            }
        }
        // SAFETY: `end` is below `cap`, inside the block.
        unsafe {
            self.end.write(c);
            self.end = self.end.add(1);
        }
        true
    }
}

fn expand_mapper(a: &MapArg) -> Vec<MapArg> {
    let mut handle = Components {
        begin: std::ptr::null_mut(),
        end: std::ptr::null_mut(),
        cap: std::ptr::null_mut(),
    };
    // SAFETY: `a.mapper` is the compiler's mapper function for this entry; it calls back
    // `__tgt_push_mapper_component` with the handle.
    unsafe {
        let f: MapperFn = std::mem::transmute::<usize, MapperFn>(a.mapper);
        f(
            (&mut handle as *mut Components).cast(),
            a.base as *mut c_void,
            a.begin as *mut c_void,
            a.size,
            a.ty,
            std::ptr::null_mut(),
        );
    }
    let out = (0..handle.len())
        .map(|i| {
            // SAFETY: `len` components were written.
            let c = unsafe { *handle.begin.add(i) };
            let (name, decl) = messages::var(c.name);
            MapArg {
                base: c.base as usize,
                begin: c.begin as usize,
                size: c.size,
                ty: c.ty,
                name,
                decl,
                mapper: 0,
            }
        })
        .collect();
    // SAFETY: our own block (or null).
    unsafe { libc::free(handle.begin.cast()) };
    out
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_mapper_num_components(handle: *mut c_void) -> i64 {
    crate::guard::call("__tgt_mapper_num_components", 0, || {
        if handle.is_null() {
            return 0;
        }
        // SAFETY: a mapper handle (see `Components`).
        unsafe { (*(handle as *mut Components)).len() as i64 }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_push_mapper_component(
    handle: *mut c_void,
    base: *mut c_void,
    begin: *mut c_void,
    size: i64,
    ty: i64,
    name: *mut c_void,
) {
    crate::guard::call("__tgt_push_mapper_component", (), || {
        if handle.is_null() {
            return;
        }
        // SAFETY: a mapper handle (see `Components`).
        let h = unsafe { &mut *(handle as *mut Components) };
        // SAFETY: as above.
        if !unsafe {
            h.push(Component {
                base,
                begin,
                size,
                ty,
                name,
            })
        } {
            messages::error("out of memory collecting a mapper's components");
        }
    })
}

/// The map entries of a construct, copied out of the compiler's arrays.
///
/// # Safety
/// The arrays hold `n` entries each (`names` and `mappers` may be NULL).
unsafe fn map_args(
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *const i64,
    types: *const i64,
    names: *const *mut c_void,
    mappers: *const *mut c_void,
) -> Vec<MapArg> {
    let n = n.max(0) as usize;
    if n > 0 && (bases.is_null() || begins.is_null() || sizes.is_null() || types.is_null()) {
        return Vec::new();
    }
    (0..n)
        .map(|i| {
            // SAFETY: `n` entries each (caller's contract).
            unsafe {
                let (name, decl) = messages::var(if names.is_null() {
                    std::ptr::null()
                } else {
                    *names.add(i)
                });
                MapArg {
                    base: *bases.add(i) as usize,
                    begin: *begins.add(i) as usize,
                    size: *sizes.add(i),
                    ty: *types.add(i),
                    name,
                    decl,
                    mapper: if mappers.is_null() {
                        0
                    } else {
                        *mappers.add(i) as usize
                    },
                }
            }
        })
        .collect()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_register_lib(desc: *mut BinDesc) {
    crate::guard::call("__tgt_register_lib", (), || {
        let rtl = rtl::init();
        // SAFETY: the descriptor clang's registration code built.
        if let Err(e) = unsafe { rtl.register(desc) } {
            messages::error(&e);
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_unregister_lib(desc: *mut BinDesc) {
    crate::guard::call("__tgt_unregister_lib", (), || {
        if let Some(rtl) = rtl::get() {
            if messages::enabled(messages::info::DUMP_TABLE) {
                // As upstream's unregistration does: every device, last first.
                rtl.dump_tables("libomptarget:0:0", false, true);
            }
            rtl.unregister(desc);
        }
        rtl::deinit();
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_rtl_init() {
    crate::guard::call("__tgt_rtl_init", (), || {
        rtl::init();
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_rtl_deinit() {
    crate::guard::call("__tgt_rtl_deinit", (), || {
        rtl::deinit();
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_init_all_rtls() {
    crate::guard::call("__tgt_init_all_rtls", (), || {
        // The plugins are initialised when the runtime is made.
        rtl::init();
        rtl::deinit();
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_register_requires(_flags: i64) {
    crate::guard::call("__tgt_register_requires", (), || {
        messages::error(
            "The __tgt_register_requires function has been removed. Recompile your application.",
        );
    })
}

/// `targetDataBegin` / `End` / `Update` of one data construct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DataOp {
    Begin,
    End,
    Update,
}

/// # Safety
/// The arrays hold `n` entries each.
#[expect(clippy::too_many_arguments, reason = "the C ABI's argument lists")]
unsafe fn data_construct(
    op: DataOp,
    nowait: bool,
    loc: *const Ident,
    dev: i64,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *const i64,
    types: *const i64,
    names: *const *mut c_void,
    mappers: *const *mut c_void,
) {
    let Some(rtl) = rtl::get() else { return };
    let Some(d) = check_device(&rtl, dev, loc) else {
        return;
    };
    // SAFETY: caller's contract.
    let args = unsafe { map_args(n, bases, begins, sizes, types, names, mappers) };
    info_arguments(
        match op {
            DataOp::Begin => "Entering OpenMP data region with being_mapper",
            DataOp::End => "Exiting OpenMP data region with end_mapper",
            DataOp::Update => "Updating data within the OpenMP data region with update_mapper",
        },
        loc,
        &args,
    );
    let _span = tracing::info_span!(target: "offload::memory", "target data",
        "OpenMP target data {op:?} on device {}, {} map entries", d.id, args.len())
    .entered();
    let begun = ompt::target_begin(
        match op {
            DataOp::Begin => ompt::Kind::EnterData,
            DataOp::End => ompt::Kind::ExitData,
            DataOp::Update => ompt::Kind::Update,
        },
        d.id as i64,
        loc as usize,
    );
    let ok = nowait::construct(&d, nowait, |work| {
        let mut st = lock(&d.state);
        match op {
            DataOp::Begin => {
                let mut b: Vec<usize> = args.iter().map(|a| a.base).collect();
                let r =
                    mapping::data_begin(&mut st.table, work, &args, &mut b, false, &expand_mapper);
                if r.is_ok() {
                    for (i, a) in args.iter().enumerate() {
                        if a.ty & map::RETURN_PARAM != 0 {
                            // SAFETY: `n` bases.
                            unsafe { *bases.add(i) = b[i] as *mut c_void };
                        }
                    }
                }
                r.is_ok()
            }
            DataOp::End => {
                mapping::data_end(&mut st.table, work, &args, false, &expand_mapper).is_ok()
            }
            DataOp::Update => update(&mut st.table, work, &args).is_ok(),
        }
    });
    ompt::target_end(begun);
    // A failure is reported by what failed (upstream adds nothing here) and dumps the tables
    // in `outcome`.
    if ok && messages::enabled(messages::info::DUMP_TABLE) {
        dump_tables(&rtl, loc);
    }
    outcome(&rtl, ok, loc);
}

/// `targetDataUpdate`: contiguous pieces, non-contiguous sections dimension by dimension.
fn update(
    table: &mut mapping::Table,
    d: &dyn mapping::DeviceMemory,
    args: &[MapArg],
) -> Result<(), mapping::Failed> {
    for a in args {
        if a.ty & (map::LITERAL | map::PRIVATE) != 0 {
            continue;
        }
        if a.mapper != 0 {
            update(table, d, &expand_mapper(a))?;
            continue;
        }
        if a.ty & map::NON_CONTIG != 0 {
            let dims = a.size.max(0) as usize;
            if dims == 0 || dims > 64 {
                continue;
            }
            // SAFETY: for NON_CONTIG, the begin pointer is an array of `dims` descriptors.
            let nc: Vec<NonContig> =
                unsafe { std::slice::from_raw_parts(a.begin as *const NonContig, dims) }.to_vec();
            // Merge dimensions that are contiguous with the next.
            let mut merged = nc.clone();
            let mut k = merged.len() - 1;
            while k > 0 {
                if merged[k].count * merged[k].stride == merged[k - 1].stride {
                    merged[k - 1].count *= merged[k].count;
                    merged[k - 1].stride = merged[k].stride;
                    merged.remove(k);
                }
                k -= 1;
            }
            let last = merged.len() - 1;
            let size = (merged[last].count * merged[last].stride) as usize;
            let mut pieces = Vec::new();
            fn walk(nc: &[NonContig], d: usize, off: u64, out: &mut Vec<u64>) {
                if d == nc.len() - 1 {
                    out.push(off + nc[d].offset * nc[d].stride);
                    return;
                }
                for j in 0..nc[d].count {
                    walk(nc, d + 1, off + (nc[d].offset + j) * nc[d].stride, out);
                }
            }
            walk(&merged, 0, 0, &mut pieces);
            for off in pieces {
                mapping::update_piece(table, d, a.base + off as usize, size, a.ty)?;
            }
            continue;
        }
        mapping::update_piece(table, d, a.begin, a.size.max(0) as usize, a.ty)?;
    }
    Ok(())
}

// The data entry points: `$nowait` is upstream's `targetData<TaskAsyncInfoWrapperTy>` (queued on
// a GPU when the running task can be re-enqueued; libomp orders the dependences, so the
// `_nowait` forms' dependence lists are not read). The legacy forms (no location, names or
// mappers) are blocking, as upstream's forward them to the blocking mapper forms.
macro_rules! data_entry {
    ($name:ident, $op:expr, $nowait:expr $(, $extra:ident: $ty:ty)*) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            loc: *mut Ident,
            dev: i64,
            n: i32,
            bases: *mut *mut c_void,
            begins: *mut *mut c_void,
            sizes: *mut i64,
            types: *mut i64,
            names: *mut *mut c_void,
            mappers: *mut *mut c_void,
            $($extra: $ty,)*
        ) {
            crate::guard::construct(stringify!($name), loc, (), || {
                // SAFETY: the compiler's arrays of `n` entries.
                unsafe {
                    data_construct(
                        $op, $nowait, loc, dev, n, bases, begins, sizes, types, names, mappers,
                    )
                }
            })
        }
    };
}

macro_rules! data_entry_legacy {
    ($name:ident, $op:expr $(, $extra:ident: $ty:ty)*) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(
            dev: i64,
            n: i32,
            bases: *mut *mut c_void,
            begins: *mut *mut c_void,
            sizes: *mut i64,
            types: *mut i64,
            $($extra: $ty,)*
        ) {
            crate::guard::construct(stringify!($name), std::ptr::null(), (), || {
                // SAFETY: the compiler's arrays of `n` entries.
                unsafe {
                    data_construct(
                        $op,
                        false,
                        std::ptr::null(),
                        dev,
                        n,
                        bases,
                        begins,
                        sizes,
                        types,
                        std::ptr::null(),
                        std::ptr::null(),
                    )
                }
            })
        }
    };
}

data_entry!(__tgt_target_data_begin_mapper, DataOp::Begin, false);
data_entry!(__tgt_target_data_end_mapper, DataOp::End, false);
data_entry!(__tgt_target_data_update_mapper, DataOp::Update, false);
data_entry!(__tgt_target_data_begin_nowait_mapper, DataOp::Begin, true,
    _dep_num: i32, _deps: *mut c_void, _noalias_num: i32, _noalias: *mut c_void);
data_entry!(__tgt_target_data_end_nowait_mapper, DataOp::End, true,
    _dep_num: i32, _deps: *mut c_void, _noalias_num: i32, _noalias: *mut c_void);
data_entry!(__tgt_target_data_update_nowait_mapper, DataOp::Update, true,
    _dep_num: i32, _deps: *mut c_void, _noalias_num: i32, _noalias: *mut c_void);
data_entry_legacy!(__tgt_target_data_begin, DataOp::Begin);
data_entry_legacy!(__tgt_target_data_end, DataOp::End);
data_entry_legacy!(__tgt_target_data_update, DataOp::Update);
data_entry_legacy!(__tgt_target_data_begin_nowait, DataOp::Begin,
    _dep_num: i32, _deps: *mut c_void, _noalias_num: i32, _noalias: *mut c_void);
data_entry_legacy!(__tgt_target_data_end_nowait, DataOp::End,
    _dep_num: i32, _deps: *mut c_void, _noalias_num: i32, _noalias: *mut c_void);
data_entry_legacy!(__tgt_target_data_update_nowait, DataOp::Update,
    _dep_num: i32, _deps: *mut c_void, _noalias_num: i32, _noalias: *mut c_void);

/// A target region: map, launch, unmap. `Err` when the region could not be offloaded.
fn run_region(
    rtl: &Rtl,
    work: &nowait::Work,
    host_ptr: usize,
    request: &rtl::LaunchRequest,
    args: &[MapArg],
    bases: &mut [usize],
) -> Result<(), ()> {
    use mapping::DeviceMemory;
    let d = &*work.dev;
    {
        let mut st = lock(&d.state);
        if mapping::data_begin(&mut st.table, work, args, bases, false, &expand_mapper).is_err() {
            drop(st);
            messages::error("Call to targetDataBegin failed, abort target.");
            messages::error("Failed to process data before launching the kernel.");
            return Err(());
        }
    }
    // The kernel's arguments (TARGET_PARAM entries), and private copies.
    let mut values = Vec::new();
    // The kernel argument each entry became (for the lambda pattern below).
    let mut value_of: Vec<Option<u64>> = vec![None; args.len()];
    let mut privates = Vec::new();
    let mut failed = false;
    {
        let mut st = lock(&d.state);
        for (i, a) in args.iter().enumerate() {
            if a.ty & map::TARGET_PARAM == 0 {
                continue;
            }
            // Every argument is a pointer-sized value, as upstream passes them: a device pointer
            // computed with an offset may lie outside any allocation (and, under USM, is a host
            // address), so none is handed over as a checked `Ptr`.
            if a.ty & map::LITERAL != 0 {
                value_of[i] = Some(bases[i] as u64);
                values.push(KernelArg::Word(bases[i] as u64));
                continue;
            }
            let size = a.size.max(0) as usize;
            if a.ty & map::PRIVATE != 0 {
                let offset = a.base.wrapping_sub(a.begin) as u64;
                let tgt = if size == 0 {
                    0
                } else {
                    match work.alloc(size as u64, a.begin) {
                        Some(p) => {
                            privates.push(p);
                            if a.ty & map::TO != 0 {
                                messages::info_copy_to_device(a.begin, p, size, "");
                                if !work.submit(p, a.begin, size as u64) {
                                    failed = true;
                                }
                            }
                            p
                        }
                        None => {
                            failed = true;
                            0
                        }
                    }
                };
                value_of[i] = Some(tgt.wrapping_add(offset));
                values.push(KernelArg::Word(tgt.wrapping_add(offset)));
                continue;
            }
            let mut base = bases[i];
            if a.ty & map::PTR_AND_OBJ != 0 {
                // SAFETY: a PTR_AND_OBJ base is the address of a host pointer.
                base = unsafe { *(base as *const usize) };
            }
            let tgt = st
                .table
                .get_tgt_ptr_begin(a.begin, size, false, false, false, false)
                .tgt
                .unwrap_or(a.begin as u64);
            let v = tgt.wrapping_add(base.wrapping_sub(a.begin) as u64);
            value_of[i] = Some(v);
            values.push(KernelArg::Word(v));
        }
        // Pointers captured by a lambda (PTR_AND_OBJ | LITERAL | IMPLICIT members of the lambda,
        // not kernel arguments themselves): the lambda's device copy gets the device address of
        // each pointee that is mapped (reference §3.8 step 3).
        const LAMBDA: i64 = map::PTR_AND_OBJ | map::LITERAL | map::IMPLICIT;
        for a in args {
            if a.ty & LAMBDA != LAMBDA || a.ty & map::TARGET_PARAM != 0 {
                continue;
            }
            let Some(parent) = map::member_of(a.ty) else {
                continue;
            };
            let (Some(Some(tgt_base)), Some(p)) = (value_of.get(parent), args.get(parent)) else {
                continue;
            };
            let loc = tgt_base.wrapping_add(a.base.wrapping_sub(p.begin) as u64);
            let r = st.table.get_tgt_ptr_begin(
                a.begin,
                a.size.max(0) as usize,
                false,
                false,
                false,
                false,
            );
            if r.is_present && !work.submit_value(loc, r.tgt.expect("present")) {
                failed = true;
            }
        }
    }
    let launched = if failed {
        Err("a private argument could not be allocated or copied".to_string())
    } else {
        ompt::submit(request.num_teams);
        rtl.launch(work, host_ptr, &values, request)
    };
    for p in privates {
        work.free(p);
    }
    if let Err(e) = launched {
        messages::error(&e);
        messages::error("Executing target region abort target.");
        return Err(());
    }
    let mut st = lock(&d.state);
    if mapping::data_end(&mut st.table, work, args, false, &expand_mapper).is_err() {
        drop(st);
        messages::error("Call to targetDataEnd failed, abort target.");
        messages::error("Failed to process data after launching the kernel.");
        return Err(());
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_kernel(
    loc: *mut Ident,
    dev: i64,
    num_teams: i32,
    thread_limit: i32,
    host_ptr: *mut c_void,
    args: *mut KernelArgs,
) -> i32 {
    crate::guard::construct("__tgt_target_kernel", loc, crate::abi::FAIL, || {
        let Some(rtl) = rtl::get() else { return FAIL };
        let Some(d) = check_device(&rtl, dev, loc) else {
            return FAIL;
        };
        if args.is_null() {
            messages::error("__tgt_target_kernel: the kernel arguments are NULL");
            outcome(&rtl, false, loc);
            return FAIL;
        }
        // SAFETY: clang's KernelArgsTy; every version starts with these fields.
        let ka = unsafe { &*args };
        // SAFETY: the arrays of `num_args` entries.
        let margs = unsafe {
            map_args(
                ka.num_args as i32,
                ka.arg_base_ptrs,
                ka.arg_ptrs,
                ka.arg_sizes,
                ka.arg_types,
                ka.arg_names,
                ka.arg_mappers,
            )
        };
        info_arguments("Entering OpenMP kernel", loc, &margs);
        let _span = tracing::info_span!(target: "offload::launch", "target region",
            "OpenMP target region {:#x} on device {}, {} map entries", host_ptr as usize, d.id,
            margs.len())
        .entered();
        let begun = ompt::target_begin(ompt::Kind::Target, d.id as i64, host_ptr as usize);
        let mut bases: Vec<usize> = margs.iter().map(|a| a.base).collect();
        // Upstream's `targetKernel`: a construct without `teams` (-1) runs one team; then
        // `upgradeKernelArgs`: before version 3 the teams and threads are the call's.
        let (num_teams, teams_of_args) = if num_teams == -1 {
            (1, 1)
        } else {
            (num_teams, ka.num_teams[0])
        };
        let request = if ka.version < 3 {
            rtl::LaunchRequest {
                version: ka.version,
                num_teams: num_teams.max(0) as u32,
                thread_limit: thread_limit.max(0) as u32,
                tripcount: ka.tripcount,
                dyn_cgroup_mem: 0,
            }
        } else {
            rtl::LaunchRequest {
                version: ka.version,
                num_teams: teams_of_args,
                thread_limit: ka.thread_limit[0],
                tripcount: ka.tripcount,
                dyn_cgroup_mem: ka.dyn_cgroup_mem,
            }
        };
        // Upstream's `targetKernel<TaskAsyncInfoWrapperTy>` for a `nowait` construct.
        let nowait = ka.version >= 2 && ka.flags & abi::KERNEL_FLAG_NOWAIT != 0;
        let ok = nowait::construct(&d, nowait, |work| {
            run_region(&rtl, work, host_ptr as usize, &request, &margs, &mut bases).is_ok()
        });
        ompt::target_end(begun);
        if ok && messages::enabled(messages::info::DUMP_TABLE) {
            dump_tables(&rtl, loc);
        }
        outcome(&rtl, ok, loc);
        if ok { SUCCESS } else { FAIL }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_kernel_nowait(
    loc: *mut Ident,
    dev: i64,
    num_teams: i32,
    thread_limit: i32,
    host_ptr: *mut c_void,
    args: *mut KernelArgs,
    _dep_num: i32,
    _deps: *mut c_void,
    _noalias_num: i32,
    _noalias: *mut c_void,
) -> i32 {
    crate::guard::call("__tgt_target_kernel_nowait", crate::abi::FAIL, || {
        // SAFETY: as `__tgt_target_kernel`.
        unsafe { __tgt_target_kernel(loc, dev, num_teams, thread_limit, host_ptr, args) }
    })
}

/// The legacy entry points build a version-1 argument block.
#[expect(clippy::too_many_arguments, reason = "the C ABI's argument lists")]
unsafe fn legacy(
    loc: *mut Ident,
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    names: *mut *mut c_void,
    mappers: *mut *mut c_void,
    teams: i32,
    threads: i32,
) -> i32 {
    let mut ka = KernelArgs {
        version: 1,
        num_args: n.max(0) as u32,
        arg_base_ptrs: bases,
        arg_ptrs: begins,
        arg_sizes: sizes,
        arg_types: types,
        arg_names: names,
        arg_mappers: mappers,
        tripcount: 0,
        flags: 0,
        num_teams: [teams.max(0) as u32, 0, 0],
        thread_limit: [threads.max(0) as u32, 0, 0],
        dyn_cgroup_mem: 0,
    };
    // SAFETY: the caller's arrays, in a block of ours.
    unsafe { __tgt_target_kernel(loc, dev, teams, threads, host_ptr, &mut ka) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target(
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
) -> i32 {
    crate::guard::call("__tgt_target", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe {
            legacy(
                std::ptr::null_mut(),
                dev,
                host_ptr,
                n,
                bases,
                begins,
                sizes,
                types,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                -1,
                -1,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_nowait(
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    _dep_num: i32,
    _deps: *mut c_void,
    _noalias_num: i32,
    _noalias: *mut c_void,
) -> i32 {
    crate::guard::call("__tgt_target_nowait", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe { __tgt_target(dev, host_ptr, n, bases, begins, sizes, types) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_mapper(
    loc: *mut Ident,
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    names: *mut *mut c_void,
    mappers: *mut *mut c_void,
) -> i32 {
    crate::guard::call("__tgt_target_mapper", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe {
            legacy(
                loc, dev, host_ptr, n, bases, begins, sizes, types, names, mappers, -1, -1,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_nowait_mapper(
    loc: *mut Ident,
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    names: *mut *mut c_void,
    mappers: *mut *mut c_void,
    _dep_num: i32,
    _deps: *mut c_void,
    _noalias_num: i32,
    _noalias: *mut c_void,
) -> i32 {
    crate::guard::call("__tgt_target_nowait_mapper", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe {
            legacy(
                loc, dev, host_ptr, n, bases, begins, sizes, types, names, mappers, -1, -1,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_teams(
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    teams: i32,
    threads: i32,
) -> i32 {
    crate::guard::call("__tgt_target_teams", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe {
            legacy(
                std::ptr::null_mut(),
                dev,
                host_ptr,
                n,
                bases,
                begins,
                sizes,
                types,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                teams,
                threads,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_teams_nowait(
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    teams: i32,
    threads: i32,
    _dep_num: i32,
    _deps: *mut c_void,
    _noalias_num: i32,
    _noalias: *mut c_void,
) -> i32 {
    crate::guard::call("__tgt_target_teams_nowait", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe {
            __tgt_target_teams(
                dev, host_ptr, n, bases, begins, sizes, types, teams, threads,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_teams_mapper(
    loc: *mut Ident,
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    names: *mut *mut c_void,
    mappers: *mut *mut c_void,
    teams: i32,
    threads: i32,
) -> i32 {
    crate::guard::call("__tgt_target_teams_mapper", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe {
            legacy(
                loc, dev, host_ptr, n, bases, begins, sizes, types, names, mappers, teams, threads,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_teams_nowait_mapper(
    loc: *mut Ident,
    dev: i64,
    host_ptr: *mut c_void,
    n: i32,
    bases: *mut *mut c_void,
    begins: *mut *mut c_void,
    sizes: *mut i64,
    types: *mut i64,
    names: *mut *mut c_void,
    mappers: *mut *mut c_void,
    teams: i32,
    threads: i32,
    _dep_num: i32,
    _deps: *mut c_void,
    _noalias_num: i32,
    _noalias: *mut c_void,
) -> i32 {
    crate::guard::call("__tgt_target_teams_nowait_mapper", crate::abi::FAIL, || {
        // SAFETY: forwarded.
        unsafe {
            legacy(
                loc, dev, host_ptr, n, bases, begins, sizes, types, names, mappers, teams, threads,
            )
        }
    })
}

/// libomp's poll of a `nowait` construct's task ([`nowait::query`]): the slot is cleared once
/// the queued work is done. Failed queued work is upstream's fatal error; a handle that is not
/// ours is an error and the slot is cleared.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __tgt_target_nowait_query(handle: *mut *mut c_void) -> i32 {
    crate::guard::call("__tgt_target_nowait_query", crate::abi::FAIL, || {
        // SAFETY: libomp's slot of the running task.
        match unsafe { nowait::query(handle) } {
            Ok(()) => SUCCESS,
            // Not a handle of ours: said, and the task goes on (its slot is clear).
            Err(nowait::QueryError::Foreign(e)) => {
                messages::error(&e);
                FAIL
            }
            // The construct returned long ago: no host fallback is left, as upstream's.
            Err(nowait::QueryError::Failed(e)) => {
                messages::error(&e);
                messages::fatal(1, "Error while querying the async queue for completion.")
            }
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn __kmpc_push_target_tripcount(_dev: i64, _n: u64) {}

#[unsafe(no_mangle)]
pub extern "C" fn __kmpc_push_target_tripcount_mapper(_loc: *mut Ident, _dev: i64, _n: u64) {}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_set_info_flag(bits: u32) {
    crate::guard::call("__tgt_set_info_flag", (), || {
        messages::set_info(bits);
    })
}

/// Record-replay is not supported: upstream's failure code.
#[unsafe(no_mangle)]
pub extern "C" fn __tgt_activate_record_replay(
    _dev: i64,
    _size: u64,
    _vaddr: *mut c_void,
    _record: bool,
    _save: bool,
    _offset: *mut u64,
) -> i64 {
    crate::guard::call(
        "__tgt_activate_record_replay",
        crate::abi::FAIL as i64,
        || FAIL as i64,
    )
}

#[unsafe(no_mangle)]
pub extern "C" fn __tgt_target_kernel_replay(
    _loc: *mut Ident,
    _dev: i64,
    _host_ptr: *mut c_void,
    _mem: *mut c_void,
    _size: i64,
    _args: *mut *mut c_void,
    _offsets: *mut i64,
    _n: i32,
    _teams: i32,
    _threads: i32,
    _loop_tripcount: u64,
) -> i32 {
    crate::guard::call("__tgt_target_kernel_replay", crate::abi::FAIL, || FAIL)
}

// Every export of this file under version node `VERS1.0` (`exports.map` defines the node; rustc
// links a cdylib with an unversioned script of its own). In this file, so that the directives
// are assembled with the definitions they name.
std::arch::global_asm!(
    ".symver __kmpc_push_target_tripcount, __kmpc_push_target_tripcount@@VERS1.0",
    ".symver __kmpc_push_target_tripcount_mapper, __kmpc_push_target_tripcount_mapper@@VERS1.0",
    ".symver __tgt_activate_record_replay, __tgt_activate_record_replay@@VERS1.0",
    ".symver __tgt_init_all_rtls, __tgt_init_all_rtls@@VERS1.0",
    ".symver __tgt_mapper_num_components, __tgt_mapper_num_components@@VERS1.0",
    ".symver __tgt_push_mapper_component, __tgt_push_mapper_component@@VERS1.0",
    ".symver __tgt_register_lib, __tgt_register_lib@@VERS1.0",
    ".symver __tgt_register_requires, __tgt_register_requires@@VERS1.0",
    ".symver __tgt_rtl_deinit, __tgt_rtl_deinit@@VERS1.0",
    ".symver __tgt_rtl_init, __tgt_rtl_init@@VERS1.0",
    ".symver __tgt_set_info_flag, __tgt_set_info_flag@@VERS1.0",
    ".symver __tgt_target, __tgt_target@@VERS1.0",
    ".symver __tgt_target_data_begin, __tgt_target_data_begin@@VERS1.0",
    ".symver __tgt_target_data_begin_mapper, __tgt_target_data_begin_mapper@@VERS1.0",
    ".symver __tgt_target_data_begin_nowait, __tgt_target_data_begin_nowait@@VERS1.0",
    ".symver __tgt_target_data_begin_nowait_mapper, __tgt_target_data_begin_nowait_mapper@@VERS1.0",
    ".symver __tgt_target_data_end, __tgt_target_data_end@@VERS1.0",
    ".symver __tgt_target_data_end_mapper, __tgt_target_data_end_mapper@@VERS1.0",
    ".symver __tgt_target_data_end_nowait, __tgt_target_data_end_nowait@@VERS1.0",
    ".symver __tgt_target_data_end_nowait_mapper, __tgt_target_data_end_nowait_mapper@@VERS1.0",
    ".symver __tgt_target_data_update, __tgt_target_data_update@@VERS1.0",
    ".symver __tgt_target_data_update_mapper, __tgt_target_data_update_mapper@@VERS1.0",
    ".symver __tgt_target_data_update_nowait, __tgt_target_data_update_nowait@@VERS1.0",
    ".symver __tgt_target_data_update_nowait_mapper, __tgt_target_data_update_nowait_mapper@@VERS1.0",
    ".symver __tgt_target_kernel, __tgt_target_kernel@@VERS1.0",
    ".symver __tgt_target_kernel_nowait, __tgt_target_kernel_nowait@@VERS1.0",
    ".symver __tgt_target_kernel_replay, __tgt_target_kernel_replay@@VERS1.0",
    ".symver __tgt_target_mapper, __tgt_target_mapper@@VERS1.0",
    ".symver __tgt_target_nowait, __tgt_target_nowait@@VERS1.0",
    ".symver __tgt_target_nowait_mapper, __tgt_target_nowait_mapper@@VERS1.0",
    ".symver __tgt_target_nowait_query, __tgt_target_nowait_query@@VERS1.0",
    ".symver __tgt_target_teams, __tgt_target_teams@@VERS1.0",
    ".symver __tgt_target_teams_mapper, __tgt_target_teams_mapper@@VERS1.0",
    ".symver __tgt_target_teams_nowait, __tgt_target_teams_nowait@@VERS1.0",
    ".symver __tgt_target_teams_nowait_mapper, __tgt_target_teams_nowait_mapper@@VERS1.0",
    ".symver __tgt_unregister_lib, __tgt_unregister_lib@@VERS1.0",
);
