//! One CUDA device: the hooks the generic device layer calls. The device's primary context is
//! made current on every thread that calls in ([`DeviceBackend::enter`]). A queue's operations
//! are only put on its stream; the layer keeps what they use until the stream has been
//! synchronized after them (`stream_ordered`, `sync_stream`); every other operation runs on the
//! default stream and is waited for. So memory the layer keeps alive for an operation is never
//! freed while the GPU still uses it.

use crate::driver::{Driver, INVALID_VALUE, attribute, function_attribute, jit_option};
use crate::sm::{Sm, cubin_sm, ptx_target};
use crate::{TRIPLE, fatbin};
use cudarc::driver::sys::{CUcontext, CUdevice, CUdeviceptr, CUfunction, CUmodule, CUstream};
use offload_core::image::ImageKind;
use offload_core::jit::{JitTarget, ParamType, PostProcess};
use offload_core::{
    DeviceInfo, DeviceLimits, DevicePtr, Error, GlobalSymbol, KernelArg, LaunchDims, MemoryKind,
    Result,
};
use offload_jit_client::ptxas::Ptxas;
use offload_plugin_common::{DeviceBackend, Fit, Op, args};
use std::ffi::{CString, c_int, c_void};
use std::sync::{Arc, Mutex};

/// `CU_STREAM_NON_BLOCKING`
const STREAM_NON_BLOCKING: u32 = 1;
/// `CU_MEM_ATTACH_GLOBAL`
const MEM_ATTACH_GLOBAL: u32 = 1;
/// The newest SM LLVM 19's NVPTX back end knows; newer devices get PTX for it, which ptxas or
/// the driver turn into code for the device.
const NEWEST_LLVM_SM: u32 = 90;

/// A loaded module.
#[derive(Debug)]
pub struct Module {
    module: CUmodule,
    driver: Arc<Driver>,
    ctx: CUcontext,
    /// The PTX or cubin it was loaded from, to read parameter sizes from when the driver
    /// cannot say them; `None` for a compressed fat binary, which only the driver unpacks.
    source: Option<Source>,
}

/// What a module was loaded from.
#[derive(Debug)]
enum Source {
    Ptx(Vec<u8>),
    Cubin(Vec<u8>),
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module was loaded in `ctx`, which the device keeps alive; it is unloaded
        // once, after the last launch that uses it has run (the layer holds it until then).
        unsafe {
            let _ = self.driver.cuCtxSetCurrent(self.ctx);
            let _ = self.driver.cuModuleUnload(self.module);
        }
    }
}

/// A kernel of a module, with the sizes of its parameters (from the driver,
/// `cuFuncGetParamInfo`, CUDA 12.4 on; else from the image) and its own limits.
#[derive(Debug)]
pub struct Function {
    f: CUfunction,
    /// `None`: neither the driver nor the image says; launches are refused.
    param_sizes: Option<Vec<usize>>,
    /// `CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`: what its registers allow.
    max_threads: u32,
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`: its static shared memory.
    static_shared: u32,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` as it is now; only ever raised (two
    /// queues launching with different sizes must not lower it under each other).
    dynamic_limit: std::sync::Mutex<u32>,
}

impl Function {
    fn attribute(driver: &Driver, f: CUfunction, attribute: c_int) -> Result<u32> {
        let mut v: c_int = 0;
        // SAFETY: a function of a loaded module; live out-pointer.
        unsafe { driver.cuFuncGetAttribute(&mut v, attribute, f)? };
        Ok(v.max(0) as u32)
    }
}

/// The most parameters a kernel can have (4 KiB of parameter space, or 32 KiB from CUDA 12.1,
/// of at least one byte each); asking further stops there.
const MAX_PARAMS: usize = 32 << 10;

/// The sizes of a kernel's parameters, or `None` when the driver cannot say.
fn param_sizes(driver: &Driver, f: CUfunction) -> Option<Vec<usize>> {
    let mut sizes = Vec::new();
    for index in 0..MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a function of a loaded module; live out-pointers.
        match unsafe { driver.cuFuncGetParamInfo(f, index, &mut offset, &mut size) } {
            Ok(()) => sizes.push(size),
            // Past the last parameter.
            Err(Error::Driver { code, .. }) if code == i64::from(INVALID_VALUE) => {
                return Some(sizes);
            }
            // An older driver, or one that cannot say: the image may (`params.rs`).
            Err(_) => return None,
        }
    }
    None
}

