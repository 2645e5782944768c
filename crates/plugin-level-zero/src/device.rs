//! One Level Zero GPU: the hooks the generic device layer calls.
//!
//! The devices of a driver share one context ([`Context`]: memory, modules and command lists
//! of different devices may meet only in one context); memory is `zeMemAlloc{Device,Host,
//! Shared}` in it, and it goes after the last module, list and device made in it. A queue of the layer owns an immediate command list (on the device's first
//! compute queue group, asynchronous) and an event. The commands of a list are only
//! guaranteed to *start* in order (the spec's "Execution Barriers"), so a barrier goes between
//! each command and the next: the GPU runs a queue's copies and launches one after another
//! (`stream_ordered`), each seeing the memory the one before wrote. Draining the queue appends
//! a barrier that signals the event and waits for it on the host, which is when the layer
//! releases what the operations used. Work without a queue goes through an immediate list of the device's own and is waited
//! for the same way, operation by operation.
//!
//! A copy to the host goes through a host allocation ([`ZeDevice::copy_to_host`]): the copy
//! engine fills it, the stream is drained, and the CPU copies it out, so a copy whose wait
//! gives up can write only the staging memory, which is then never freed, not memory the
//! program has been given back. Such a copy drains its stream when it runs, on a queue too
//! (the queue's worker waits for it there).
//!
//! Kernel arguments are state of the kernel object (`zeKernelSetArgumentValue`, captured when
//! the launch is appended): the arguments, the group size and the append happen under the
//! kernel's lock, so launches of one kernel from several threads do not mix their arguments.

use crate::spirv::{self, Param};
use crate::ze::{self, Handle, Ze};
use offload_core::image::ImageKind;
use offload_core::jit::{JitTarget, ParamType, PostProcess};
use offload_core::{
    DeviceInfo, DeviceLimits, DevicePtr, Error, GlobalSymbol, KernelArg, LaunchDims, MemoryKind,
    Result,
};
use offload_plugin_common::{DeviceBackend, Fit, Op};
use std::ffi::{CString, c_void};
use std::sync::{Arc, Mutex};

/// The triple bitcode for these devices is compiled for.
pub const TRIPLE: &str = "spirv64-unknown-unknown";

/// A driver's context, shared by its devices and by what is made in it; destroyed after the
/// last of them.
pub struct Context {
    ze: Arc<Ze>,
    handle: Handle,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Context({:p})", self.handle)
    }
}

impl Context {
    /// A new context on `driver` (a handle the loader gave).
    pub(crate) fn create(ze: Arc<Ze>, driver: Handle) -> Result<Context> {
        let desc = ze::FlagsDesc {
            stype: ze::stype::CONTEXT_DESC,
            next: std::ptr::null(),
            flags: 0,
        };
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: live descriptor and out-pointer.
        unsafe { ze.zeContextCreate(driver, &desc, &mut handle)? };
        Ok(Context { ze, handle })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: nothing made in the context is left (each holds the context).
        let _ = unsafe { self.ze.zeContextDestroy(self.handle) };
    }
}

/// An immediate command list, and the event its drains signal.
pub struct Stream {
    ze: Arc<Ze>,
    _context: Arc<Context>,
    list: Handle,
    pool: Handle,
    event: Handle,
    /// One thread at a time appends to the list (immediate lists are not thread-safe); true
    /// while the last command appended is not yet followed by a barrier.
    unfenced: Mutex<bool>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:p})", self.list)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the layer drops a stream after draining it; a stream whose making failed
        // half way has null handles for what was not made. The event goes before its pool.
        unsafe {
            if !self.list.is_null() {
                let _ = self.ze.zeCommandListDestroy(self.list);
            }
            if !self.event.is_null() {
                let _ = self.ze.zeEventDestroy(self.event);
            }
            if !self.pool.is_null() {
                let _ = self.ze.zeEventPoolDestroy(self.pool);
            }
        }
    }
}

