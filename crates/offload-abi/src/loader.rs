//! Runtime side of the ABI: opens a plugin library, checks its table, and wraps it in types
//! that implement [`GenericPlugin`] and [`GenericDevice`].
//!
//! Libraries are never unloaded: a `dlclose` of a Rust library with live thread-local
//! destructors is a known crash, and plugin tables hand out static pointers. The runtime keeps
//! its own copy of each table ([`check_table`]): it never holds a reference into the plugin's.

use super::{
    ABI_MAGIC, ABI_MAJOR, ABI_MINOR, AbiDeviceInfo, AbiErrorOut, AbiHeader, AbiJitService,
    AbiKernelArg, AbiLaunchDims, AbiStringOut, ENTRY_SYMBOL, EntryFn, MAX_TABLE_SIZE, PluginTable,
    SYNC_QUEUE, TABLE_SIZE_1_0,
};
use offload_core::error::{Error, Result};
use offload_core::jit::{CompileRequest, JitService};
use offload_core::traits::{GenericDevice, GenericPlugin};
use offload_core::types::{
    DeviceInfo, DeviceLimits, DevicePtr, EventHandle, GlobalSymbol, ImageClaim, KernelArg,
    KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle,
};
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

/// A plugin library loaded through the ABI, usable as `dyn GenericPlugin`.
#[derive(Debug)]
pub struct LoadedPlugin {
    this: Weak<LoadedPlugin>,
    /// The runtime's own copy of the plugin's table (see [`check_table`]).
    table: PluginTable,
    path: PathBuf,
    name: String,
    triple: String,
    build_id: String,
    abi_version: (u16, u16),
}

/// Reads a static C string from a plugin header.
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string that lives forever.
unsafe fn header_str(p: *const std::ffi::c_char, field: &str, path: &Path) -> Result<String> {
    if p.is_null() {
        return Err(Error::AbiMismatch(format!(
            "{}: header field '{field}' is a null pointer",
            path.display()
        )));
    }
    // At most MAX_HEADER_STRING bytes are looked at: a string without its NUL within them is
    // refused rather than read on without end.
    let mut len = 0;
    // SAFETY: non-null and NUL-terminated per the ABI contract; the scan stops at the bound.
    while len < MAX_HEADER_STRING && unsafe { *p.add(len) } != 0 {
        len += 1;
    }
    if len == MAX_HEADER_STRING {
        return Err(Error::AbiMismatch(format!(
            "{}: header field '{field}' has no end within {MAX_HEADER_STRING} bytes",
            path.display()
        )));
    }
    // SAFETY: `len` bytes were just read.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    let s = std::str::from_utf8(bytes).map_err(|_| {
        Error::AbiMismatch(format!(
            "{}: header field '{field}' is not valid UTF-8",
            path.display()
        ))
    })?;
    if s.chars().any(char::is_control) {
        return Err(Error::AbiMismatch(format!(
            "{}: header field '{field}' contains control characters ({})",
            path.display(),
            offload_core::text::printable(s)
        )));
    }
    Ok(s.to_owned())
}

/// Longest header string (name, triple, build id) believed.
const MAX_HEADER_STRING: usize = 1024;
/// Most devices a plugin is believed to have.
pub const MAX_DEVICES: usize = 4096;
/// Longest error message or string a plugin hands back (longer ones are cut).
const MAX_PLUGIN_TEXT: usize = 64 << 10;

/// The name and offset of every entry of the table, for the null checks.
fn entries(t: &PluginTable) -> Vec<(&'static str, usize, bool)> {
    macro_rules! entries {
        ($($field:ident),* $(,)?) => {
            vec![$((
                stringify!($field),
                std::mem::offset_of!(PluginTable, $field),
                t.$field.is_some(),
            )),*]
        };
    }
    entries!(
        init,
        check_image,
        device_check_image,
        device_info,
        load_image,
        unload_image,
        get_kernel,
        get_global,
        alloc,
        free,
        copy_to_device,
        copy_from_device,
        copy_device_to_device,
        launch,
        queue_create,
        queue_synchronize,
        queue_destroy,
        jit_stats,
        set_jit_service,
        image_claims,
        event_create,
        event_record,
        event_wait,
        event_synchronize,
        event_query,
        event_destroy,
        event_elapsed,
        host_access,
    )
}