/// A queue's stream.
#[derive(Debug)]
pub struct Stream {
    stream: CUstream,
    driver: Arc<Driver>,
    ctx: CUcontext,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: the stream belongs to `ctx` and is destroyed once, after its queue drained.
        unsafe {
            let _ = self.driver.cuCtxSetCurrent(self.ctx);
            let _ = self.driver.cuStreamDestroy_v2(self.stream);
        }
    }
}

// SAFETY: driver handles (of the three types above) may be used from any thread once the
// right context is current, which the layer ensures (`enter`) before every hook and the drops
// do themselves.
unsafe impl Send for Module {}
// SAFETY: see above.
unsafe impl Sync for Module {}
// SAFETY: see above.
unsafe impl Send for Function {}
// SAFETY: see above.
unsafe impl Sync for Function {}
// SAFETY: see above.
unsafe impl Send for Stream {}
// SAFETY: see above.
unsafe impl Sync for Stream {}

/// See the module docs.
#[derive(Debug)]
pub struct CudaDevice {
    driver: Arc<Driver>,
    ctx: CUcontext,
    sm: Sm,
    info: DeviceInfo,
    /// Shared memory a block may have once its kernel opts in (227 KiB on an H200).
    shared_optin: u32,
    ptxas: Option<Ptxas>,
    /// This device's pinned and managed allocations, start to length: the driver copies to
    /// them asynchronously (a copy to pageable memory completes before the call returns), so
    /// a copy to the host that lands in one is staged ([`CudaDevice::copy_to_pinned`]).
    pinned: Mutex<std::collections::BTreeMap<usize, usize>>,
}

// SAFETY: the context handle may be made current on any thread.
unsafe impl Send for CudaDevice {}
// SAFETY: see `Send`.
unsafe impl Sync for CudaDevice {}

