//! The library's state: the offload runtime it reaches devices through, the OpenMP devices
//! (numbered as upstream numbers them), the registered descriptors and their images, and, per
//! device, the images loaded on it, their kernels and globals, and the mapping table.
//!
//! The runtime is made on the first `__tgt_register_lib` (or `__tgt_rtl_init`) and counted:
//! it lives until the last unregistration. Plugins and the JIT worker are looked for next to
//! this library (not next to the executable), then in `OFFLOAD_PLUGIN_PATH`.

use crate::abi::{self, BinDesc, OffloadEntry};
use crate::gpu;
use crate::mapping::{self, DeviceMemory, Table};
use crate::messages;
use crate::nowait;
use crate::ompt;
use crate::pool;
use offload::{Device, KernelArg, LaunchDims, MemoryKind, Program, Runtime};
use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex};

/// How many OpenMP devices the host plugin's device becomes (upstream's host plugin has 4);
/// `OFFLOAD_OMP_HOST_DEVICES` changes it (0 to 64).
const DEFAULT_HOST_DEVICES: usize = 4;
/// The largest image accepted from a descriptor (a wild `ImageEnd` is refused, not read).
const MAX_IMAGE_BYTES: usize = 1 << 32;
/// The most images or entries one descriptor may hold.
const MAX_COUNT: usize = 1 << 20;

pub(crate) use offload_core::sync::lock;

/// A host-table entry, copied out of the program's memory.
#[derive(Debug, Clone)]
pub struct HostEntry {
    pub addr: usize,
    pub name: String,
    pub size: usize,
    pub flags: i32,
    pub data: i32,
}

/// What a target construct asks of its launch (`KernelArgsTy` after upstream's upgrade).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaunchRequest {
    pub version: u32,
    pub num_teams: u32,
    pub thread_limit: u32,
    pub tripcount: u64,
    pub dyn_cgroup_mem: u32,
}

/// A registered image.
#[derive(Debug)]
pub struct Image {
    pub bytes: Vec<u8>,
    pub entries: Arc<[HostEntry]>,
}

/// What one descriptor registered.
#[derive(Debug)]
pub struct Library {
    pub desc: usize,
    pub images: Vec<Arc<Image>>,
}

/// One OpenMP device's mutable state.
#[derive(Debug, Default)]
pub struct DeviceState {
    pub table: Table,
    /// The registration count [`Rtl::init_device`] last completed for: while it is current,
    /// a construct finds the device ready without walking the registered images again.
    pub initialised: Option<u64>,
    /// Images loaded here, by (descriptor, image index).
    pub loaded: HashMap<(usize, usize), Arc<Program>>,
    /// Kernels by region id (host address of the entry).
    pub kernels: HashMap<usize, LoadedKernel>,
    /// Device memory an image's load made (the indirect-call table), freed with it.
    pub image_memory: HashMap<(usize, usize), Vec<u64>>,
    /// The host addresses of the globals each descriptor's images mapped here.
    pub globals: HashMap<usize, Vec<usize>>,
    /// Why registered images were not loaded here (the plugin's refusal), by image.
    pub refused: HashMap<(usize, usize), String>,
    /// Whether OMPT's device-initialise callback has been made (its finalise then is, too).
    pub announced: bool,
}

/// A kernel of a loaded image.
#[derive(Debug, Clone)]
pub struct LoadedKernel {
    /// (descriptor, image index).
    pub image: (usize, usize),
    pub kernel: offload::Kernel,
    pub name: String,
    /// Its kernel environment, on a GPU.
    pub config: Option<gpu::KernelConfig>,
}

/// What a GPU device needs for OpenMP's kernel protocol ([`gpu`]).
#[derive(Debug)]
pub struct GpuDevice {
    pub family: gpu::Family,
    pub grid: gpu::Grid,
    pub info: offload::DeviceInfo,
    /// This device's index in its plugin, and the plugin's device count.
    pub index: (usize, usize),
    /// The AMD heap (`__omp_rtl_device_memory_pool`): address and size, made at the first
    /// load of an image that has the pool.
    pub heap: Mutex<Option<(u64, u64)>>,
}

/// One OpenMP device.
#[derive(Debug)]
pub struct OmpDevice {
    pub id: usize,
    pub device: Device,
    /// The OpenMP GPU protocol's state, for a CUDA or AMD device.
    pub gpu: Option<GpuDevice>,
    pub state: Mutex<DeviceState>,
    /// Held while the device loads registered images ([`Rtl::init_device`]).
    pub init: Mutex<()>,
    /// What mappings free waits here for the next mapping (upstream's memory manager).
    pub pool: pool::Pool,
    /// Queues of finished `nowait` constructs, for the next ones (upstream's stream pool).
    pub queues: Mutex<Vec<offload::Queue>>,
}

impl pool::Backing for Device {
    fn alloc_raw(&self, size: u64) -> Result<u64, String> {
        // SAFETY: OpenMP's mappings are raw device addresses by design; this runtime uses no
        // HostBuffer and no safe-layer queue on them.
        unsafe { offload::raw::device(self) }
            .alloc(size, MemoryKind::Device)
            .map(|p| p.0)
            .map_err(|e| e.to_string())
    }
    fn free_raw(&self, ptr: u64) {
        // SAFETY: as in alloc_raw; the pool frees an allocation once, when no mapping and no
        // queued construct uses it.
        let _ = unsafe { offload::raw::device(self).free(offload::DevicePtr(ptr)) };
    }
}

