//! One host device: its programs, kernels, memory and queues.

use crate::launch::PreparedCall;
use crate::memory::MemoryMap;
use crate::program::Program;
use crate::queue::Queue;
use offload_core::jit::ParamType;
use offload_core::{
    DeviceInfo, DeviceLimits, DevicePtr, ElfImage, Error, GenericDevice, GlobalSymbol, KernelArg,
    KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle, Result,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug)]
struct Kernel {
    program: Arc<Program>,
    program_handle: u64,
    func: *mut c_void,
    name: String,
    /// Parameter types, when the image came from the JIT (native images carry none).
    params: Option<Vec<ParamType>>,
}

/// Refuses a launch whose arguments do not match the kernel's parameters: calling a C function
/// with the wrong arguments is undefined behaviour, a wrong result at best.
fn check_arguments(name: &str, params: &[ParamType], args: &[KernelArg]) -> Result<()> {
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    if params.len() != args.len() {
        return Err(Error::InvalidArgument(format!(
            "kernel '{name}' takes {} argument(s) ({}); the launch passes {} ({})",
            params.len(),
            list(params.iter().map(ToString::to_string).collect()),
            args.len(),
            list(args.iter().map(|a| a.type_name().to_string()).collect()),
        )));
    }
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        let fits = matches!(
            (p, a),
            (ParamType::I32, KernelArg::I32(_) | KernelArg::U32(_))
                | (ParamType::I64, KernelArg::I64(_) | KernelArg::U64(_))
                | (ParamType::F32, KernelArg::F32(_))
                | (ParamType::F64, KernelArg::F64(_))
                | (ParamType::Ptr, KernelArg::Ptr(_))
        );
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "kernel '{name}' argument {i} is {p} in the kernel; the launch passes {}",
                a.type_name()
            )));
        }
    }
    Ok(())
}

// SAFETY: `func` is a code address inside `program`, which the `Arc` keeps loaded; calling it
// from any thread is what the host backend does.
unsafe impl Send for Kernel {}
// SAFETY: see `Send`.
unsafe impl Sync for Kernel {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_checked_against_the_kernel_signature() {
        let params = [
            ParamType::I32,
            ParamType::F32,
            ParamType::Ptr,
            ParamType::Ptr,
        ];
        let ptr = KernelArg::Ptr(DevicePtr(64));
        let good = [KernelArg::U32(1), KernelArg::F32(2.0), ptr, ptr];
        check_arguments("saxpy", &params, &good).unwrap();
        let e = check_arguments("saxpy", &params, &good[..3])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "takes 4 argument(s) (i32, float, ptr, ptr); the launch passes 3 (u32, f32, ptr)"
            ),
            "{e}"
        );
        let e = check_arguments(
            "saxpy",
            &params,
            &[KernelArg::I32(1), KernelArg::F64(2.0), ptr, ptr],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("argument 1 is float in the kernel; the launch passes f64"),
            "{e}"
        );
        let odd = [ParamType::Other("i16".into())];
        assert!(check_arguments("k", &odd, &[KernelArg::I32(1)]).is_err());
        check_arguments("empty", &[], &[]).unwrap();
    }
}

#[derive(Debug)]
pub struct HostDevice {
    index: usize,
    jit: Arc<crate::HostJit>,
    pool: Arc<rayon::ThreadPool>,
    threads: u32,
    next_handle: AtomicU64,
    programs: Mutex<HashMap<u64, Arc<Program>>>,
    kernels: Mutex<HashMap<u64, Arc<Kernel>>>,
    memory: Arc<Mutex<MemoryMap>>,
    queues: Mutex<HashMap<u64, Arc<Queue>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn physical_memory() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        0
    }
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

/// Raw pointers that an enqueued job carries to its worker.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);
// SAFETY: the `copy_*_device` contracts make the caller keep the pointee valid and untouched
// until the queue is synchronised, which is what makes handing it to the worker sound.
unsafe impl<T> Send for SendPtr<T> {}