impl Stream {
    /// Appends a copy of `len` bytes from `src` to `dst` ([`Stream::append`]).
    ///
    /// # Safety
    /// Both ranges are valid for `len` bytes until the list has run, and do not overlap.
    unsafe fn append_copy(
        &self,
        what: &str,
        dst: *mut c_void,
        src: *const c_void,
        len: usize,
    ) -> Result<()> {
        self.append(what, |list| {
            // SAFETY: the caller's contract; no event to signal, none to wait for.
            unsafe {
                self.ze.zeCommandListAppendMemoryCopy(
                    list,
                    dst,
                    src,
                    len,
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                )
            }
        })
    }

    /// Appends with `append`, under the list's lock, after a barrier if a command is before
    /// it (so that it starts when that one has finished).
    fn append(&self, what: &str, append: impl FnOnce(Handle) -> Result<()>) -> Result<()> {
        let mut unfenced = offload_core::sync::lock(&self.unfenced);
        if *unfenced {
            // SAFETY: the list's lock is held; no event to signal, none to wait for.
            unsafe {
                self.ze.zeCommandListAppendBarrier(
                    self.list,
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                )
            }
            .map_err(|e| e.context(what.to_string()))?;
            *unfenced = false;
        }
        append(self.list).map_err(|e| e.context(what.to_string()))?;
        *unfenced = true;
        Ok(())
    }

    /// Waits until everything appended so far has run: the event reset, a barrier that
    /// signals it appended, the event waited for on the host (reset first, so that a signal
    /// left by a drain that failed half way cannot pass for this one). A failure is settled
    /// only when the device is lost ([`Error::DeviceFailure`]: its work is gone); any other
    /// (a barrier not appended, a wait that gave up) leaves the appended work running, so it
    /// is [`Error::Unsettled`] and the layer keeps what that work uses.
    fn drain(&self) -> Result<()> {
        let mut unfenced = offload_core::sync::lock(&self.unfenced);
        // SAFETY: the list's lock is held; the event is this stream's alone.
        unsafe {
            self.ze.zeEventHostReset(self.event)?;
            self.ze
                .zeCommandListAppendBarrier(self.list, self.event, 0, std::ptr::null_mut())?;
            *unfenced = false;
            self.ze.zeEventHostSynchronize(self.event, ze::FOREVER)
        }
        .map_err(Error::of_a_wait)
    }
}

/// A module of the driver, destroyed after its last kernel (each holds it) and before its
/// context.
pub struct Module {
    ze: Arc<Ze>,
    _context: Arc<Context>,
    handle: Handle,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Module({:p})", self.handle)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: destroyed once, after the last kernel of it and the last launch that used it
        // (the layer holds the program, the kernels hold the module).
        let _ = unsafe { self.ze.zeModuleDestroy(self.handle) };
    }
}

/// A loaded module, with what the plugin read of its image.
pub struct Program {
    module: Arc<Module>,
    /// The SPIR-V module's kernels and parameters (for native binaries: none).
    spirv: Option<spirv::Module>,
    /// A native binary's `__local` pointer parameters by kernel, from its `.ze_info`.
    native_locals: std::collections::BTreeMap<String, Vec<u32>>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Program({:p})", self.module.handle)
    }
}

/// A kernel object, its parameters and its limits.
pub struct Kernel {
    ze: Arc<Ze>,
    /// Kept until the kernel object is destroyed.
    _module: Arc<Module>,
    kernel: Handle,
    /// Which of its parameters are `__local` pointers (passed to the driver as a size with no value):
    /// from the SPIR-V parameters, or a native binary's `.ze_info`.
    locals: Vec<u32>,
    /// How many parameters the driver says it has.
    arg_count: u32,
    /// `reqd_work_group_size`, or zeros.
    required_group_size: [u32; 3],
    /// Shared local memory the kernel declares itself.
    local_mem: u32,
    /// The most work items a group of this kernel may have (its sub-groups), if the driver
    /// says.
    max_threads: Option<u32>,
    /// Held from setting the arguments to appending the launch.
    launching: Mutex<()>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({:p})", self.kernel)
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // SAFETY: destroyed once, after the last launch that used it (the layer holds it).
        let _ = unsafe { self.ze.zeKernelDestroy(self.kernel) };
    }
}