/// Checks a table returned by a plugin's entry symbol and returns the runtime's own copy:
/// magic, then major version, then table size, in that order, touching nothing beyond what has
/// been checked. Only the `table_size` bytes the plugin declares are read, into a zeroed table
/// (so entries a shorter, older table lacks are null, and no reference to a larger struct than
/// the plugin's is ever formed); then every entry the declared size covers must be non-null.
///
/// # Safety
/// `table` must be null or point to readable memory of at least `size_of::<AbiHeader>()`
/// bytes, and, once the header checks out, of `table_size` bytes.
pub unsafe fn check_table(table: *const PluginTable, path: &Path) -> Result<PluginTable> {
    let shown = path.display();
    if table.is_null() {
        return Err(Error::PluginLoad(format!(
            "{shown}: entry point '{ENTRY_SYMBOL}' returned null (its constructor panicked or failed)"
        )));
    }
    // SAFETY: non-null; the magic is the first 8 bytes of every table.
    let magic = unsafe { std::ptr::addr_of!((*table).header.magic).read_unaligned() };
    if magic != ABI_MAGIC {
        return Err(Error::AbiMismatch(format!(
            "{shown}: table magic is {magic:#018x}, expected {ABI_MAGIC:#018x} ('OFFLDPLG'): \
             not an offload plugin, or a corrupt one"
        )));
    }
    // SAFETY: the magic matched, so the header (fixed across all versions) is present.
    let header: AbiHeader = unsafe { std::ptr::addr_of!((*table).header).read_unaligned() };
    if header.abi_major != ABI_MAJOR {
        return Err(Error::AbiMismatch(format!(
            "{shown}: plugin speaks ABI {}.{}, this runtime speaks {ABI_MAJOR}.{ABI_MINOR}; \
             rebuild the plugin against this runtime's offload-core",
            header.abi_major, header.abi_minor
        )));
    }
    let size = header.table_size as usize;
    if size < TABLE_SIZE_1_0 {
        return Err(Error::AbiMismatch(format!(
            "{shown}: plugin table is {size} bytes, ABI {ABI_MAJOR}.0 tables have at least \
             {TABLE_SIZE_1_0}; the table is short (corrupt, or not built with offload-core's \
             export_plugin!)"
        )));
    }
    if size > MAX_TABLE_SIZE {
        return Err(Error::AbiMismatch(format!(
            "{shown}: plugin table claims {size} bytes (at most {MAX_TABLE_SIZE} are believed): \
             corrupt"
        )));
    }
    let covered = size.min(std::mem::size_of::<PluginTable>());
    let mut copy = std::mem::MaybeUninit::<PluginTable>::zeroed();
    // SAFETY: the plugin's table is readable for `size >= covered` bytes (contract); the copy
    // has room for `covered` bytes. A zeroed `PluginTable` is valid (null pointers, `None`
    // entries, zero integers), and so is any byte pattern copied over it: integers and raw
    // pointers accept every value and a non-null `Option<fn>` is a valid (if untrusted)
    // function pointer.
    let copy = unsafe {
        std::ptr::copy_nonoverlapping(table.cast::<u8>(), copy.as_mut_ptr().cast::<u8>(), covered);
        copy.assume_init()
    };
    for (name, offset, present) in entries(&copy) {
        if offset + std::mem::size_of::<usize>() <= covered && !present {
            return Err(Error::AbiMismatch(format!(
                "{shown}: plugin table (ABI {}.{}, {size} bytes) has a null '{name}' entry, which \
                 its version requires",
                header.abi_major, header.abi_minor
            )));
        }
    }
    Ok(copy)
}

/// Whether a table's declared size covers the entry at `offset`.
fn covers(t: &PluginTable, offset: usize) -> bool {
    t.header.table_size as usize >= offset + std::mem::size_of::<usize>()
}

/// An entry the caller needs, or `Unsupported` naming it.
fn need<F: Copy>(f: Option<F>, name: &str, plugin: &str) -> Result<F> {
    f.ok_or_else(|| {
        Error::Unsupported(format!(
            "plugin '{plugin}' has no '{name}' entry (it speaks an older ABI)"
        ))
    })
}