impl HostDevice {
    pub fn new(
        index: usize,
        pool: Arc<rayon::ThreadPool>,
        threads: u32,
        jit: Arc<crate::HostJit>,
    ) -> Self {
        HostDevice {
            index,
            jit,
            pool,
            threads,
            next_handle: AtomicU64::new(1),
            programs: Mutex::default(),
            kernels: Mutex::default(),
            memory: Arc::default(),
            queues: Mutex::default(),
        }
    }

    fn handle(&self) -> u64 {
        self.next_handle.fetch_add(1, Ordering::Relaxed)
    }

    fn program(&self, program: ProgramHandle) -> Result<Arc<Program>> {
        lock(&self.programs)
            .get(&program.0)
            .cloned()
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "program {} on host device {} (never loaded, or already unloaded)",
                    program.0, self.index
                ))
            })
    }

    fn queue(&self, q: QueueHandle) -> Result<Arc<Queue>> {
        lock(&self.queues)
            .get(&q.0)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("queue {} on host device {}", q.0, self.index)))
    }

    /// Runs `job` now, or on `queue` in order with its other work.
    fn run(
        &self,
        queue: Option<QueueHandle>,
        job: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        match queue {
            None => job(),
            Some(q) => self.queue(q)?.submit(Box::new(job)),
        }
    }
}

impl GenericDevice for HostDevice {
    fn index(&self) -> usize {
        self.index
    }

    fn info(&self) -> Result<DeviceInfo> {
        let target = crate::HostJit::target();
        Ok(DeviceInfo {
            name: format!("{} (host, {} worker threads)", cpu_model(), self.threads),
            compute_unit_kind: target.cpu,
            target_features: target.features,
            total_memory: physical_memory(),
            compute_units: self.threads,
            limits: DeviceLimits {
                max_grid: [i32::MAX as u32, 65535, 65535],
                max_block: [1024, 1024, 64],
                max_threads_per_block: 1024,
                warp_size: 1,
            },
        })
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        crate::check_image(image)
    }

    fn load_image(&self, image: &[u8]) -> Result<ProgramHandle> {
        let program = if crate::HostJit::is_input(image) {
            let compiled = self.jit.compile(image)?.image;
            let parsed = ElfImage::parse(&compiled.bytes, &crate::requirements())
                .map_err(|e| e.context("JIT output"))?;
            let mut program = Program::load(&compiled.bytes, parsed)?;
            program.jit_image = Some(compiled);
            Arc::new(program)
        } else {
            let parsed = ElfImage::parse(image, &crate::requirements())?;
            Arc::new(Program::load(image, parsed)?)
        };
        let handle = self.handle();
        {
            let mut memory = lock(&self.memory);
            for s in program
                .image
                .symbols
                .iter()
                .filter(|s| !s.is_function && s.size > 0)
            {
                if let Some(p) = program.symbol(&s.name) {
                    memory.add_global(p as u64, s.size, handle);
                }
            }
        }
        lock(&self.programs).insert(handle, program);
        Ok(ProgramHandle(handle))
    }

    fn unload_image(&self, program: ProgramHandle) -> Result<()> {
        let removed = lock(&self.programs).remove(&program.0);
        if removed.is_none() {
            return Err(Error::NotFound(format!(
                "program {} on host device {} (never loaded, or already unloaded)",
                program.0, self.index
            )));
        }
        lock(&self.kernels).retain(|_, k| k.program_handle != program.0);
        lock(&self.memory).remove_program_globals(program.0);
        // The image is unmapped when the last in-flight launch drops its `Arc<Program>`.
        drop(removed);
        Ok(())
    }

    fn kernel(&self, program: ProgramHandle, name: &str) -> Result<KernelHandle> {
        let p = self.program(program)?;
        let is_function = p.image.symbol(name).map(|s| s.is_function);
        let func = match (is_function, p.symbol(name)) {
            (Some(true), Some(func)) => func,
            (Some(false), _) => {
                return Err(Error::NotFound(format!(
                    "kernel '{name}': the image exports '{name}' as data, not a function"
                )));
            }
            _ => {
                let mut names = p.image.function_names();
                names.sort_unstable();
                return Err(Error::NotFound(format!(
                    "kernel '{name}' is not exported by the image; exported functions: {}",
                    if names.is_empty() {
                        "(none)".to_string()
                    } else {
                        names.join(", ")
                    }
                )));
            }
        };
        let params = p.jit_image.as_ref().and_then(|image| {
            image
                .signatures
                .iter()
                .find(|s| s.name == name)
                .map(|s| s.params.clone())
        });
        let handle = self.handle();
        lock(&self.kernels).insert(
            handle,
            Arc::new(Kernel {
                program: p,
                program_handle: program.0,
                func,
                name: name.to_string(),
                params,
            }),
        );
        Ok(KernelHandle(handle))
    }