impl Drop for OmpDevice {
    fn drop(&mut self) {
        if lock(&self.state).announced {
            ompt::device_finalize(self.id);
        }
        self.pool.release(&self.device);
        if let Some(g) = &self.gpu {
            if let Some((heap, _)) = lock(&g.heap).take() {
                pool::Backing::free_raw(&self.device, heap);
            }
        }
    }
}

impl OmpDevice {
    /// The host's device number (`omp_get_initial_device`), for OMPT.
    fn host_number(&self) -> i64 {
        ompt::host_device()
    }
}

impl OmpDevice {
    /// The bytes of global `name` of `program`, `None` if the image has no such global; the
    /// global must be `size` bytes.
    fn read_global(
        &self,
        program: &Program,
        name: &str,
        size: usize,
    ) -> Result<Option<Vec<u8>>, String> {
        // SAFETY: a lookup touches no memory.
        let Ok(g) = unsafe { offload::raw::device(&self.device) }.global(program.handle(), name)
        else {
            return Ok(None);
        };
        if g.size != size as u64 {
            return Err(format!(
                "global '{name}' is {} bytes; LLVM 19's is {size}",
                g.size
            ));
        }
        let mut bytes = vec![0u8; size];
        // SAFETY: the global's own bytes, into a buffer of its size.
        unsafe { offload::raw::device(&self.device).read(&mut bytes, g.ptr) }
            .map_err(|e| format!("reading global '{name}': {e}"))?;
        Ok(Some(bytes))
    }

    /// Writes `bytes` into global `name` of `program`; `false` if the image has no such
    /// global. The global must be as long as `bytes`.
    fn write_global(&self, program: &Program, name: &str, bytes: &[u8]) -> Result<bool, String> {
        // SAFETY: a lookup touches no memory.
        let Ok(g) = unsafe { offload::raw::device(&self.device) }.global(program.handle(), name)
        else {
            return Ok(false);
        };
        if g.size != bytes.len() as u64 {
            return Err(format!(
                "global '{name}' is {} bytes; LLVM 19's is {}",
                g.size,
                bytes.len()
            ));
        }
        // SAFETY: the global's own bytes; no launch of this program runs yet.
        unsafe { offload::raw::device(&self.device).write(g.ptr, bytes) }
            .map_err(|e| format!("writing global '{name}': {e}"))?;
        Ok(true)
    }

    /// The kernel environment of `kernel` (upstream's `GenericKernelTy::init`): a kernel without
    /// one is bare; one that is malformed is an error naming the byte.
    fn kernel_config(&self, program: &Program, kernel: &str) -> Result<gpu::KernelConfig, String> {
        let global = format!("{kernel}_kernel_environment");
        match self.read_global(program, &global, gpu::KERNEL_ENV_SIZE) {
            Ok(Some(bytes)) => gpu::KernelConfig::parse(kernel, &bytes),
            Ok(None) => Ok(gpu::KernelConfig::bare()),
            Err(e) => Err(format!("kernel '{kernel}': {e}")),
        }
        .map_err(|e| format!("kernel environment of device {}: {e}", self.id))
    }

    /// The rest of a GPU image's load, in upstream's order (`loadBinary`): the indirect-call
    /// table and the device environment, the AMD heap, then the image's constructors (its
    /// init kernel). Device memory made for the image goes to `memory`.
    fn gpu_load(
        &self,
        g: &GpuDevice,
        settings: &gpu::Settings,
        program: &Program,
        indirect: Vec<(u64, u64)>,
        memory: &mut Vec<u64>,
    ) -> Result<(), String> {
        let mut table = (0, 0);
        if !indirect.is_empty() {
            let n = indirect.len() as u64;
            let bytes = gpu::indirect_call_table(indirect);
            let p = pool::Backing::alloc_raw(&self.device, bytes.len() as u64)
                .map_err(|e| format!("allocating the indirect-call table: {e}"))?;
            memory.push(p);
            // SAFETY: a fresh allocation of this length.
            unsafe { offload::raw::device(&self.device).write(offload::DevicePtr(p), &bytes) }
                .map_err(|e| format!("writing the indirect-call table: {e}"))?;
            table = (p, n);
        }
        let env = gpu::device_environment(g.family, &g.info, g.index, settings, &g.grid, table);
        if !self.write_global(program, gpu::DEVICE_ENV, &env.bytes())? {
            tracing::debug!(target: "offload::image",
                "OpenMP device {}: the image has no {}", self.id, gpu::DEVICE_ENV);
        }
        if g.family == gpu::Family::Amd {
            // SAFETY: a lookup touches no memory.
            let has_pool = unsafe { offload::raw::device(&self.device) }
                .global(program.handle(), gpu::MEMORY_POOL)
                .is_ok();
            if has_pool {
                let (ptr, size) = {
                    let mut heap = lock(&g.heap);
                    *heap.get_or_insert_with(|| {
                        let size = settings.heap_size.unwrap_or(gpu::DEFAULT_AMD_HEAP);
                        match pool::Backing::alloc_raw(&self.device, size) {
                            Ok(p) => (p, size),
                            Err(e) => {
                                messages::error(&format!(
                                    "Failure to allocate device memory for global memory pool: {e}"
                                ));
                                (0, 0)
                            }
                        }
                    })
                };
                self.write_global(
                    program,
                    gpu::MEMORY_POOL_TRACKER,
                    &gpu::memory_pool_tracker(),
                )?;
                self.write_global(program, gpu::MEMORY_POOL, &gpu::memory_pool(ptr, size))?;
            }
        }
        let init = g.family.ctor_kernels().0;
        if let Ok(k) = program.kernel(init) {
            // SAFETY: the init kernel takes no arguments and runs the image's constructors.
            unsafe { k.launch(LaunchDims::linear(1, 1)).unchecked().run() }
                .map_err(|e| format!("running the constructors ({init}): {e}"))?;
        }
        Ok(())
    }
}

