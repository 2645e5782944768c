//! One host device: the hooks the generic device layer calls (`plugin_common::DeviceBackend`).
//! Handles, memory tracking, queues, events, argument checks and the JIT are the layer's.

use crate::launch::PreparedCall;
use crate::pool::Pool;
use crate::program::Program;
use offload_core::image::ImageKind;
use offload_core::jit::{JitTarget, ParamType, PostProcess};
use offload_core::{DeviceInfo, DeviceLimits, DevicePtr, Error, GlobalSymbol, MemoryKind, Result};
use offload_plugin_common::{DeviceBackend, Fit, Op};
use std::alloc::Layout;
use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Alignment of every allocation (matches what GPU allocators give).
const ALIGN: usize = 256;

/// A kernel: an exported function of a loaded image.
#[derive(Debug)]
pub struct HostKernel {
    func: *mut c_void,
    /// The JIT's work-group function for this kernel, if the image has one.
    work_group: Option<crate::launch::WorkGroup>,
}

// SAFETY: `func` is a code address inside a program that the generic layer keeps loaded while
// the kernel exists; calling it from any thread is what the host backend does.
unsafe impl Send for HostKernel {}
// SAFETY: see `Send`.
unsafe impl Sync for HostKernel {}

#[derive(Debug)]
pub struct HostDevice {
    index: usize,
    pool: Arc<Pool>,
    threads: u32,
    allocated: AtomicU64,
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Allocations of at least this size are mappings of their own on 2 MiB boundaries, marked for
/// transparent huge pages (Debian's default is `madvise`): a streaming kernel over 16M floats
/// ran 22% faster on them (5.4 against 4.2 ms, one thread; a 512th of the TLB misses and page
/// faults), which is where PoCL's buffers were ahead.
const HUGE_PAGE: usize = 2 << 20;

/// `size` bytes of zeroed memory on huge-page boundaries (null if the system refuses).
fn map_huge(size: usize) -> *mut u8 {
    let Some(len) = size.checked_next_multiple_of(HUGE_PAGE) else {
        return std::ptr::null_mut();
    };
    let Some(span) = len.checked_add(HUGE_PAGE) else {
        return std::ptr::null_mut();
    };
    // SAFETY: a new private anonymous mapping; nothing else is touched.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let start = (base as usize).next_multiple_of(HUGE_PAGE);
    let head = start - base as usize;
    // SAFETY: the parts before `start` and after `start + len` are ours and unused; a huge-page
    // hint that the kernel does not take (THP off) changes nothing.
    unsafe {
        if head > 0 {
            libc::munmap(base, head);
        }
        if span - head > len {
            libc::munmap((start + len) as *mut libc::c_void, span - head - len);
        }
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
    }
    start as *mut u8
}

fn layout(size: u64) -> Result<Layout> {
    usize::try_from(size)
        .ok()
        .and_then(|s| Layout::from_size_align(s, ALIGN).ok())
        .ok_or_else(|| Error::OutOfMemory(format!("{size} bytes cannot be allocated here")))
}

impl HostDevice {
    pub fn new(index: usize, pool: Arc<Pool>, threads: u32) -> Self {
        HostDevice {
            index,
            pool,
            threads,
            allocated: AtomicU64::new(0),
        }
    }
}

impl DeviceBackend for HostDevice {
    type Program = Program;
    type Kernel = HostKernel;
    type Stream = ();

    fn info(&self) -> Result<DeviceInfo> {
        let target = crate::HostJit::target();
        Ok(DeviceInfo {
            name: format!("{} (host, {} worker threads)", cpu_model(), self.threads),
            compute_unit_kind: target.cpu,
            target_features: target.features,
            total_memory: offload_core::fs::physical_memory(),
            compute_units: self.threads,
            limits: DeviceLimits {
                max_grid: [i32::MAX as u32, 65535, 65535],
                max_block: [1024, 1024, 64],
                max_threads_per_block: 1024,
                warp_size: 1,
            },
        })
    }

    fn jit_target(&self) -> Option<(JitTarget, PostProcess)> {
        let target = crate::HostJit::target();
        let post = PostProcess::for_target(&target.triple, &target.cpu, None);
        Some((target, post))
    }

    fn fits(&self, arch: &str) -> Fit {
        // Code for a named CPU may use instructions this one lacks; generic builds run.
        match arch {
            "" | "generic" | "x86-64" | "aarch64" | "armv8-a" => Fit::Compatible,
            other => Fit::No(format!(
                "built for CPU '{other}', this host is '{}'",
                crate::HostJit::target().cpu
            )),
        }
    }

    fn check_native(&self, _image: &[u8], _kind: &ImageKind) -> Result<()> {
        // Any image that runs on this machine runs on every host device: the plugin's
        // `check_native`, which the layer runs first, has checked all there is.
        Ok(())
    }

    fn load(&self, image: &[u8], kind: &ImageKind) -> Result<Program> {
        let (parsed, _layout, has_context) = crate::check_image(image, kind)?;
        Program::load(image, parsed, has_context)
    }