impl CudaDevice {
    /// Opens device `ordinal`: its attributes and its primary context.
    pub fn open(driver: Arc<Driver>, ordinal: usize, ptxas: Option<Ptxas>) -> Result<Self> {
        let mut device: CUdevice = 0;
        // SAFETY: out-pointers are live locals; the ordinal is below the device count.
        unsafe { driver.cuDeviceGet(&mut device, ordinal as c_int)? };
        let attr = |a: i32| -> Result<u32> {
            let mut v: c_int = 0;
            // SAFETY: live out-pointer, valid device.
            unsafe { driver.cuDeviceGetAttribute(&mut v, a, device)? };
            Ok(v.max(0) as u32)
        };
        let sm = Sm::device(
            attr(attribute::COMPUTE_CAPABILITY_MAJOR)?,
            attr(attribute::COMPUTE_CAPABILITY_MINOR)?,
        );
        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer holds 256 bytes; the driver NUL-terminates within them.
        unsafe { driver.cuDeviceGetName(name.as_mut_ptr(), 256, device)? };
        // SAFETY: NUL-terminated by the driver.
        let name = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut memory = 0usize;
        // SAFETY: live out-pointer.
        unsafe { driver.cuDeviceTotalMem_v2(&mut memory, device)? };
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: live out-pointer; the primary context lives as long as the process here (the
        // plugin is never unloaded).
        unsafe { driver.cuDevicePrimaryCtxRetain(&mut ctx, device)? };
        let info = DeviceInfo {
            name,
            compute_unit_kind: sm.to_string(),
            target_features: String::new(),
            total_memory: memory as u64,
            compute_units: attr(attribute::MULTIPROCESSOR_COUNT)?,
            limits: DeviceLimits {
                max_grid: [
                    attr(attribute::MAX_GRID_DIM_X)?,
                    attr(attribute::MAX_GRID_DIM_X + 1)?,
                    attr(attribute::MAX_GRID_DIM_X + 2)?,
                ],
                max_block: [
                    attr(attribute::MAX_BLOCK_DIM_X)?,
                    attr(attribute::MAX_BLOCK_DIM_X + 1)?,
                    attr(attribute::MAX_BLOCK_DIM_X + 2)?,
                ],
                max_threads_per_block: attr(attribute::MAX_THREADS_PER_BLOCK)?,
                warp_size: attr(attribute::WARP_SIZE)?,
            },
        };
        // Drivers that do not know the opt-in attribute answer 0: the plain limit then.
        let shared_optin = match attr(attribute::MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)? {
            0 => attr(attribute::MAX_SHARED_MEMORY_PER_BLOCK)?,
            n => n,
        };
        Ok(CudaDevice {
            driver,
            ctx,
            sm,
            info,
            shared_optin,
            ptxas,
            pinned: Mutex::default(),
        })
    }

    /// The device's architecture.
    pub fn sm(&self) -> Sm {
        self.sm
    }

    fn module(&self, module: CUmodule, source: Option<Source>) -> Module {
        Module {
            module,
            driver: self.driver.clone(),
            ctx: self.ctx,
            source,
        }
    }

    /// Loads PTX through the driver's JIT, with its error log in the error.
    fn load_ptx(&self, ptx: &[u8]) -> Result<Module> {
        let mut text = Vec::with_capacity(ptx.len() + 1);
        text.extend_from_slice(ptx);
        text.push(0);
        let mut error_log = vec![0u8; 16 << 10];
        let mut info_log = vec![0u8; 4 << 10];
        let mut options = [
            jit_option::ERROR_LOG_BUFFER,
            jit_option::ERROR_LOG_BUFFER_SIZE_BYTES,
            jit_option::INFO_LOG_BUFFER,
            jit_option::INFO_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut c_void; 4] = [
            error_log.as_mut_ptr().cast(),
            error_log.len() as *mut c_void,
            info_log.as_mut_ptr().cast(),
            info_log.len() as *mut c_void,
        ];
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `text` is NUL-terminated PTX; the log buffers outlive the call and their
        // sizes are passed by value as the API wants.
        let loaded = unsafe {
            self.driver.cuModuleLoadDataEx(
                &mut module,
                text.as_ptr().cast(),
                options.len() as u32,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        match loaded {
            Ok(()) => Ok(self.module(module, Some(Source::Ptx(ptx.to_vec())))),
            Err(e) => {
                let end = error_log
                    .iter()
                    .position(|&b| b == 0)
                    .unwrap_or(error_log.len());
                let log = String::from_utf8_lossy(&error_log[..end])
                    .trim()
                    .replace('\n', " | ");
                Err(if log.is_empty() {
                    e
                } else {
                    e.context(format!("the driver's PTX compiler said: {log}"))
                })
            }
        }
    }

    fn load_cubin(&self, cubin: &[u8]) -> Result<Module> {
        let mut module: CUmodule = std::ptr::null_mut();
        // An entry of a container need not be 8-byte aligned; NVIDIA's tools always align
        // cubins, and what the driver does with one that is not is not documented.
        let aligned = offload_core::image::Aligned::new(cubin);
        // SAFETY: a checked cubin, live for the call (the driver copies it).
        unsafe {
            self.driver
                .cuModuleLoadData(&mut module, aligned.bytes().as_ptr().cast())?
        };
        Ok(self.module(module, Some(Source::Cubin(cubin.to_vec()))))
    }

    /// Raises the kernel's dynamic shared memory limit to the most the device allows when a
    /// launch needs more than it is now (the default is 48 KiB less the static size): the
    /// attribute only ever goes up, and is set once.
    fn allow_dynamic_shared(&self, kernel: &Function, name: &str, bytes: u32) -> Result<()> {
        let mut limit = offload_core::sync::lock(&kernel.dynamic_limit);
        if bytes <= *limit {
            return Ok(());
        }
        let most = self.shared_optin.saturating_sub(kernel.static_shared);
        // SAFETY: a function of a loaded module.
        unsafe {
            self.driver.cuFuncSetAttribute(
                kernel.f,
                function_attribute::MAX_DYNAMIC_SHARED_SIZE_BYTES,
                c_int::try_from(most).unwrap_or(c_int::MAX),
            )
        }
        .map_err(|e| {
            e.context(format!(
                "'{name}' with {bytes} bytes of dynamic shared memory"
            ))
        })?;
        *limit = most;
        Ok(())
    }

    /// Waits for `stream`. A failure is settled when it is a fault that ends the context's
    /// work (a sticky error: [`Error::DeviceFailure`]); any other (an invalid handle or context,
    /// a driver that gave up) says nothing of whether the work ended, so it is
    /// [`Error::Unsettled`] and the layer keeps what the work uses (the layer's `health`).
    fn sync(&self, stream: CUstream) -> Result<()> {
        // SAFETY: a stream of this context (or the default stream).
        unsafe { self.driver.cuStreamSynchronize(stream) }.map_err(Error::of_a_wait)
    }

    /// Whether `start..start+len` lies in one pinned or managed allocation of this device.
    fn is_pinned(&self, start: usize, len: usize) -> bool {
        let pinned = offload_core::sync::lock(&self.pinned);
        pinned
            .range(..=start)
            .next_back()
            .is_some_and(|(&at, &bytes)| start.saturating_add(len) <= at.saturating_add(bytes))
    }

    /// Copies `len` bytes from device memory `src` to `host`, pinned or managed memory of
    /// this device that the program has as a slice, on `stream` after its earlier work:
    /// through a pinned staging buffer ([`offload_plugin_common::staging`]), each chunk
    /// copied, waited for and copied out by the CPU, so that a copy whose wait gives up never
    /// writes memory the program has back.
    fn copy_to_pinned(
        &self,
        stream: CUstream,
        host: *mut u8,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        let fill = |at: *mut u8, offset: usize, n: usize| {
            // SAFETY: the staging buffer holds `n` bytes; the source range lies in a live
            // allocation of this device (layer check); waited for at once.
            unsafe {
                self.driver
                    .cuMemcpyDtoHAsync_v2(at.cast(), src.0 + offset as u64, n, stream)?
            };
            self.sync(stream)
        };
        // SAFETY: `host` is writable for `len` bytes (the copy's contract).
        unsafe { offload_plugin_common::staging::copy_to_host_via(self, host, len, fill) }
    }
}

impl DeviceBackend for CudaDevice {
    type Program = Module;
    type Kernel = Function;
    type Stream = Stream;

    fn info(&self) -> Result<DeviceInfo> {
        Ok(self.info.clone())
    }

    fn enter(&self) -> Result<()> {
        // SAFETY: the device's primary context, retained for the life of the process.
        unsafe { self.driver.cuCtxSetCurrent(self.ctx) }
    }

    fn jit_target(&self) -> Option<(JitTarget, PostProcess)> {
        let cpu = if self.sm.number() > NEWEST_LLVM_SM {
            format!("sm_{NEWEST_LLVM_SM}")
        } else {
            self.sm.to_string()
        };
        let post = PostProcess::for_target(
            TRIPLE,
            &self.sm.to_string(),
            self.ptxas
                .as_ref()
                .map(|p| (p.path.as_str(), p.version.as_str())),
        );
        Some((
            JitTarget {
                triple: TRIPLE.into(),
                cpu,
                features: String::new(),
            },
            post,
        ))
    }

    fn fits(&self, arch: &str) -> Fit {
        match Sm::parse(arch) {
            Some(sm) if sm.number() == self.sm.number() => Fit::Exact,
            Some(sm) if sm.cubin_runs_on(self.sm).is_ok() || sm.ptx_runs_on(self.sm).is_ok() => {
                Fit::Compatible
            }
            Some(sm) => Fit::No(format!("built for {sm}, this device is {}", self.sm)),
            None if arch.is_empty() => Fit::Compatible,
            None => Fit::No(format!("'{arch}' is not an SM architecture")),
        }
    }

    fn check_native(&self, image: &[u8], kind: &ImageKind) -> Result<()> {
        match kind {
            ImageKind::Elf(_) => cubin_sm(image)?.cubin_runs_on(self.sm),
            ImageKind::Ptx => ptx_target(image)?.ptx_runs_on(self.sm),
            ImageKind::CudaFatbin => fatbin::select(&fatbin::entries(image)?, self.sm).map(|_| ()),
            other => Err(Error::InvalidImage(format!(
                "a {} is not a CUDA image",
                other.describe()
            ))),
        }
    }

    fn load(&self, image: &[u8], kind: &ImageKind) -> Result<Module> {
        self.check_native(image, kind)?;
        match kind {
            ImageKind::Elf(_) => self.load_cubin(image),
            ImageKind::Ptx => self.load_ptx(image),
            ImageKind::CudaFatbin => {
                let entries = fatbin::entries(image)?;
                let chosen = fatbin::select(&entries, self.sm)?;
                match (chosen.kind, chosen.compressed) {
                    (_, true) => {
                        // Only the driver unpacks compressed entries; it picks the same way,
                        // among the entries of the fat binary it is given: the one holding the
                        // chosen entry (of several concatenated, it would read the first).
                        let mut module: CUmodule = std::ptr::null_mut();
                        let aligned =
                            offload_core::image::Aligned::new(&image[chosen.container.clone()]);
                        // SAFETY: a parsed fat binary, live for the call.
                        unsafe {
                            self.driver.cuModuleLoadFatBinary(
                                &mut module,
                                aligned.bytes().as_ptr().cast(),
                            )?
                        };
                        Ok(self.module(module, None))
                    }
                    (fatbin::EntryKind::Cubin, false) => self.load_cubin(chosen.payload),
                    _ => self.load_ptx(chosen.payload),
                }
            }
            other => Err(Error::InvalidImage(format!(
                "a {} is not a CUDA image",
                other.describe()
            ))),
        }
    }

    fn kernel(&self, module: &Module, name: &str) -> Result<(Function, Option<Vec<ParamType>>)> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("kernel name '{name}' contains NUL")))?;
        let mut f: CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module of this context; live out-pointer and name.
        unsafe {
            self.driver
                .cuModuleGetFunction(&mut f, module.module, c.as_ptr())
        }
        .map_err(|e| e.context(format!("kernel '{name}' in the module")))?;
        let param_sizes = param_sizes(&self.driver, f).or_else(|| match &module.source {
            Some(Source::Ptx(ptx)) => crate::params::from_ptx(ptx, name),
            Some(Source::Cubin(cubin)) => crate::params::from_cubin(cubin, name),
            None => None,
        });
        let static_shared =
            Function::attribute(&self.driver, f, function_attribute::SHARED_SIZE_BYTES)?;
        Ok((
            Function {
                f,
                param_sizes,
                max_threads: Function::attribute(
                    &self.driver,
                    f,
                    function_attribute::MAX_THREADS_PER_BLOCK,
                )?,
                static_shared,
                dynamic_limit: std::sync::Mutex::new(Function::attribute(
                    &self.driver,
                    f,
                    function_attribute::MAX_DYNAMIC_SHARED_SIZE_BYTES,
                )?),
            },
            None,
        ))
    }