impl LoadedPlugin {
    /// Opens a plugin library, calls its entry point and checks the table.
    ///
    /// # Safety
    /// Opening the library runs its initialisers and its entry point, in this process, and the
    /// plugin it returns is raw (its devices' `unsafe` methods take unchecked pointers). The
    /// caller trusts the file at `path` as code it links: a plugin built for this ABI, whose
    /// table's functions do what the ABI says of them. The loader checks the table's header,
    /// size and entries, and every answer the plugin gives; not what its code does.
    pub unsafe fn open(path: &Path) -> Result<Arc<LoadedPlugin>> {
        let shown = path.display();
        // SAFETY: loading a library runs its initialisers: the caller trusts it (this
        // function's contract).
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| Error::PluginLoad(format!("{shown}: cannot open library: {e}")))?;
        // Never unloaded (see the module docs).
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        // SAFETY: the entry symbol has the `EntryFn` type by the ABI contract.
        let entry: libloading::Symbol<'static, EntryFn> =
            unsafe { lib.get(ENTRY_SYMBOL.as_bytes()) }.map_err(|e| {
                Error::PluginLoad(format!("{shown}: no entry symbol '{ENTRY_SYMBOL}': {e}"))
            })?;
        // SAFETY: calling the entry point is the ABI contract; it catches its own panics.
        let raw = unsafe { entry() };
        Self::from_table(raw, path)
    }

    /// Wraps an already obtained table (checked here). Used by [`LoadedPlugin::open`] and by
    /// tests that build tables in process.
    ///
    /// # Safety
    /// As [`check_table`].
    pub unsafe fn from_raw(table: *const PluginTable, path: &Path) -> Result<Arc<LoadedPlugin>> {
        Self::from_table(table, path)
    }

    fn from_table(raw: *const PluginTable, path: &Path) -> Result<Arc<LoadedPlugin>> {
        // SAFETY: `raw` comes from a plugin entry point (or a test), which is the contract of
        // `check_table`.
        let table = unsafe { check_table(raw, path) }?;
        let h = &table.header;
        let abi_version = (h.abi_major, h.abi_minor);
        // SAFETY: the header checked out; its strings are static per the contract.
        let (name, triple, build_id) = unsafe {
            (
                header_str(h.name, "name", path)?,
                header_str(h.target_triple, "target_triple", path)?,
                header_str(h.build_id, "build_id", path)?,
            )
        };
        Ok(Arc::new_cyclic(|this| LoadedPlugin {
            this: this.clone(),
            table,
            path: path.to_path_buf(),
            name,
            triple,
            build_id,
            abi_version,
        }))
    }

    /// Library path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The plugin's build identification string.
    pub fn build_id(&self) -> &str {
        &self.build_id
    }

    /// ABI version (major, minor) the plugin was built with.
    pub fn abi_version(&self) -> (u16, u16) {
        self.abi_version
    }

    /// Offers the runtime's JIT service to the plugin (ABI 1.2). `Unsupported` when the plugin
    /// predates the entry or compiles nothing.
    pub fn set_jit_service(&self, service: &'static AbiJitService) -> Result<()> {
        let t = &self.table;
        let f = need(t.set_jit_service, "set_jit_service", &self.name)?;
        // SAFETY: a checked, non-null entry; `service` lives forever.
        self.call("set_jit_service", |err| unsafe { f(t.ctx, service, err) })
    }

    fn call(&self, what: &str, f: impl FnOnce(*const AbiErrorOut) -> i32) -> Result<()> {
        let mut slot: Option<Error> = None;
        let sink = AbiErrorOut {
            ctx: &mut slot as *mut Option<Error> as *mut c_void,
            set: collect_error,
        };
        let status = f(&sink);
        if status == 0 {
            return Ok(());
        }
        let e = slot.unwrap_or_else(|| {
            Error::PluginPanic(format!(
                "plugin '{}': {what} failed with status {status} but reported no error",
                self.name
            ))
        });
        Err(e)
    }
}