/// See the module docs.
pub struct ZeDevice {
    ze: Arc<Ze>,
    device: Handle,
    context: Arc<Context>,
    ordinal: u32,
    /// Queues of the compute group, and the next one a stream is made on (round robin).
    queues: u32,
    next_queue: std::sync::atomic::AtomicU32,
    info: DeviceInfo,
    max_shared: u32,
    /// The largest single allocation (`maxMemAllocSize`; 0 if the driver does not say).
    max_alloc: u64,
    own: Mutex<Option<Arc<Stream>>>,
}

impl std::fmt::Debug for ZeDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZeDevice({})", self.info.name)
    }
}

impl Drop for ZeDevice {
    fn drop(&mut self) {
        // The device's own list goes before the context it holds.
        drop(self.own.get_mut().map(Option::take));
    }
}

// SAFETY: Level Zero handles may be used from any thread (the API is thread-safe except for
// command lists and kernel arguments, which the plugin guards with the mutexes above).
unsafe impl Send for ZeDevice {}
// SAFETY: see above.
unsafe impl Sync for ZeDevice {}
// SAFETY: see above.
unsafe impl Send for Stream {}
// SAFETY: see above.
unsafe impl Sync for Stream {}
// SAFETY: see above.
unsafe impl Send for Context {}
// SAFETY: see above.
unsafe impl Sync for Context {}
// SAFETY: see above.
unsafe impl Send for Module {}
// SAFETY: see above.
unsafe impl Sync for Module {}
// SAFETY: see above.
unsafe impl Send for Kernel {}
// SAFETY: see above.
unsafe impl Sync for Kernel {}

fn c_text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).trim().to_string()
}

/// The compute-unit kind of a device: its graphics IP version (`intel-gpu-12.60.7`:
/// architecture, release, revision), or its PCI device id when the driver does not say it.
pub fn compute_unit_kind(ip_version: u32, device_id: u32) -> String {
    if ip_version == 0 {
        format!("intel-gpu-{device_id:#06x}")
    } else {
        format!(
            "intel-gpu-{}.{}.{}",
            ip_version >> 22,
            (ip_version >> 14) & 0xff,
            ip_version & 0x3f
        )
    }
}

impl ZeDevice {
    /// Opens GPU `device` (a handle the loader gave) of the driver whose context is `context`.
    pub(crate) fn open(ze: Arc<Ze>, context: Arc<Context>, device: Handle) -> Result<ZeDevice> {
        let mut ip = ze::IpVersionExt {
            stype: ze::stype::DEVICE_IP_VERSION_EXT,
            next: std::ptr::null(),
            ip_version: 0,
        };
        let mut props = ze::DeviceProperties {
            next: (&mut ip as *mut ze::IpVersionExt).cast(),
            ..Default::default()
        };
        // SAFETY: live out-structures, chained as the API describes.
        unsafe { ze.zeDeviceGetProperties(device, &mut props)? };
        let mut compute = ze::ComputeProperties {
            stype: ze::stype::COMPUTE_PROPERTIES,
            next: std::ptr::null_mut(),
            max_total_group_size: 0,
            max_group_size: [0; 3],
            max_group_count: [0; 3],
            max_shared_local_memory: 0,
            num_sub_group_sizes: 0,
            sub_group_sizes: [0; 8],
        };
        // SAFETY: live out-structure.
        unsafe { ze.zeDeviceGetComputeProperties(device, &mut compute)? };
        let mut count = 0u32;
        // SAFETY: a count query.
        unsafe { ze.zeDeviceGetMemoryProperties(device, &mut count, std::ptr::null_mut())? };
        let blank = ze::MemoryProperties {
            stype: ze::stype::MEMORY_PROPERTIES,
            next: std::ptr::null_mut(),
            flags: 0,
            max_clock_rate: 0,
            max_bus_width: 0,
            total_size: 0,
            name: [0; 256],
        };
        let mut memories = vec![blank; count.min(16) as usize];
        let mut n = memories.len() as u32;
        // SAFETY: `n` structures.
        unsafe { ze.zeDeviceGetMemoryProperties(device, &mut n, memories.as_mut_ptr())? };
        let total_memory = memories[..(n as usize).min(memories.len())]
            .iter()
            .map(|m| m.total_size)
            .sum();
        let (ordinal, queues) = compute_group(&ze, device)?;
        let groups = compute.num_sub_group_sizes.min(8) as usize;
        let info = DeviceInfo {
            name: c_text(&props.name),
            compute_unit_kind: compute_unit_kind(ip.ip_version, props.device_id),
            target_features: String::new(),
            total_memory,
            compute_units: props
                .num_slices
                .saturating_mul(props.num_subslices_per_slice)
                .saturating_mul(props.num_eus_per_subslice),
            limits: DeviceLimits {
                max_grid: compute.max_group_count,
                max_block: compute.max_group_size,
                max_threads_per_block: compute.max_total_group_size,
                warp_size: compute.sub_group_sizes[..groups]
                    .iter()
                    .copied()
                    .max()
                    .unwrap_or(1),
            },
        };
        Ok(ZeDevice {
            ze,
            device,
            context,
            ordinal,
            queues,
            next_queue: std::sync::atomic::AtomicU32::new(0),
            info,
            max_shared: compute.max_shared_local_memory,
            max_alloc: props.max_mem_alloc_size,
            own: Mutex::new(None),
        })
    }