    fn check_launch(
        &self,
        kernel: &Function,
        name: &str,
        dims: &LaunchDims,
        args: &[KernelArg],
    ) -> Result<()> {
        let Some(sizes) = &kernel.param_sizes else {
            // The driver reads one value per parameter of the kernel through the pointers it
            // is given: without the count it could read past them.
            return Err(Error::Unsupported(format!(
                "kernel '{name}': this CUDA driver cannot say its parameters (cuFuncGetParamInfo \
                 needs CUDA 12.4) and its image does not either (a compressed fat binary entry): \
                 it cannot be launched safely; use a newer driver, or an uncompressed cubin or PTX"
            )));
        };
        args::check_sizes(name, sizes, args)?;
        args::check_block(
            name,
            dims.block,
            kernel.max_threads,
            "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, from its registers",
        )?;
        // The layer's one budget of work-group memory: a CUDA kernel has no `__local`
        // arguments, only its static and the launch's dynamic shared memory.
        args::LocalMemory {
            name: "shared memory",
            fixed: u64::from(kernel.static_shared),
            pointers: Vec::new(),
            min_size: 0,
        }
        .check(
            name,
            u64::from(dims.shared_mem_bytes),
            args,
            u64::from(self.shared_optin),
            &self.info.name,
        )
    }