unsafe extern "C" fn collect_error(
    ctx: *mut c_void,
    kind: u32,
    code: i64,
    msg: *const u8,
    len: usize,
) {
    // SAFETY: `ctx` is the `Option<Error>` set up in `LoadedPlugin::call`, alive for the
    // duration of the plugin call; `msg` is valid for `len` bytes per the ABI contract.
    unsafe {
        let slot = &mut *(ctx as *mut Option<Error>);
        let mut text = String::new();
        if !msg.is_null() {
            text =
                String::from_utf8_lossy(std::slice::from_raw_parts(msg, len.min(MAX_PLUGIN_TEXT)))
                    .into_owned();
            if len > MAX_PLUGIN_TEXT {
                text += &format!(" ... (the plugin's message was cut: {len} bytes)");
            }
        }
        *slot = Some(Error::from_parts(kind, code, text));
    }
}

unsafe extern "C" fn collect_string(ctx: *mut c_void, bytes: *const u8, len: usize) {
    if bytes.is_null() || len == 0 {
        return;
    }
    // SAFETY: `ctx` is a live `String` owned by the caller of the plugin; `bytes` is valid
    // for `len` bytes per the ABI contract.
    unsafe {
        let s = &mut *(ctx as *mut String);
        let room = MAX_PLUGIN_TEXT.saturating_sub(s.len());
        s.push_str(&String::from_utf8_lossy(std::slice::from_raw_parts(
            bytes,
            len.min(room),
        )));
    }
}

fn string_sink(s: &mut String) -> AbiStringOut {
    AbiStringOut {
        ctx: s as *mut String as *mut c_void,
        write: collect_string,
    }
}

fn queue_bits(q: Option<QueueHandle>) -> u64 {
    q.map_or(SYNC_QUEUE, |q| q.0)
}

impl GenericPlugin for LoadedPlugin {
    fn name(&self) -> &str {
        &self.name
    }

    fn elf_machine(&self) -> u16 {
        self.table.header.elf_machine
    }

    fn target_triple(&self) -> &str {
        &self.triple
    }

    fn init(&self) -> Result<usize> {
        let mut count = 0u32;
        let t = &self.table;
        let f = need(t.init, "init", &self.name)?;
        // SAFETY: a checked, non-null entry; pointers passed are live locals.
        self.call("init", |err| unsafe { f(t.ctx, &mut count, err) })?;
        if count as usize > MAX_DEVICES {
            return Err(Error::PluginLoad(format!(
                "plugin '{}' reports {count} devices; at most {MAX_DEVICES} are believed",
                self.name
            )));
        }
        Ok(count as usize)
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        let t = &self.table;
        let f = need(t.check_image, "check_image", &self.name)?;
        // SAFETY: checked entry; `image` is a live slice.
        self.call("check_image", |err| unsafe {
            f(t.ctx, image.as_ptr(), image.len(), err)
        })
    }

    fn image_claims(&self) -> Vec<ImageClaim> {
        let t = &self.table;
        let default = || {
            vec![
                ImageClaim::Elf {
                    machine: t.header.elf_machine,
                },
                ImageClaim::Bitcode {
                    triple: self.triple.clone(),
                },
            ]
        };
        let Some(f) = t.image_claims else {
            return default();
        };
        let mut text = String::new();
        let sink = string_sink(&mut text);
        // SAFETY: checked entry; the sink is a live local.
        match self.call("image_claims", |err| unsafe { f(t.ctx, &sink, err) }) {
            Ok(()) => text.lines().filter_map(ImageClaim::from_text).collect(),
            Err(_) => default(),
        }
    }

    fn properties(&self) -> Vec<(String, String)> {
        let t = &self.table;
        let Some(f) = t.plugin_properties else {
            return Vec::new();
        };
        let mut text = String::new();
        let sink = string_sink(&mut text);
        // SAFETY: checked entry; the sink is a live local.
        match self.call("plugin_properties", |err| unsafe { f(t.ctx, &sink, err) }) {
            Ok(()) => text
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            Err(e) => vec![("error".into(), e.to_string())],
        }
    }

    fn jit_stats(&self) -> Option<offload_core::JitStats> {
        let t = &self.table;
        let f = t.jit_stats?;
        let mut out = offload_core::JitStats::default();
        // SAFETY: checked entry; `out` is a live local.
        self.call("jit_stats", |err| unsafe { f(t.ctx, &mut out, err) })
            .ok()
            .map(|()| out)
    }