    fn new_stream(&self) -> Result<Stream> {
        let desc = ze::CommandQueueDesc {
            stype: ze::stype::COMMAND_QUEUE_DESC,
            next: std::ptr::null(),
            ordinal: self.ordinal,
            // Streams spread over the group's queues (engines), so that queues run together.
            index: self
                .next_queue
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                % self.queues.max(1),
            flags: 0,
            mode: ze::QUEUE_MODE_ASYNCHRONOUS,
            priority: 0,
        };
        let pool_desc = ze::EventPoolDesc {
            stype: ze::stype::EVENT_POOL_DESC,
            next: std::ptr::null(),
            flags: ze::EVENT_POOL_HOST_VISIBLE,
            count: 1,
        };
        let event_desc = ze::EventDesc {
            stype: ze::stype::EVENT_DESC,
            next: std::ptr::null(),
            index: 0,
            signal: ze::EVENT_SCOPE_HOST,
            wait: ze::EVENT_SCOPE_HOST,
        };
        let ze = &self.ze;
        let (mut list, mut pool, mut event): (Handle, Handle, Handle) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let mut device = self.device;
        let context = self.context.handle;
        // SAFETY: live descriptors and out-pointers; a context and device of ours.
        let made = unsafe {
            ze.zeCommandListCreateImmediate(context, self.device, &desc, &mut list)
                .and_then(|()| ze.zeEventPoolCreate(context, &pool_desc, 1, &mut device, &mut pool))
                .and_then(|()| ze.zeEventCreate(pool, &event_desc, &mut event))
        };
        // Made or not: on a failure, dropping it destroys what was made.
        let stream = Stream {
            ze: ze.clone(),
            _context: self.context.clone(),
            list,
            pool,
            event,
            unfenced: Mutex::new(false),
        };
        made.map(|()| stream)
    }

    /// The kernel's build log after a failed `zeModuleCreate`.
    fn build_log(&self, log: Handle) -> String {
        if log.is_null() {
            return String::new();
        }
        let mut size = 0usize;
        // SAFETY: a size query on a live log, then a buffer of that size; destroyed once.
        unsafe {
            let mut text = String::new();
            let mut buf = Vec::new();
            if self
                .ze
                .zeModuleBuildLogGetString(log, &mut size, std::ptr::null_mut())
                .is_ok()
                && size > 0
                && buf.try_reserve_exact(size).is_ok()
            {
                buf.resize(size, 0);
                if self
                    .ze
                    .zeModuleBuildLogGetString(log, &mut size, buf.as_mut_ptr().cast())
                    .is_ok()
                {
                    text = c_text(&buf[..size.min(buf.len())]);
                }
            }
            // A log of any size is read; an error carries its first 16 KiB.
            const SHOWN: usize = 16 << 10;
            if text.len() > SHOWN {
                let cut = offload_core::text::char_floor(&text, SHOWN);
                let more = text.len() - cut;
                text.truncate(cut);
                text += &format!(" ... ({more} bytes more)");
            }
            let _ = self.ze.zeModuleBuildLogDestroy(log);
            text
        }
    }
}