    fn kernel(&self, p: &Program, name: &str) -> Result<(HostKernel, Option<Vec<ParamType>>)> {
        if name.starts_with("__offload") {
            return Err(Error::NotFound(format!(
                "'{name}' is not a kernel: names starting with __offload are reserved for what \
                 the header and the JIT add to images"
            )));
        }
        let is_function = p.image.symbol(name).map(|s| s.is_function);
        match (is_function, p.symbol(name)) {
            (Some(true), Some(func)) => Ok((
                HostKernel {
                    func,
                    work_group: p.work_group(name),
                },
                p.signature(name)?,
            )),
            (Some(false), _) => Err(Error::NotFound(format!(
                "kernel '{name}': the image exports '{name}' as data, not a function"
            ))),
            _ => {
                let mut names = p.image.function_names();
                names.sort_unstable();
                Err(Error::NotFound(format!(
                    "kernel '{name}' is not exported by the image; exported functions: {}",
                    if names.is_empty() {
                        "(none)".to_string()
                    } else {
                        names.join(", ")
                    }
                )))
            }
        }
    }

    fn global(&self, p: &Program, name: &str) -> Result<GlobalSymbol> {
        match (p.image.symbol(name), p.symbol(name)) {
            (Some(s), Some(addr)) if !s.is_function => Ok(GlobalSymbol {
                ptr: DevicePtr(addr as u64),
                size: s.size,
            }),
            _ => Err(Error::NotFound(format!(
                "global '{name}' is not exported by the image"
            ))),
        }
    }

    fn alloc(&self, size: u64, _kind: MemoryKind) -> Result<DevicePtr> {
        // Host, device and shared memory are all the same memory here.
        let limit = offload_core::fs::physical_memory();
        let before = self.allocated.fetch_add(size, Ordering::SeqCst);
        if before.saturating_add(size) > limit {
            self.allocated.fetch_sub(size, Ordering::SeqCst);
            return Err(Error::OutOfMemory(format!(
                "host device {}: {size} bytes requested, {before} of {limit} already allocated",
                self.index
            )));
        }
        let result = layout(size).and_then(|layout| {
            let p = if layout.size() >= HUGE_PAGE {
                map_huge(layout.size())
            } else {
                // SAFETY: the layout has a non-zero size (0 is rejected by the ABI layer).
                unsafe { std::alloc::alloc_zeroed(layout) }
            };
            if p.is_null() {
                Err(Error::OutOfMemory(format!(
                    "host device {}: the system allocator refused {size} bytes",
                    self.index
                )))
            } else {
                Ok(DevicePtr(p as u64))
            }
        });
        if result.is_err() {
            self.allocated.fetch_sub(size, Ordering::SeqCst);
        }
        result
    }

    fn host_address(&self, ptr: DevicePtr) -> Option<*mut u8> {
        // Device pointers are this process's addresses.
        Some(ptr.0 as *mut u8)
    }

    fn free(&self, ptr: DevicePtr, size: u64, _kind: MemoryKind) {
        if let Ok(layout) = layout(size) {
            // SAFETY: `ptr` was returned by `map_huge` or `alloc_zeroed` (as `alloc` chose by
            // this size) with this layout; the layer calls `free` once, after the last
            // operation using the memory has run.
            unsafe {
                if layout.size() >= HUGE_PAGE {
                    let len = layout.size().next_multiple_of(HUGE_PAGE);
                    libc::munmap(ptr.0 as *mut libc::c_void, len);
                } else {
                    std::alloc::dealloc(ptr.0 as *mut u8, layout)
                }
            }
            self.allocated.fetch_sub(size, Ordering::SeqCst);
        }
    }

    fn stream_create(&self) -> Result<()> {
        Ok(())
    }

    fn execute(&self, op: Op<'_, Self>, _stream: Option<&()>) -> Result<()> {
        match op {
            // The layer checked that each device range lies inside a live region of this device
            // and holds it (and its lock) while this runs; the host pointer is valid for `len`
            // bytes by the `copy_*_device` contract. Host and device ranges may overlap here
            // (device memory is host memory, and a HostBuffer hands it out as a slice; the safe
            // API borrows such a slice exclusively whenever a copy may touch it, but the device
            // API below it does not), so the copies are memmove's.
            Op::CopyToDevice { dst, src, len } => {
                // SAFETY: see above.
                unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, len) }
            }
            Op::CopyFromDevice { dst, src, len } => {
                // SAFETY: see above.
                unsafe { std::ptr::copy(src.0 as *const u8, dst.0, len) }
            }
            // SAFETY: both ranges are inside held regions; `copy` allows overlap.
            Op::CopyDeviceToDevice { dst, src, len } => unsafe {
                std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, len as usize)
            },
            Op::Launch {
                kernel,
                program,
                dims,
                args,
                name,
            } => {
                // SAFETY: `kernel.func` is a function exported by `program`, which the layer
                // keeps loaded until this returns; that its C signature matches `args` is
                // checked by the layer for JIT images and is the launch contract otherwise (the
                // same one a GPU driver relies on).
                let call = unsafe {
                    PreparedCall::new(program.has_context, kernel.func, kernel.work_group, args)
                };
                call.run(name, &dims, &self.pool)?;
            }
        }
        Ok(())
    }
}