    fn device(&self, index: usize) -> Result<Arc<dyn GenericDevice>> {
        let dev = u32::try_from(index)
            .map_err(|_| Error::NotFound(format!("device {index} of plugin '{}'", self.name)))?;
        let plugin = self
            .this
            .upgrade()
            .ok_or_else(|| Error::NotFound(format!("plugin '{}' was dropped", self.name)))?;
        // The runtime checks the index against the device count before it asks, and the
        // plugin's generic layer on every call; no round trip is spent on it here.
        Ok(Arc::new(LoadedDevice { plugin, dev }))
    }
}

impl LoadedPlugin {
    /// Whether the plugin's table has the entry at `offset` (for callers deciding between a
    /// newer call and a fallback).
    pub fn has_entry(&self, offset: usize) -> bool {
        covers(&self.table, offset)
    }
}

/// A device of a [`LoadedPlugin`].
#[derive(Debug)]
pub struct LoadedDevice {
    plugin: Arc<LoadedPlugin>,
    dev: u32,
}

impl LoadedDevice {
    /// Calls entry `f` (named `what`) of the plugin's table.
    fn call<F: Copy>(
        &self,
        what: &str,
        f: Option<F>,
        call: impl FnOnce(F, super::Ctx, *const AbiErrorOut) -> i32,
    ) -> Result<()> {
        let f = need(f, what, &self.plugin.name)?;
        let ctx = self.plugin.table.ctx;
        self.plugin.call(what, |err| call(f, ctx, err))
    }

    fn table(&self) -> &PluginTable {
        &self.plugin.table
    }
}

impl GenericDevice for LoadedDevice {
    fn index(&self) -> usize {
        self.dev as usize
    }

    fn info(&self) -> Result<DeviceInfo> {
        let mut raw = AbiDeviceInfo::default();
        let (mut name, mut cu, mut features) = (String::new(), String::new(), String::new());
        let (sn, sc, sf) = (
            string_sink(&mut name),
            string_sink(&mut cu),
            string_sink(&mut features),
        );
        self.call(
            "device_info",
            self.table().device_info,
            // SAFETY: checked entry; all out-pointers are live locals.
            |f, ctx, err| unsafe { f(ctx, self.dev, &mut raw, &sn, &sc, &sf, err) },
        )?;
        Ok(DeviceInfo {
            name,
            compute_unit_kind: cu,
            target_features: features,
            total_memory: raw.total_memory,
            compute_units: raw.compute_units,
            limits: DeviceLimits {
                max_grid: raw.max_grid,
                max_block: raw.max_block,
                max_threads_per_block: raw.max_threads_per_block,
                warp_size: raw.warp_size,
            },
        })
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        self.call(
            "device_check_image",
            self.table().device_check_image,
            // SAFETY: checked entry; live slice.
            |f, ctx, err| unsafe { f(ctx, self.dev, image.as_ptr(), image.len(), err) },
        )
    }

    unsafe fn load_image(&self, image: &[u8]) -> Result<ProgramHandle> {
        let mut out = 0u64;
        self.call(
            "load_image",
            self.table().load_image,
            // SAFETY: checked entry; live slice and out-pointer; the image is trusted (the
            // caller's contract).
            |f, ctx, err| unsafe { f(ctx, self.dev, image.as_ptr(), image.len(), &mut out, err) },
        )?;
        Ok(ProgramHandle(out))
    }

    unsafe fn unload_image(&self, program: ProgramHandle) -> Result<()> {
        self.call(
            "unload_image",
            self.table().unload_image,
            // SAFETY: checked entry.
            |f, ctx, err| unsafe { f(ctx, self.dev, program.0, err) },
        )
    }

    fn kernel(&self, program: ProgramHandle, name: &str) -> Result<KernelHandle> {
        let mut out = 0u64;
        self.call(
            "get_kernel",
            self.table().get_kernel,
            // SAFETY: checked entry; live name and out-pointer.
            |f, ctx, err| unsafe {
                f(
                    ctx,
                    self.dev,
                    program.0,
                    name.as_ptr(),
                    name.len(),
                    &mut out,
                    err,
                )
            },
        )?;
        Ok(KernelHandle(out))
    }