    fn global(&self, module: &Module, name: &str) -> Result<GlobalSymbol> {
        let c = CString::new(name)
            .map_err(|_| Error::InvalidArgument(format!("global name '{name}' contains NUL")))?;
        let (mut ptr, mut size): (CUdeviceptr, usize) = (0, 0);
        // SAFETY: a loaded module; live out-pointers and name.
        unsafe {
            self.driver
                .cuModuleGetGlobal_v2(&mut ptr, &mut size, module.module, c.as_ptr())
        }
        .map_err(|e| e.context(format!("global '{name}' in the module")))?;
        Ok(GlobalSymbol {
            ptr: DevicePtr(ptr),
            size: size as u64,
        })
    }

    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr> {
        let bytes = usize::try_from(size)
            .map_err(|_| Error::OutOfMemory(format!("{size} bytes cannot be allocated here")))?;
        match kind {
            MemoryKind::Device => {
                let mut p: CUdeviceptr = 0;
                // SAFETY: live out-pointer; the context is current (`enter`).
                unsafe { self.driver.cuMemAlloc_v2(&mut p, bytes)? };
                Ok(DevicePtr(p))
            }
            MemoryKind::Host => {
                let mut p: *mut c_void = std::ptr::null_mut();
                // SAFETY: as above; pinned host memory is addressable by the device (UVA).
                unsafe { self.driver.cuMemAllocHost_v2(&mut p, bytes)? };
                offload_core::sync::lock(&self.pinned).insert(p as usize, bytes);
                Ok(DevicePtr(p as u64))
            }
            MemoryKind::Shared => {
                let mut p: CUdeviceptr = 0;
                // SAFETY: as above.
                unsafe {
                    self.driver
                        .cuMemAllocManaged(&mut p, bytes, MEM_ATTACH_GLOBAL)?
                };
                offload_core::sync::lock(&self.pinned).insert(p as usize, bytes);
                Ok(DevicePtr(p))
            }
        }
    }