/// The ordinal of the device's first compute queue group, and its number of queues.
fn compute_group(ze: &Ze, device: Handle) -> Result<(u32, u32)> {
    let mut count = 0u32;
    // SAFETY: a count query.
    unsafe { ze.zeDeviceGetCommandQueueGroupProperties(device, &mut count, std::ptr::null_mut())? };
    let blank = ze::QueueGroupProperties {
        stype: ze::stype::QUEUE_GROUP_PROPERTIES,
        next: std::ptr::null_mut(),
        flags: 0,
        max_memory_fill_pattern_size: 0,
        num_queues: 0,
    };
    let mut groups = vec![blank; count.min(64) as usize];
    let mut n = groups.len() as u32;
    // SAFETY: `n` structures.
    unsafe { ze.zeDeviceGetCommandQueueGroupProperties(device, &mut n, groups.as_mut_ptr())? };
    groups[..(n as usize).min(groups.len())]
        .iter()
        .position(|g| g.flags & ze::QUEUE_GROUP_COMPUTE != 0 && g.num_queues > 0)
        .map(|i| (i as u32, groups[i].num_queues))
        .ok_or_else(|| Error::Unsupported("the device has no compute queue group".into()))
}

impl DeviceBackend for ZeDevice {
    type Program = Program;
    type Kernel = Kernel;
    type Stream = Stream;

    fn info(&self) -> Result<DeviceInfo> {
        Ok(self.info.clone())
    }

    fn jit_target(&self) -> Option<(JitTarget, PostProcess)> {
        Some((
            JitTarget {
                triple: TRIPLE.into(),
                cpu: String::new(),
                features: String::new(),
            },
            PostProcess::for_target(TRIPLE, &self.info.compute_unit_kind, None),
        ))
    }

    fn fits(&self, arch: &str) -> Fit {
        if arch.is_empty() || arch == "generic" || arch == self.info.compute_unit_kind {
            Fit::Compatible
        } else {
            Fit::No(format!(
                "built for '{arch}', this device is {}",
                self.info.compute_unit_kind
            ))
        }
    }

    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()> {
        crate::check_native(image, kind)
    }

    fn load(&self, image: &[u8], kind: &ImageKind) -> Result<Program> {
        let (format, spirv, native_locals) = match kind {
            ImageKind::SpirV => (
                ze::MODULE_FORMAT_SPIRV,
                Some(spirv::parse(image)?),
                Default::default(),
            ),
            ImageKind::Elf(_) => (
                ze::MODULE_FORMAT_NATIVE,
                None,
                crate::zebin::read(image)?.locals,
            ),
            other => {
                return Err(Error::InvalidImage(format!(
                    "a {} is not a Level Zero image",
                    other.describe()
                )));
            }
        };
        let desc = ze::ModuleDesc {
            stype: ze::stype::MODULE_DESC,
            next: std::ptr::null(),
            format,
            input_size: image.len(),
            input: image.as_ptr(),
            build_flags: std::ptr::null(),
            constants: std::ptr::null(),
        };
        let mut module: Handle = std::ptr::null_mut();
        let mut log: Handle = std::ptr::null_mut();
        // SAFETY: a checked image, live for the call (the driver copies what it keeps).
        let made = unsafe {
            self.ze.zeModuleCreate(
                self.context.handle,
                self.device,
                &desc,
                &mut module,
                &mut log,
            )
        };
        let text = self.build_log(log);
        match made {
            Ok(()) => Ok(Program {
                module: Arc::new(Module {
                    ze: self.ze.clone(),
                    _context: self.context.clone(),
                    handle: module,
                }),
                spirv,
                native_locals,
            }),
            Err(e) if text.is_empty() => Err(e),
            // The status first, then the log (an error crossing the plugin ABI is cut at 64
            // KiB; the log is shown up to 16 KiB of it).
            Err(e) => Err(Error::from_parts(
                e.kind() as u32,
                e.native_code(),
                format!("{}; the driver's build log:\n{text}", e.message()),
            )),
        }
    }