    fn global(&self, program: ProgramHandle, name: &str) -> Result<GlobalSymbol> {
        let (mut ptr, mut size) = (0u64, 0u64);
        self.call(
            "get_global",
            self.table().get_global,
            // SAFETY: checked entry; live name and out-pointers.
            |f, ctx, err| unsafe {
                f(
                    ctx,
                    self.dev,
                    program.0,
                    name.as_ptr(),
                    name.len(),
                    &mut ptr,
                    &mut size,
                    err,
                )
            },
        )?;
        Ok(GlobalSymbol {
            ptr: DevicePtr(ptr),
            size,
        })
    }

    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr> {
        let mut out = 0u64;
        // SAFETY: checked entry; live out-pointer.
        self.call("alloc", self.table().alloc, |f, ctx, err| unsafe {
            f(ctx, self.dev, size, kind.to_u32(), &mut out, err)
        })?;
        Ok(DevicePtr(out))
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        // SAFETY: checked entry; nobody uses the allocation after (the caller's contract).
        self.call("free", self.table().free, |f, ctx, err| unsafe {
            f(ctx, self.dev, ptr.0, err)
        })
    }

    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let _span = queue.map(|q| {
            tracing::info_span!(target: "offload::queue", "enqueue copy to device", queue = q.0,
                bytes = len, "queue {:#x}: {len} bytes host -> device {dst}", q.0)
            .entered()
        });
        self.call(
            "copy_to_device",
            self.table().copy_to_device,
            // SAFETY: checked entry; the caller guarantees `src` per this method's contract.
            |f, ctx, err| unsafe { f(ctx, self.dev, dst.0, src, len, queue_bits(queue), err) },
        )
    }

    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let _span = queue.map(|q| {
            tracing::info_span!(target: "offload::queue", "enqueue copy to host", queue = q.0,
                bytes = len, "queue {:#x}: {len} bytes device {src} -> host", q.0)
            .entered()
        });
        self.call(
            "copy_from_device",
            self.table().copy_from_device,
            // SAFETY: checked entry; the caller guarantees `dst` per this method's contract.
            |f, ctx, err| unsafe { f(ctx, self.dev, dst, src.0, len, queue_bits(queue), err) },
        )
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let _span = tracing::info_span!(target: "offload::queue", "copy device to device",
            queue = queue.map_or(0, |q| q.0), bytes = len,
            "{len} bytes device {src} -> device {dst}")
        .entered();
        self.call(
            "copy_device_to_device",
            self.table().copy_device_to_device,
            // SAFETY: checked entry; nobody else uses the destination (the caller's contract).
            |f, ctx, err| unsafe { f(ctx, self.dev, dst.0, src.0, len, queue_bits(queue), err) },
        )
    }

    /// # Safety
    /// As [`GenericDevice::launch`]: the plugin's kernel runs on what the arguments point to.
    unsafe fn launch(
        &self,
        kernel: KernelHandle,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let _span = queue.map(|q| {
            tracing::info_span!(target: "offload::queue", "enqueue launch", queue = q.0,
                kernel = kernel.0, "queue {:#x}: launch of kernel {:#x}, grid {:?}, block {:?}",
                q.0, kernel.0, dims.grid, dims.block)
            .entered()
        });
        if self.plugin.abi_version < (1, 4)
            && let Some(i) = args.iter().position(|a| matches!(a, KernelArg::Word(_)))
        {
            let (major, minor) = self.plugin.abi_version;
            return Err(Error::Unsupported(format!(
                "kernel argument {i} is a word (OpenMP's convention, plugin ABI 1.4); plugin \
                 '{}' speaks ABI {major}.{minor}: rebuild it against this runtime's offload-core",
                self.plugin.name
            )));
        }
        let raw_dims = AbiLaunchDims {
            grid: dims.grid,
            block: dims.block,
            shared_mem_bytes: dims.shared_mem_bytes,
            reserved: 0,
        };
        let raw_args: Vec<AbiKernelArg> = args
            .iter()
            .map(|a| {
                let (kind, bits) = a.to_bits();
                AbiKernelArg {
                    kind,
                    reserved: 0,
                    bits,
                }
            })
            .collect();
        // SAFETY: checked entry; dims and args are live for the call (the plugin copies them
        // before enqueueing).
        self.call("launch", self.table().launch, |f, ctx, err| unsafe {
            f(
                ctx,
                self.dev,
                kernel.0,
                &raw_dims,
                raw_args.as_ptr(),
                raw_args.len(),
                queue_bits(queue),
                err,
            )
        })
    }

    fn queue_create(&self) -> Result<QueueHandle> {
        let mut out = 0u64;
        self.call(
            "queue_create",
            self.table().queue_create,
            // SAFETY: checked entry; live out-pointer.
            |f, ctx, err| unsafe { f(ctx, self.dev, &mut out, err) },
        )?;
        tracing::info!(target: "offload::queue", queue = out, "created queue {out:#x}");
        Ok(QueueHandle(out))
    }

    fn queue_synchronize(&self, queue: QueueHandle) -> Result<()> {
        let _span = tracing::info_span!(target: "offload::queue", "queue_synchronize", queue = queue.0, "synchronize queue {:#x}", queue.0).entered();
        self.call(
            "queue_synchronize",
            self.table().queue_synchronize,
            // SAFETY: checked entry.
            |f, ctx, err| unsafe { f(ctx, self.dev, queue.0, err) },
        )
    }

    fn queue_destroy(&self, queue: QueueHandle) -> Result<()> {
        let _span = tracing::info_span!(target: "offload::queue", "queue_destroy", queue = queue.0, "destroy queue {:#x}", queue.0).entered();
        self.call(
            "queue_destroy",
            self.table().queue_destroy,
            // SAFETY: checked entry.
            |f, ctx, err| unsafe { f(ctx, self.dev, queue.0, err) },
        )
    }

    fn event_create(&self) -> Result<EventHandle> {
        let mut out = 0u64;
        self.call(
            "event_create",
            self.table().event_create,
            // SAFETY: checked entry; live out-pointer.
            |f, ctx, err| unsafe { f(ctx, self.dev, &mut out, err) },
        )?;
        Ok(EventHandle(out))
    }

    fn event_record(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        let _span = tracing::info_span!(target: "offload::queue", "event_record", queue = queue.0, "record event {:#x} on queue {:#x}", event.0, queue.0).entered();
        self.call(
            "event_record",
            self.table().event_record,
            // SAFETY: checked entry.
            |f, ctx, err| unsafe { f(ctx, self.dev, event.0, queue.0, err) },
        )
    }

    fn event_wait(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        let _span = tracing::info_span!(target: "offload::queue", "event_wait", queue = queue.0, "queue {:#x} waits for event {:#x}", queue.0, event.0).entered();
        self.call(
            "event_wait",
            self.table().event_wait,
            // SAFETY: checked entry.
            |f, ctx, err| unsafe { f(ctx, self.dev, event.0, queue.0, err) },
        )
    }

    fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        let _span = tracing::info_span!(target: "offload::queue", "event_synchronize", "wait for event {:#x}", event.0).entered();
        self.call(
            "event_synchronize",
            self.table().event_synchronize,
            // SAFETY: checked entry.
            |f, ctx, err| unsafe { f(ctx, self.dev, event.0, err) },
        )
    }

    fn event_query(&self, event: EventHandle) -> Result<bool> {
        let mut done = 0u32;
        self.call(
            "event_query",
            self.table().event_query,
            // SAFETY: checked entry; live out-pointer.
            |f, ctx, err| unsafe { f(ctx, self.dev, event.0, &mut done, err) },
        )?;
        Ok(done != 0)
    }

    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        self.call(
            "event_destroy",
            self.table().event_destroy,
            // SAFETY: checked entry.
            |f, ctx, err| unsafe { f(ctx, self.dev, event.0, err) },
        )
    }

    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<std::time::Duration> {
        let mut ns = 0u64;
        self.call(
            "event_elapsed",
            self.table().event_elapsed,
            // SAFETY: checked entry; live out-pointer.
            |f, ctx, err| unsafe { f(ctx, self.dev, start.0, end.0, &mut ns, err) },
        )?;
        Ok(std::time::Duration::from_nanos(ns))
    }

    unsafe fn host_access(
        &self,
        ptr: DevicePtr,
        len: u64,
        visit: &mut dyn FnMut(*mut u8) -> Result<()>,
    ) -> Result<()> {
        let mut visiting = Visiting {
            visit,
            outcome: None,
        };
        let ctx_ptr = (&mut visiting as *mut Visiting<'_>).cast::<c_void>();
        let called = self.call(
            "host_access",
            self.table().host_access,
            // SAFETY: checked entry; `visiting` outlives the call, and `visit_trampoline` is
            // the `AbiVisit` for it.
            |f, ctx, err| unsafe { f(ctx, self.dev, ptr.0, len, visit_trampoline, ctx_ptr, err) },
        );
        // The visit's own error (or panic) is the call's, rather than the plugin's word for it.
        match visiting.outcome {
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            Some(Ok(Err(e))) => Err(e),
            _ => called,
        }
    }
}