    fn global(&self, program: ProgramHandle, name: &str) -> Result<GlobalSymbol> {
        let p = self.program(program)?;
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
        lock(&self.memory).alloc(size, physical_memory(), self.index)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        lock(&self.memory).free(ptr, self.index)
    }

    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let memory = self.memory.clone();
        let (index, src) = (self.index, SendPtr(src as *mut u8));
        self.run(queue, move || {
            let src = src;
            lock(&memory).check(dst, len as u64, "copy to device", index)?;
            // SAFETY: `dst..+len` is inside a live allocation (checked above); `src` is valid
            // for `len` bytes by this method's contract; host and device buffers never overlap
            // because the runtime never hands device memory out as a host slice.
            unsafe { std::ptr::copy_nonoverlapping(src.0, dst.0 as *mut u8, len) };
            Ok(())
        })
    }

    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let memory = self.memory.clone();
        let (index, dst) = (self.index, SendPtr(dst));
        self.run(queue, move || {
            let dst = dst;
            lock(&memory).check(src, len as u64, "copy from device", index)?;
            // SAFETY: checked source range; `dst` valid for `len` bytes by the contract.
            unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, dst.0, len) };
            Ok(())
        })
    }

    fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let memory = self.memory.clone();
        let index = self.index;
        self.run(queue, move || {
            {
                let m = lock(&memory);
                m.check(src, len, "device copy source", index)?;
                m.check(dst, len, "device copy destination", index)?;
            }
            // SAFETY: both ranges are inside live allocations; `copy` allows overlap.
            unsafe { std::ptr::copy(src.0 as *const u8, dst.0 as *mut u8, len as usize) };
            Ok(())
        })
    }

    fn launch(
        &self,
        kernel: KernelHandle,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let k = lock(&self.kernels).get(&kernel.0).cloned().ok_or_else(|| {
            Error::NotFound(format!(
                "kernel handle {} on host device {} (unknown, or its program was unloaded)",
                kernel.0, self.index
            ))
        })?;
        if let Some(params) = &k.params {
            check_arguments(&k.name, params, args)?;
        }
        // SAFETY: `k.func` is a function exported by `k.program`; that its C signature matches
        // `args` is checked above for JIT images and is the launch contract otherwise (the same
        // one a GPU driver relies on).
        let call = unsafe { PreparedCall::new(k.program.clone(), k.func, args) };
        let pointers: Vec<(usize, DevicePtr)> = args
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                KernelArg::Ptr(p) if p.0 != 0 => Some((i, *p)),
                _ => None,
            })
            .collect();
        let (memory, pool, dims, index, name) = (
            self.memory.clone(),
            self.pool.clone(),
            *dims,
            self.index,
            k.name.clone(),
        );
        self.run(queue, move || {
            {
                let m = lock(&memory);
                for (i, p) in &pointers {
                    m.check(*p, 0, &format!("kernel '{name}' argument {i}"), index)?;
                }
            }
            call.run(&dims, &pool);
            Ok(())
        })
    }

    fn queue_create(&self) -> Result<QueueHandle> {
        let handle = self.handle();
        let q = Queue::new(format!("offload-host{}-q{handle}", self.index))?;
        lock(&self.queues).insert(handle, Arc::new(q));
        Ok(QueueHandle(handle))
    }

    fn queue_synchronize(&self, queue: QueueHandle) -> Result<()> {
        self.queue(queue)?.synchronize()
    }

    fn queue_destroy(&self, queue: QueueHandle) -> Result<()> {
        let q = lock(&self.queues).remove(&queue.0).ok_or_else(|| {
            Error::NotFound(format!("queue {} on host device {}", queue.0, self.index))
        })?;
        q.shutdown()
    }
}