    fn kernel(&self, program: &Program, name: &str) -> Result<(Kernel, Option<Vec<ParamType>>)> {
        let params = match &program.spirv {
            Some(m) => Some(m.kernel(name)?.params.clone().ok_or_else(|| {
                Error::InvalidImage(format!(
                    "kernel '{name}': the SPIR-V module's entry point names no function whose \
                     type (OpTypeFunction) gives its parameters"
                ))
            })?),
            None => None,
        };
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name '{name}' contains NUL")))?;
        let desc = ze::KernelDesc {
            stype: ze::stype::KERNEL_DESC,
            next: std::ptr::null(),
            flags: 0,
            name: c.as_ptr(),
        };
        let mut kernel: Handle = std::ptr::null_mut();
        // SAFETY: a module of ours; live descriptor, name and out-pointer.
        unsafe {
            self.ze
                .zeKernelCreate(program.module.handle, &desc, &mut kernel)
        }
        .map_err(|e| e.context(format!("kernel '{name}' in the module")))?;
        let mut props = ze::KernelProperties {
            stype: ze::stype::KERNEL_PROPERTIES,
            next: std::ptr::null_mut(),
            num_kernel_args: 0,
            required_group_size: [0; 3],
            required_num_sub_groups: 0,
            required_subgroup_size: 0,
            max_subgroup_size: 0,
            max_num_subgroups: 0,
            local_mem_size: 0,
            private_mem_size: 0,
            spill_mem_size: 0,
            uuid: [0; 32],
        };
        let mut k = Kernel {
            ze: self.ze.clone(),
            _module: program.module.clone(),
            kernel,
            locals: match &params {
                Some(p) => (0u32..)
                    .zip(p)
                    .filter(|(_, p)| **p == Param::Local)
                    .map(|(i, _)| i)
                    .collect(),
                None => program.native_locals.get(name).cloned().unwrap_or_default(),
            },
            arg_count: 0,
            required_group_size: [0; 3],
            local_mem: 0,
            max_threads: None,
            launching: Mutex::new(()),
        };
        // SAFETY: a kernel of ours; live out-structure.
        unsafe { self.ze.zeKernelGetProperties(kernel, &mut props)? };
        if let Some(p) = &params
            && p.len() != props.num_kernel_args as usize
        {
            return Err(Error::InvalidImage(format!(
                "kernel '{name}': the SPIR-V module gives it {} parameters, the driver {}",
                p.len(),
                props.num_kernel_args
            )));
        }
        k.arg_count = props.num_kernel_args;
        k.required_group_size = props.required_group_size;
        k.local_mem = props.local_mem_size;
        k.max_threads = Some(
            props
                .max_num_subgroups
                .saturating_mul(props.max_subgroup_size),
        )
        .filter(|n| *n > 0);
        let types = params.map(|p| p.iter().map(Param::param_type).collect());
        Ok((k, types))
    }

    fn check_launch(
        &self,
        kernel: &Kernel,
        name: &str,
        dims: &LaunchDims,
        args: &[KernelArg],
    ) -> Result<()> {
        if args.len() != kernel.arg_count as usize {
            return Err(Error::InvalidArgument(format!(
                "kernel '{name}' takes {} argument(s); the launch passes {}",
                kernel.arg_count,
                args.len()
            )));
        }
        if let Some(limit) = kernel.max_threads {
            offload_plugin_common::args::check_block(
                name,
                dims.block,
                limit,
                "its sub-groups: zeKernelGetProperties' maxNumSubgroups x maxSubgroupSize",
            )?;
        }
        let r = kernel.required_group_size;
        if r != [0; 3] && dims.block != r {
            return Err(Error::InvalidArgument(format!(
                "kernel '{name}' was compiled for work-groups of exactly {}x{}x{} \
                 (reqd_work_group_size); the launch asks for {}x{}x{}",
                r[0], r[1], r[2], dims.block[0], dims.block[1], dims.block[2]
            )));
        }
        if dims.shared_mem_bytes > 0 {
            return Err(Error::Unsupported(format!(
                "kernel '{name}': a Level Zero kernel gets work-group memory from its `__local` \
                 pointer parameters (the launch passes each one's size in bytes), not as the \
                 launch's dynamic shared memory ({} bytes asked for)",
                dims.shared_mem_bytes
            )));
        }
        // The layer's one layout and budget of work-group memory; the driver places the
        // `__local` arguments itself (no alignment here) and refuses a size of 0.
        offload_plugin_common::args::LocalMemory {
            name: "local memory",
            fixed: u64::from(kernel.local_mem),
            pointers: kernel.locals.iter().map(|&i| (i as usize, 1)).collect(),
            min_size: 1,
        }
        .check(name, 0, args, u64::from(self.max_shared), &self.info.name)
    }