/// The caller's visit of [`GenericDevice::host_access`], and how it went (a panic is carried
/// over the plugin's frames, and resumed once the plugin has returned).
struct Visiting<'a> {
    visit: &'a mut dyn FnMut(*mut u8) -> Result<()>,
    outcome: Option<std::thread::Result<Result<()>>>,
}

/// The [`entry::AbiVisit`](crate::entry::AbiVisit) of [`Visiting`]: runs the visit once,
/// catching its panic.
unsafe extern "C" fn visit_trampoline(ctx: *mut c_void, addr: *mut u8, _len: u64) -> i32 {
    // SAFETY: `ctx` is the `Visiting` of the `host_access` call on the stack below this one.
    let visiting = unsafe { &mut *ctx.cast::<Visiting<'_>>() };
    if visiting.outcome.is_some() {
        // A plugin that visits twice: the second visit is refused.
        return 1;
    }
    let visit = &mut visiting.visit;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| visit(addr)));
    let status = i32::from(!matches!(outcome, Ok(Ok(()))));
    visiting.outcome = Some(outcome);
    status
}

/// Makes the ABI form of a JIT service. It is leaked: plugins keep the pointer for the rest of
/// the process (they are never unloaded), so callers make one per service, not one per call.
pub fn jit_service_table(service: Arc<dyn JitService>) -> &'static AbiJitService {
    let ctx: &'static Arc<dyn JitService> = Box::leak(Box::new(service));
    Box::leak(Box::new(AbiJitService {
        ctx: ctx as *const Arc<dyn JitService> as *const c_void,
        compile: serve_jit,
    }))
}