    fn free(&self, ptr: DevicePtr, _size: u64, kind: MemoryKind) {
        if kind != MemoryKind::Device {
            offload_core::sync::lock(&self.pinned).remove(&(ptr.0 as usize));
        }
        // SAFETY: an allocation of this kind made by `alloc`, freed once, after the last
        // operation using it has completed (the layer releases it after the stream's drain).
        let _ = unsafe {
            match kind {
                MemoryKind::Host => self.driver.cuMemFreeHost(ptr.0 as *mut c_void),
                MemoryKind::Device | MemoryKind::Shared => self.driver.cuMemFree_v2(ptr.0),
            }
        };
    }

    fn locks_regions(&self) -> bool {
        // Streams order the GPU's work; see the trait.
        false
    }

    fn stream_ordered(&self) -> bool {
        true
    }

    fn sync_stream(&self, stream: &Stream) -> Result<()> {
        self.sync(stream.stream)
    }

    fn strict_pointers(&self) -> bool {
        // Memory of another runtime in the process is the caller's to pass; see the trait.
        false
    }

    fn stream_create(&self) -> Result<Stream> {
        let mut stream: CUstream = std::ptr::null_mut();
        // SAFETY: live out-pointer; the context is current.
        unsafe {
            self.driver
                .cuStreamCreate(&mut stream, STREAM_NON_BLOCKING)?
        };
        Ok(Stream {
            stream,
            driver: self.driver.clone(),
            ctx: self.ctx,
        })
    }

    fn execute(&self, op: Op<'_, Self>, stream: Option<&Stream>) -> Result<()> {
        let s: CUstream = stream.map_or(std::ptr::null_mut(), |s| s.stream);
        // Each operation is put on the stream. A queue's operation is left to run there (the
        // layer keeps what it uses until `sync_stream`: `stream_ordered`); any other is waited
        // for, on the default stream.
        match op {
            Op::CopyToDevice { dst, src, len } => {
                // SAFETY: the range lies in a live allocation of this device (layer check), the
                // host pointer is valid for `len` bytes (copy contract), and the call is waited
                // for below.
                unsafe {
                    self.driver
                        .cuMemcpyHtoDAsync_v2(dst.0, src.0 as *const c_void, len, s)?
                };
            }
            Op::CopyFromDevice { dst, src, len } if self.is_pinned(dst.0 as usize, len) => {
                return self.copy_to_pinned(s, dst.0, src, len);
            }
            Op::CopyFromDevice { dst, src, len } => {
                // SAFETY: as above; to pageable memory the driver completes the copy before
                // the call returns, so a later failed wait cannot leave it writing.
                unsafe {
                    self.driver
                        .cuMemcpyDtoHAsync_v2(dst.0.cast(), src.0, len, s)?
                };
            }
            Op::CopyDeviceToDevice { dst, src, len } => {
                // SAFETY: both ranges lie in live allocations of this device.
                unsafe {
                    self.driver
                        .cuMemcpyDtoDAsync_v2(dst.0, src.0, len as usize, s)?
                };
            }
            Op::Launch {
                kernel,
                dims,
                args,
                name,
                ..
            } => {
                // The driver reads each parameter through a pointer to its value, with the size
                // the kernel declares (the count and each size checked against the arguments in
                // `check_launch`): 4 or 8 bytes, little-endian, from these slots.
                let mut slots: Vec<u64> = args.iter().map(|a| a.to_bits().1).collect();
                let mut params: Vec<*mut c_void> =
                    slots.iter_mut().map(|s| (s as *mut u64).cast()).collect();
                self.allow_dynamic_shared(kernel, name, dims.shared_mem_bytes)?;
                // SAFETY: a function of a module the layer keeps loaded; `params` points into
                // `slots`, which outlive the call; the shape was checked against the device's
                // limits by the ABI layer.
                unsafe {
                    self.driver.cuLaunchKernel(
                        kernel.f,
                        dims.grid[0],
                        dims.grid[1],
                        dims.grid[2],
                        dims.block[0],
                        dims.block[1],
                        dims.block[2],
                        dims.shared_mem_bytes,
                        s,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
                .map_err(|e| e.context(format!("launching '{name}'")))?;
            }
        }
        match stream {
            Some(_) => Ok(()),
            None => self.sync(s),
        }
    }
}