    fn global(&self, program: &Program, name: &str) -> Result<GlobalSymbol> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("global name '{name}' contains NUL")))?;
        let (mut size, mut ptr) = (0usize, std::ptr::null_mut::<c_void>());
        // SAFETY: a module of ours; live name and out-pointers.
        unsafe {
            self.ze
                .zeModuleGetGlobalPointer(program.module.handle, c.as_ptr(), &mut size, &mut ptr)
        }
        .map_err(|e| e.context(format!("global '{name}' in the module")))?;
        Ok(GlobalSymbol {
            ptr: DevicePtr(ptr as u64),
            size: size as u64,
        })
    }

    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr> {
        let bytes = usize::try_from(size)
            .map_err(|_| Error::OutOfMemory(format!("{size} bytes cannot be allocated here")))?;
        if self.max_alloc > 0 && size > self.max_alloc {
            // The driver refuses it (ZE_RESULT_ERROR_UNSUPPORTED_SIZE) without saying why.
            return Err(Error::OutOfMemory(format!(
                "{} bytes in one allocation: {} allocates at most {} bytes at once \
                 (maxMemAllocSize); split the buffer",
                size, self.info.name, self.max_alloc
            )));
        }
        let device_desc = ze::DeviceMemAllocDesc {
            stype: ze::stype::DEVICE_MEM_ALLOC_DESC,
            next: std::ptr::null(),
            flags: 0,
            ordinal: 0,
        };
        let host_desc = ze::FlagsDesc {
            stype: ze::stype::HOST_MEM_ALLOC_DESC,
            next: std::ptr::null(),
            flags: 0,
        };
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: live descriptors and out-pointer; a context and device of ours; alignment 0
        // is the driver's default.
        unsafe {
            match kind {
                MemoryKind::Device => self.ze.zeMemAllocDevice(
                    self.context.handle,
                    &device_desc,
                    bytes,
                    0,
                    self.device,
                    &mut p,
                )?,
                MemoryKind::Host => {
                    self.ze
                        .zeMemAllocHost(self.context.handle, &host_desc, bytes, 0, &mut p)?
                }
                MemoryKind::Shared => self.ze.zeMemAllocShared(
                    self.context.handle,
                    &device_desc,
                    &host_desc,
                    bytes,
                    0,
                    self.device,
                    &mut p,
                )?,
            }
        };
        Ok(DevicePtr(p as u64))
    }

    fn free(&self, ptr: DevicePtr, _size: u64, _kind: MemoryKind) {
        // SAFETY: an allocation of this context, freed once, after the last operation using
        // it completed.
        let _ = unsafe { self.ze.zeMemFree(self.context.handle, ptr.0 as *mut c_void) };
    }

    fn locks_regions(&self) -> bool {
        // The queues order the GPU's work; see the trait.
        false
    }

    fn strict_pointers(&self) -> bool {
        // Memory of another runtime in the process is the caller's to pass; see the trait.
        false
    }

    fn stream_create(&self) -> Result<Stream> {
        self.new_stream()
    }

    fn stream_ordered(&self) -> bool {
        true
    }

    fn sync_stream(&self, stream: &Stream) -> Result<()> {
        stream.drain()
    }

    fn execute(&self, op: Op<'_, Self>, stream: Option<&Stream>) -> Result<()> {
        let own;
        let (stream, wait) = match stream {
            Some(s) => (s, false),
            None => {
                own = {
                    let mut slot = offload_core::sync::lock(&self.own);
                    match &*slot {
                        Some(s) => s.clone(),
                        None => {
                            let s = Arc::new(self.new_stream()?);
                            *slot = Some(s.clone());
                            s
                        }
                    }
                };
                (&*own, true)
            }
        };
        // A copy to the host drains the stream itself (`copy_to_host`).
        let drained = matches!(op, Op::CopyFromDevice { .. });
        self.append(op, stream)?;
        if wait && !drained {
            stream.drain()
        } else {
            Ok(())
        }
    }
}