unsafe extern "C" fn serve_jit(
    ctx: *const c_void,
    head: *const u8,
    head_len: usize,
    image: *const u8,
    image_len: usize,
    out: *const AbiStringOut,
    err: *const AbiErrorOut,
) -> i32 {
    let result = offload_core::panic::catch(|| -> Result<Vec<u8>> {
        if ctx.is_null() || out.is_null() || (head.is_null() && head_len > 0) {
            return Err(Error::InvalidArgument(
                "JIT service called with a null pointer".into(),
            ));
        }
        if image.is_null() || image_len == 0 {
            return Err(Error::InvalidImage("image is empty (0 bytes)".into()));
        }
        // SAFETY: `ctx` was made by `jit_service_table` and is never freed; the plugin passes
        // slices valid for the call (ABI contract).
        let (service, head, image) = unsafe {
            (
                &*(ctx as *const Arc<dyn JitService>),
                std::slice::from_raw_parts(head, head_len),
                std::slice::from_raw_parts(image, image_len),
            )
        };
        let (target, post) = offload_core::jit::decode_request_head(head)?;
        let output = service.compile(&CompileRequest {
            image,
            target,
            post,
        })?;
        Ok(offload_core::jit::encode_output(&output))
    })
    .unwrap_or_else(|text| {
        Err(Error::PluginPanic(format!(
            "the runtime's JIT service panicked: {text}"
        )))
    });
    match result {
        Ok(bytes) => {
            // SAFETY: `out` is non-null (checked) and valid per the ABI contract.
            unsafe { ((*out).write)((*out).ctx, bytes.as_ptr(), bytes.len()) };
            0
        }
        Err(e) => {
            if !err.is_null() {
                let msg = e.message();
                // SAFETY: `err` is valid per the ABI contract; `msg` is live for the call.
                unsafe {
                    ((*err).set)(
                        (*err).ctx,
                        e.kind() as u32,
                        e.native_code(),
                        msg.as_ptr(),
                        msg.len(),
                    )
                };
            }
            1
        }
    }
}