impl DeviceMemory for OmpDevice {
    fn alloc(&self, size: u64, host: usize) -> Option<u64> {
        match self.pool.alloc(&self.device, size) {
            Ok(p) => {
                ompt::data_op(
                    ompt::DataOp::Alloc,
                    (host, self.host_number()),
                    (p as usize, self.id as i64),
                    size,
                );
                Some(p)
            }
            Err(e) => {
                messages::error(&format!(
                    "allocating {size} bytes on device {} failed: {e}",
                    self.id
                ));
                None
            }
        }
    }
    fn free(&self, ptr: u64) {
        ompt::data_op(
            ompt::DataOp::Delete,
            (ptr as usize, self.id as i64),
            (0, -1),
            0,
        );
        self.pool.free(&self.device, ptr);
    }
    fn submit(&self, dst: u64, src: usize, size: u64) -> bool {
        self.copy_in(dst, src, size, None)
    }
    fn retrieve(&self, dst: usize, src: u64, size: u64) -> bool {
        self.copy_out(dst, src, size, None)
    }
}

impl OmpDevice {
    /// A queue for a `nowait` construct: a pooled one, or a new one.
    pub fn take_queue(&self) -> Result<offload::Queue, String> {
        if let Some(q) = lock(&self.queues).pop() {
            return Ok(q);
        }
        self.device.queue().map_err(|e| e.to_string())
    }

    /// A drained queue back into the pool.
    pub fn give_back_queue(&self, queue: offload::Queue) {
        lock(&self.queues).push(queue);
    }

    /// Copies `size` bytes from host `src` to device `dst`, on `queue` if given (then `src`
    /// stays valid and unchanged until the queue has run).
    pub fn copy_in(&self, dst: u64, src: usize, size: u64, queue: Option<&offload::Queue>) -> bool {
        let _span = tracing::info_span!(target: "offload::copy", "omp copy to device",
            bytes = size, "OpenMP device {}: {size} bytes host {src:#x} -> device {dst:#x}", self.id)
        .entered();
        ompt::data_op(
            ompt::DataOp::ToDevice,
            (src, self.host_number()),
            (dst as usize, self.id as i64),
            size,
        );
        // SAFETY: the program hands over `size` readable bytes at `src` (the OpenMP contract),
        // which stay as they are until the construct is over (a queued copy's too); the copy
        // goes to a mapping the program made (raw addresses, OpenMP's model); no safe-layer
        // buffer or HostBuffer of this runtime refers to it.
        let r = unsafe {
            offload::raw::device(&self.device).copy_to_device(
                offload::DevicePtr(dst),
                src as *const u8,
                size as usize,
                queue.map(|q| q.handle()),
            )
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                messages::error(&format!(
                    "copying {size} bytes to device {} failed: {e}",
                    self.id
                ));
                false
            }
        }
    }

    /// Copies `size` bytes from device `src` to host `dst`, on `queue` if given (then `dst` is
    /// written when the queue runs).
    pub fn copy_out(
        &self,
        dst: usize,
        src: u64,
        size: u64,
        queue: Option<&offload::Queue>,
    ) -> bool {
        let _span = tracing::info_span!(target: "offload::copy", "omp copy to host",
            bytes = size, "OpenMP device {}: {size} bytes device {src:#x} -> host {dst:#x}", self.id)
        .entered();
        ompt::data_op(
            ompt::DataOp::FromDevice,
            (src as usize, self.id as i64),
            (dst, self.host_number()),
            size,
        );
        // SAFETY: as above, `size` writable bytes at `dst` that nobody else touches until the
        // construct is over.
        let r = unsafe {
            offload::raw::device(&self.device).copy_from_device(
                dst as *mut u8,
                offload::DevicePtr(src),
                size as usize,
                queue.map(|q| q.handle()),
            )
        };
        match r {
            Ok(()) => true,
            Err(e) => {
                messages::error(&format!(
                    "copying {size} bytes from device {} failed: {e}",
                    self.id
                ));
                false
            }
        }
    }
}

/// The library's state.
#[derive(Debug)]
pub struct Rtl {
    /// Owns the plugins the devices belong to.
    pub runtime: Runtime,
    /// The OpenMP devices, numbered as registration finds them ([`Rtl::number_devices`]).
    devices: Mutex<Vec<Arc<OmpDevice>>>,
    /// The plugin devices already numbered: (plugin, index).
    numbered: Mutex<std::collections::HashSet<(String, usize)>>,
    /// Why plugins or devices did not take registered images, once per image and device.
    refusals: Mutex<Vec<String>>,
    /// The images numbering has looked at: (descriptor, image index).
    examined: Mutex<std::collections::HashSet<(usize, usize)>>,
    /// The GPU settings of the environment, read once.
    pub gpu_settings: gpu::Settings,
    pub libraries: Mutex<Vec<Library>>,
    /// How many descriptors were ever registered (images and requires flags change only then).
    pub registrations: std::sync::atomic::AtomicU64,
    pub requires: Mutex<i64>,
}