impl ZeDevice {
    /// Copies `len` bytes from device memory `src` to `host`, after the stream's earlier work:
    /// through a host allocation ([`offload_plugin_common::staging`]), each chunk appended,
    /// drained and copied out by the CPU. The program has `host` back when the call returns,
    /// settled or not (a `&mut [T]` it lent, a host allocation of its own too), so the copy
    /// engine never writes it.
    fn copy_to_host(
        &self,
        stream: &Stream,
        host: *mut u8,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        let fill = |at: *mut u8, offset: usize, n: usize| {
            // SAFETY: the staging allocation holds `n` bytes; the source range lies in device
            // memory the layer keeps until the copy has run, and is drained at once.
            unsafe {
                stream.append_copy(
                    "copy from the device",
                    at.cast(),
                    (src.0 + offset as u64) as *const c_void,
                    n,
                )
            }?;
            stream.drain()
        };
        // SAFETY: `host` is writable for `len` bytes (the copy's contract).
        unsafe { offload_plugin_common::staging::copy_to_host_via(self, host, len, fill) }
    }

    /// Appends `op` to `stream`'s list; a copy to the host is staged and drained
    /// ([`ZeDevice::copy_to_host`]).
    fn append(&self, op: Op<'_, Self>, stream: &Stream) -> Result<()> {
        let ze = &self.ze;
        match op {
            // SAFETY: both ranges are valid for `len` bytes until the list has run (the layer
            // keeps them until the stream is drained).
            Op::CopyToDevice { dst, src, len } => unsafe {
                stream.append_copy(
                    "copy to the device",
                    dst.0 as *mut c_void,
                    src.0.cast_const().cast(),
                    len,
                )
            },
            Op::CopyFromDevice { dst, src, len } => self.copy_to_host(stream, dst.0, src, len),
            Op::CopyDeviceToDevice { dst, src, len } => {
                let len = usize::try_from(len).map_err(|_| {
                    Error::InvalidArgument(format!("{len} bytes cannot be copied here"))
                })?;
                // SAFETY: as above; the layer hands over disjoint ranges.
                unsafe {
                    stream.append_copy(
                        "device copy",
                        dst.0 as *mut c_void,
                        src.0 as *const c_void,
                        len,
                    )
                }
            }
            Op::Launch {
                kernel,
                dims,
                args,
                name,
                ..
            } => {
                stream.append(&format!("kernel '{name}'"), |list| {
                    // The kernel's lock inside the list's: a launch waiting for a busy list
                    // keeps no other list from launching the kernel.
                    let _launching = offload_core::sync::lock(&kernel.launching);
                    // SAFETY: a kernel of ours, under its lock; every value lives until the
                    // append, which captures the arguments.
                    unsafe {
                        ze.zeKernelSetGroupSize(
                            kernel.kernel,
                            dims.block[0],
                            dims.block[1],
                            dims.block[2],
                        )?;
                        for (i, a) in args.iter().enumerate() {
                            if kernel.locals.contains(&(i as u32)) {
                                // A `__local` pointer: its size, no value.
                                let size = a.integer().unwrap_or(0) as usize;
                                ze.zeKernelSetArgumentValue(
                                    kernel.kernel,
                                    i as u32,
                                    size,
                                    std::ptr::null(),
                                )?;
                            } else {
                                let (size, bits) = (a.size(), a.to_bits().1);
                                let bytes = bits.to_le_bytes();
                                ze.zeKernelSetArgumentValue(
                                    kernel.kernel,
                                    i as u32,
                                    size,
                                    bytes.as_ptr().cast(),
                                )?;
                            }
                        }
                        ze.zeCommandListAppendLaunchKernel(
                            list,
                            kernel.kernel,
                            &dims.grid,
                            std::ptr::null_mut(),
                            0,
                            std::ptr::null_mut(),
                        )
                    }
                })
            }
        }
    }
}