struct Global {
    refs: usize,
    rtl: Option<Arc<Rtl>>,
}

static GLOBAL: Mutex<Global> = Mutex::new(Global { refs: 0, rtl: None });

fn host_devices() -> usize {
    match offload_core::env::u32_in_range(
        &["OFFLOAD_OMP_HOST_DEVICES"],
        0,
        64,
        DEFAULT_HOST_DEVICES as u32,
    ) {
        Ok(n) => n as usize,
        Err(e) => {
            messages::error(&format!("{e}; using {DEFAULT_HOST_DEVICES}"));
            DEFAULT_HOST_DEVICES
        }
    }
}

fn make_rtl() -> Rtl {
    messages::init_from_env();
    // The runtime's own info lines only for OFFLOAD_INFO: LIBOMPTARGET_INFO asks for upstream's
    // lines (messages.rs), which programs and tests compare line by line. A bad value was
    // reported by `init_from_env`.
    let _ = offload::diagnostics::init_with(|| {
        let mut s = offload::diagnostics::Settings::from_env()?;
        if offload_core::env::raw(&["OFFLOAD_INFO"])?.is_none() {
            s.info = 0;
        }
        Ok(s)
    });
    // The runtime's rule, anchored at this library instead of the executable. A bad
    // OFFLOAD_PLUGIN_PATH is reported (a C library has no caller to return it to) and left out.
    let mut dirs = offload::plugin_path_entries().unwrap_or_else(|e| {
        messages::error(&e.to_string());
        Vec::new()
    });
    dirs.extend(offload::dirs_beside(
        offload_core::fs::this_library_dir().as_deref(),
    ));
    let filter = offload::plugin_filter().ok().flatten();
    let runtime = Runtime::with_plugin_dirs(&dirs, filter.as_deref());
    ompt::set_host_device(0);
    Rtl {
        runtime,
        devices: Mutex::default(),
        numbered: Mutex::default(),
        refusals: Mutex::default(),
        examined: Mutex::default(),
        gpu_settings: gpu::Settings::from_env(),
        libraries: Mutex::default(),
        registrations: Default::default(),
        requires: Mutex::new(0),
    }
}

/// Upstream's plugin order (`amdgpu`, `cuda`, `host`: LLVM 19's `LIBOMPTARGET_PLUGINS_TO_BUILD`
/// order), then any other plugin in the runtime's order.
fn plugin_rank(name: &str) -> usize {
    match name {
        "amdgpu" => 0,
        "cuda" => 1,
        "host" => 2,
        _ => 3,
    }
}

/// Counts one more user of the runtime (making it on the first).
pub fn init() -> Arc<Rtl> {
    let rtl = {
        let mut g = lock(&GLOBAL);
        g.refs += 1;
        g.rtl.get_or_insert_with(|| Arc::new(make_rtl())).clone()
    };
    // Outside the lock: libomp asks this library for its devices while it connects.
    ompt::connect();
    rtl
}

/// Counts one user fewer; the last one drops the runtime's devices and images.
pub fn deinit() {
    let last = {
        let mut g = lock(&GLOBAL);
        if g.refs > 0 {
            g.refs -= 1;
        }
        if g.refs == 0 { g.rtl.take() } else { None }
    };
    // Dropped outside the lock: the devices' OMPT finalise callbacks may call the API.
    drop(last);
}

/// The runtime, if any descriptor is registered.
pub fn get() -> Option<Arc<Rtl>> {
    lock(&GLOBAL).rtl.clone()
}

/// Copies the entries `[begin, end)` out of the program.
///
/// # Safety
/// `begin..end` must be a range of entries the program owns (or empty).
unsafe fn read_entries(
    begin: *const OffloadEntry,
    end: *const OffloadEntry,
) -> Result<Vec<HostEntry>, String> {
    if begin.is_null() || end.is_null() || end <= begin {
        return Ok(Vec::new());
    }
    let n = (end as usize - begin as usize) / std::mem::size_of::<OffloadEntry>();
    if n > MAX_COUNT {
        return Err(format!("an offload entry table of {n} entries"));
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: within the table (caller's contract).
        let e = unsafe { *begin.add(i) };
        let name = if e.name.is_null() {
            String::new()
        } else {
            // SAFETY: entry names are NUL-terminated strings of the program.
            unsafe { CStr::from_ptr(e.name) }
                .to_string_lossy()
                .into_owned()
        };
        out.push(HostEntry {
            addr: e.addr as usize,
            name,
            size: e.size,
            flags: e.flags,
            data: e.data,
        });
    }
    Ok(out)
}

impl Rtl {
    /// The number of OpenMP devices (`omp_get_num_devices`).
    pub fn device_count(&self) -> usize {
        lock(&self.devices).len()
    }

    /// OpenMP device `id`.
    pub fn device(&self, id: usize) -> Option<Arc<OmpDevice>> {
        lock(&self.devices).get(id).cloned()
    }

    /// Every OpenMP device, in number order.
    pub fn all_devices(&self) -> Vec<Arc<OmpDevice>> {
        lock(&self.devices).clone()
    }

    /// Why plugins and devices did not take the registered images (for the mandatory policy's
    /// failure and the info lines).
    pub fn refusals(&self) -> Vec<String> {
        lock(&self.refusals).clone()
    }

    /// Upstream's `registerLib` numbering: for each registered image not yet examined, in
    /// registration order, each plugin in upstream's order ([`plugin_rank`]) that serves its
    /// kind, and each of its devices that can run it: a device not yet numbered becomes the
    /// next OpenMP device (the host's one device becomes `OFFLOAD_OMP_HOST_DEVICES`, 4 by
    /// default, as upstream's host plugin has 4). Only devices that can run an image of the
    /// program are numbered; why the others cannot goes to the info lines
    /// (`LIBOMPTARGET_INFO` bit 0x10) and into the mandatory policy's failure.
    fn number_devices(&self) {
        let images: Vec<((usize, usize), Arc<Image>)> = lock(&self.libraries)
            .iter()
            .flat_map(|l| {
                l.images
                    .iter()
                    .enumerate()
                    .map(move |(i, img)| ((l.desc, i), img.clone()))
            })
            .collect();
        let mut order: Vec<&offload::PluginSlot> = self.runtime.plugins().iter().collect();
        order.sort_by_key(|s| plugin_rank(s.name()));
        let pools = pool::Pool::from_env();
        for (key, img) in images {
            if !lock(&self.examined).insert(key) {
                continue;
            }
            let mut refused = Vec::new();
            for slot in &order {
                if let Err(e) = slot.check_image(&img.bytes) {
                    refused.push(format!("plugin '{}': {e}", slot.name()));
                    continue;
                }
                let count = match slot.device_count() {
                    Ok(0) => {
                        refused.push(format!("plugin '{}' has no devices", slot.name()));
                        continue;
                    }
                    Ok(n) => n,
                    Err(e) => {
                        refused.push(format!("plugin '{}': {e}", slot.name()));
                        continue;
                    }
                };
                for i in 0..count {
                    let device = match slot.device(i) {
                        Ok(d) => d,
                        Err(e) => {
                            refused.push(format!("device {}:{i}: {e}", slot.name()));
                            continue;
                        }
                    };
                    // SAFETY: an image check touches no memory.
                    if let Err(e) = unsafe { offload::raw::device(&device) }.check_image(&img.bytes)
                    {
                        refused.push(format!("device {device}: {e}"));
                        continue;
                    }
                    // A remote device (another process, another node) shares no memory with
                    // the program: a program that requires unified shared memory cannot use it.
                    if slot.name() == "mpi" && self.usm() {
                        refused.push(format!(
                            "device {device}: the program requires unified_shared_memory, and a \
                             remote device shares no memory with it"
                        ));
                        continue;
                    }
                    if !lock(&self.numbered).insert((slot.name().to_string(), i)) {
                        continue;
                    }
                    self.add_device(slot, device, (i, count), &pools);
                }
            }
            for why in refused {
                messages::info_line(messages::info::PLUGIN_KERNEL, || {
                    format!(
                        "Image {} of descriptor {:#x} not taken by {why}",
                        key.1, key.0
                    )
                });
                lock(&self.refusals).push(why);
            }
        }
        ompt::set_host_device(self.device_count());
    }

    fn add_device(
        &self,
        slot: &offload::PluginSlot,
        device: Device,
        index: (usize, usize),
        pools: &pool::Pool,
    ) {
        let copies = if slot.name() == "host" {
            host_devices()
        } else {
            1
        };
        let gpu = match gpu::Family::of_plugin(slot.name()) {
            None => None,
            Some(family) => match device.info() {
                Ok(info) => Some(GpuDevice {
                    family,
                    grid: gpu::Grid::new(family, &info, &self.gpu_settings),
                    info,
                    index,
                    heap: Mutex::default(),
                }),
                Err(e) => {
                    lock(&self.refusals).push(format!("device {device}: {e}"));
                    return;
                }
            },
        };
        let mut devices = lock(&self.devices);
        let mut gpu = gpu;
        for _ in 0..copies {
            let id = devices.len();
            tracing::info!(target: "offload::device", "OpenMP device {id} is {device}");
            devices.push(Arc::new(OmpDevice {
                id,
                device: device.clone(),
                gpu: gpu.take(),
                state: Mutex::default(),
                init: Mutex::default(),
                pool: pools.like(),
                queues: Mutex::default(),
            }));
        }
    }

    /// `__tgt_register_lib`.
    ///
    /// # Safety
    /// `desc` is a descriptor as clang's registration code builds it.
    pub unsafe fn register(&self, desc: *const BinDesc) -> Result<(), String> {
        if desc.is_null() {
            return Err("__tgt_register_lib: the descriptor is NULL".into());
        }
        // SAFETY: caller's contract.
        let d = unsafe { *desc };
        let n = d.num_device_images;
        if n < 0 || n as usize > MAX_COUNT || (n > 0 && d.device_images.is_null()) {
            return Err(format!(
                "__tgt_register_lib: the descriptor at {desc:p} says {n} device images at {:p}",
                d.device_images
            ));
        }
        // SAFETY: the host table of the descriptor.
        let host = unsafe { read_entries(d.host_entries_begin, d.host_entries_end) }?;
        for e in &host {
            if e.flags & abi::ENTRY_REGISTER_REQUIRES != 0 {
                self.add_requires(e.data as i64);
            }
        }
        let mut images = Vec::new();
        for i in 0..n as usize {
            // SAFETY: `n` images at `device_images`.
            let img = unsafe { *d.device_images.add(i) };
            let (s, e) = (img.image_start as usize, img.image_end as usize);
            if img.image_start.is_null() || e < s || e - s > MAX_IMAGE_BYTES {
                return Err(format!(
                    "__tgt_register_lib: device image {i} spans {:p}..{:p}",
                    img.image_start, img.image_end
                ));
            }
            // SAFETY: the image's bytes, in the program's read-only data.
            let bytes = unsafe { std::slice::from_raw_parts(img.image_start, e - s) }.to_vec();
            // SAFETY: the image's entry table.
            let entries = unsafe { read_entries(img.entries_begin, img.entries_end) }?;
            images.push(Arc::new(Image {
                bytes,
                entries: entries.into(),
            }));
        }
        tracing::info!(target: "offload::image",
            "OpenMP descriptor {:#x} registered: {} image(s), {} entries, {} bytes",
            desc as usize, images.len(),
            images.first().map_or(0, |i| i.entries.len()),
            images.iter().map(|i| i.bytes.len()).sum::<usize>());
        lock(&self.libraries).push(Library {
            desc: desc as usize,
            images,
        });
        self.number_devices();
        self.registrations
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    /// `__tgt_unregister_lib`: unloads the descriptor's images from every device.
    pub fn unregister(&self, desc: *const BinDesc) {
        let key = desc as usize;
        tracing::info!(target: "offload::image", "OpenMP descriptor {key:#x} unregistered");
        // Queued `nowait` work that no task queried to its end finishes before the images go.
        nowait::settle_all();
        lock(&self.libraries).retain(|l| l.desc != key);
        lock(&self.examined).retain(|(lib, _)| *lib != key);
        for d in self.all_devices() {
            let mut st = lock(&d.state);
            let gone: Vec<(usize, usize)> = st
                .loaded
                .keys()
                .filter(|(lib, _)| *lib == key)
                .copied()
                .collect();
            for img in gone {
                if let (Some(g), Some(program)) = (&d.gpu, st.loaded.get(&img)) {
                    // The image's destructors (`declare target` C++ globals).
                    let fini = g.family.ctor_kernels().1;
                    if let Ok(k) = program.kernel(fini) {
                        // SAFETY: the fini kernel takes no arguments.
                        let _ = unsafe { k.launch(LaunchDims::linear(1, 1)).unchecked().run() };
                    }
                }
                for p in st.image_memory.remove(&img).unwrap_or_default() {
                    pool::Backing::free_raw(&d.device, p);
                }
                st.loaded.remove(&img);
            }
            st.kernels.retain(|_, k| k.image.0 != key);
            st.refused.retain(|(lib, _), _| *lib != key);
            // Its globals' mappings go with it: the library may come back at the same address.
            for addr in st.globals.remove(&key).unwrap_or_default() {
                st.table.entries.remove(&addr);
            }
        }
    }

    fn add_requires(&self, flags: i64) {
        use abi::requires::*;
        let mut r = lock(&self.requires);
        if *r == 0 {
            *r = flags;
            return;
        }
        for (bit, clause) in [
            (REVERSE_OFFLOAD, "reverse_offload"),
            (UNIFIED_ADDRESS, "unified_address"),
            (UNIFIED_SHARED_MEMORY, "unified_shared_memory"),
            (DYNAMIC_ALLOCATORS, "dynamic_allocators"),
        ] {
            if (*r & bit) != (flags & bit) && !(*r == NONE && flags == NONE) {
                messages::fatal(
                    2,
                    &format!("'#pragma omp requires {clause}' not used consistently!"),
                );
            }
        }
    }

    /// `dumpTargetPointerMappings` of every device, after the construct at `at`
    /// (`file:line:col`), to standard error or standard output, last device first if asked.
    pub fn dump_tables(&self, at: &str, to_stdout: bool, last_first: bool) {
        let mut devices = self.all_devices();
        if last_first {
            devices.reverse();
        }
        for d in &devices {
            let st = lock(&d.state);
            messages::dump_table(d.id, at, &st.table, to_stdout);
        }
    }

    /// Whether `requires unified_shared_memory` is in force.
    pub fn usm(&self) -> bool {
        *lock(&self.requires) & abi::requires::UNIFIED_SHARED_MEMORY != 0
    }

    /// `initLibrary`: loads every registered image this device can run (once), finds its kernels
    /// and maps its globals with an infinite count.
    pub fn init_device(&self, dev: &OmpDevice) -> Result<(), String> {
        let generation = self
            .registrations
            .load(std::sync::atomic::Ordering::Acquire);
        if lock(&dev.state).initialised == Some(generation) {
            return Ok(());
        }
        // One initialisation of a device at a time. The state lock is not held while an image
        // loads: loading is a dlopen, which waits for the dynamic loader's lock, and a library
        // being opened or closed on another thread holds that lock while it registers or
        // unregisters here (which takes the state lock): holding both would deadlock, as
        // upstream's library does (tests/omp/images.c).
        let _one = lock(&dev.init);
        let libs: Vec<(usize, Vec<Arc<Image>>)> = lock(&self.libraries)
            .iter()
            .map(|l| (l.desc, l.images.clone()))
            .collect();
        let usm = self.usm();
        let first = {
            let mut st = lock(&dev.state);
            st.table.usm = usm;
            !std::mem::replace(&mut st.announced, true)
        };
        if first {
            // Once per device, and without the state lock: the tool may call the API.
            let kind = std::ffi::CString::new(dev.device.plugin_name()).unwrap_or_default();
            ompt::device_initialize(dev.id, &kind);
        }
        for (lib, images) in libs {
            for (i, img) in images.iter().enumerate() {
                if lock(&dev.state).loaded.contains_key(&(lib, i)) {
                    continue;
                }
                // SAFETY: an image check touches no memory.
                if let Err(e) = unsafe { offload::raw::device(&dev.device) }.check_image(&img.bytes)
                {
                    lock(&dev.state).refused.insert((lib, i), e.to_string());
                    continue;
                }
                // SAFETY: the program's own device image, which clang-19 embedded and libomp
                // registered: trusted as the program's host code is, as upstream does.
                let program = unsafe { dev.device.load_trusted(&img.bytes) }
                    .map_err(|e| format!("loading image {i} on device {}: {e}", dev.id))?;
                ompt::device_load(dev.id, &img.bytes, program.handle().0);
                // The device side of every entry, found without the state lock.
                let mut globals = Vec::new();
                let mut kernels = Vec::new();
                for e in img.entries.iter() {
                    if e.size != 0 {
                        // SAFETY: a lookup touches no memory.
                        let g = unsafe { offload::raw::device(&dev.device) }
                            .global(program.handle(), &e.name)
                            .map_err(|err| {
                                format!("global '{}' on device {}: {err}", e.name, dev.id)
                            })?;
                        let mut tgt = g.ptr.0;
                        if e.flags & abi::ENTRY_INDIRECT != 0 {
                            // `declare target indirect`: the host function maps to the device
                            // function the named device variable points to.
                            let mut word = [0u8; 8];
                            messages::info_copy_to_host(g.ptr.0, word.as_ptr() as usize, 8, "");
                            if !dev.retrieve(word.as_mut_ptr() as usize, g.ptr.0, 8) {
                                return Err(format!(
                                    "reading indirect function pointer '{}' on device {}",
                                    e.name, dev.id
                                ));
                            }
                            tgt = u64::from_le_bytes(word);
                        }
                        globals.push((e, g.ptr.0, tgt));
                    } else if e.addr != 0 {
                        let k = program.kernel(&e.name).map_err(|err| {
                            format!("kernel '{}' on device {}: {err}", e.name, dev.id)
                        })?;
                        kernels.push((e.addr, k, e.name.clone()));
                    }
                }
                // The GPU protocol's part of a load: the kernels' environments, the device
                // environment, the heap, the constructors.
                let mut configs = vec![None; kernels.len()];
                let mut image_memory = Vec::new();
                if let Some(g) = &dev.gpu {
                    for (c, (_, _, name)) in configs.iter_mut().zip(&kernels) {
                        *c = Some(dev.kernel_config(&program, name)?);
                    }
                    let indirect: Vec<(u64, u64)> = globals
                        .iter()
                        .filter(|(e, _, _)| e.flags & abi::ENTRY_INDIRECT != 0)
                        .map(|(e, _, tgt)| (e.addr as u64, *tgt))
                        .collect();
                    dev.gpu_load(g, &self.gpu_settings, &program, indirect, &mut image_memory)
                        .map_err(|e| format!("loading image {i} on device {}: {e}", dev.id))?;
                }
                let program = Arc::new(program);
                let mut st = lock(&dev.state);
                if !lock(&self.libraries).iter().any(|l| l.desc == lib) {
                    // Unregistered meanwhile: the program goes (outside the lock).
                    drop(st);
                    drop(program);
                    for p in image_memory {
                        pool::Backing::free_raw(&dev.device, p);
                    }
                    continue;
                }
                let mut keys = Vec::new();
                for (e, global, tgt) in globals {
                    if st.table.translate(e.addr).is_some() {
                        continue;
                    }
                    if usm && e.flags & abi::ENTRY_INDIRECT == 0 {
                        // The device's reference pointer gets the host address. Under the
                        // state lock: the library (and its globals) cannot be unloaded now.
                        let _ = dev.submit(global, e.addr, e.size as u64);
                    }
                    st.table.entries.insert(
                        e.addr,
                        mapping::Entry {
                            hst_base: e.addr,
                            hst_begin: e.addr,
                            hst_end: e.addr + e.size,
                            tgt_alloc: tgt,
                            tgt_begin: tgt,
                            dyn_ref: mapping::INF,
                            hold_ref: 0,
                            name: e.name.clone(),
                            decl: messages::var_decl(&e.name),
                            shadows: Default::default(),
                            owned: false,
                            fence: None,
                            users: Vec::new(),
                        },
                    );
                    keys.push(e.addr);
                }
                for ((addr, kernel, name), config) in kernels.into_iter().zip(configs) {
                    st.kernels.insert(
                        addr,
                        LoadedKernel {
                            image: (lib, i),
                            kernel,
                            name,
                            config,
                        },
                    );
                }
                if !image_memory.is_empty() {
                    st.image_memory.insert((lib, i), image_memory);
                }
                st.globals.entry(lib).or_default().extend(keys);
                st.loaded.insert((lib, i), program);
            }
        }
        lock(&dev.state).initialised = Some(generation);
        Ok(())
    }

    /// Launches the kernel of region `host_ptr` on `dev` with `args` (words: pointer-sized
    /// values), upstream's way: the launch environment first, then the arguments. On the host
    /// the kernel is called once (a 1x1 launch runs on the calling thread; libomp gives it its
    /// parallelism); on a GPU with the teams and threads upstream's plugins choose ([`gpu`]).
    /// Words fit a JIT-compiled kernel's `ptr` and `i64` parameters as well as an AOT kernel's
    /// unknown ones. On a GPU the launch goes on `work`'s queue when it has one.
    pub fn launch(
        &self,
        work: &nowait::Work,
        host_ptr: usize,
        args: &[KernelArg],
        request: &LaunchRequest,
    ) -> Result<(), String> {
        let dev = &*work.dev;
        let st = lock(&dev.state);
        let Some(k) = st.kernels.get(&host_ptr) else {
            // Upstream's message; then, if this device refused some of the program's images,
            // why.
            let mut why =
                format!("Host ptr {host_ptr:#018x} does not have a matching target pointer.");
            if !st.refused.is_empty() {
                let mut refusals: Vec<_> = st.refused.values().cloned().collect();
                refusals.sort();
                refusals.dedup();
                why.push_str(&format!(
                    " Device {} ({}) cannot run this program's image(s): {}",
                    dev.id,
                    dev.device,
                    refusals.join("; ")
                ));
            }
            return Err(why);
        };
        // A clone: its `Kernel` keeps the program loaded, so an unregistration on another
        // thread cannot unload it under this launch.
        let k = k.clone();
        drop(st);
        match &dev.gpu {
            None => {
                messages::plugin_info_line(messages::info::PLUGIN_KERNEL, || {
                    format!(
                        "Launching kernel {} with 1 blocks and 1 threads in Generic mode",
                        k.name
                    )
                });
                let mut a = Vec::with_capacity(args.len() + 1);
                // `~0`: no launch environment (a host kernel never reads it).
                a.push(KernelArg::Word(u64::MAX));
                a.extend_from_slice(args);
                // SAFETY: OpenMP's contract, upstream's too: the compiler made the kernel and
                // its arguments together (the mapped addresses of the region's variables, each
                // mapped at the size the program states), so the arguments are the kernel's
                // parameters.
                unsafe {
                    k.kernel
                        .launch(LaunchDims::linear(1, 1))
                        .args_raw(&a)
                        .unchecked()
                        .run()
                }
                .map_err(|e| format!("kernel {} on device {}: {e}", k.name, dev.id))
            }
            Some(g) => self.launch_gpu(work, g, &k, args, request),
        }
    }

    fn launch_gpu(
        &self,
        work: &nowait::Work,
        g: &GpuDevice,
        k: &LoadedKernel,
        args: &[KernelArg],
        request: &LaunchRequest,
    ) -> Result<(), String> {
        let config = k.config.unwrap_or_else(gpu::KernelConfig::bare);
        let (threads, blocks) = gpu::choose(
            &g.grid,
            &config,
            request.num_teams,
            request.thread_limit,
            request.tripcount,
        );
        messages::plugin_info_line(messages::info::PLUGIN_KERNEL, || {
            format!(
                "Launching kernel {} with {blocks} blocks and {threads} threads in {} mode",
                k.name,
                config.mode.name()
            )
        });
        let dev = &*work.dev;
        // Device memory of this launch, freed when it is over.
        let mut temporary = Vec::new();
        let result = (|| {
            let mut a = Vec::with_capacity(args.len() + 1);
            // Kernel arguments older than version 3 have no launch environment parameter.
            if request.version >= 3 {
                let bytes = config.reduction_buffer_bytes();
                if bytes == 0 {
                    a.push(KernelArg::Word(u64::MAX));
                } else {
                    let alloc = |size: u64, what: &str| {
                        pool::Backing::alloc_raw(&dev.device, size)
                            .map_err(|e| format!("allocating the {what} ({size} bytes): {e}"))
                    };
                    let env = alloc(gpu::LAUNCH_ENV_SIZE as u64, "kernel launch environment")?;
                    temporary.push(env);
                    let buffer = alloc(bytes, "team reduction buffer")?;
                    temporary.push(buffer);
                    let block = gpu::launch_environment(buffer);
                    messages::info_line(messages::info::DATA_TRANSFER, || {
                        format!(
                            "Copying data from host to device, HstPtr={:#018x}, TgtPtr={env:#018x}, Size={}, Name=KernelLaunchEnv",
                            block.as_ptr() as usize,
                            block.len()
                        )
                    });
                    // SAFETY: a fresh allocation of the block's length.
                    unsafe { offload::raw::device(&dev.device)
                        .write(offload::DevicePtr(env), &block) }
                        .map_err(|e| format!("writing the kernel launch environment: {e}"))?;
                    a.push(KernelArg::Word(env));
                }
            }
            a.extend_from_slice(args);
            let dims = LaunchDims {
                grid: [u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1],
                block: [threads.max(1), 1, 1],
                shared_mem_bytes: request.dyn_cgroup_mem.max(g.grid.shared_memory),
            };
            match work.queue() {
                // SAFETY: as on the host: the compiler made the kernel and its arguments
                // together; on a queue, what the arguments point to lives until the construct's
                // work has run (`nowait::Work` frees it only then).
                Some(q) => unsafe { k.kernel.launch(dims).args_raw(&a).on(q).unchecked().run() },
                // SAFETY: as on the host.
                None => unsafe { k.kernel.launch(dims).args_raw(&a).unchecked().run() },
            }
            .map_err(|e| e.to_string())
        })()
        .map_err(|e| format!("kernel {} on device {}: {e}", k.name, dev.id));
        for p in temporary {
            work.free_raw(p);
        }
        result
    }
}
