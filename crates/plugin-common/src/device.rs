//! A device of the layer ([`Device`]): the [`GenericDevice`] the runtime sees, made of a
//! backend's [`DeviceBackend`] hooks and the layer's handles, regions, queues and health.

use crate::handles::{Kind, Table};
use crate::memory::{Region, RegionKind, Regions};
use crate::{DeviceBackend, Hold, HostPtr, Op, args, health, jit, queue, select};
use offload_core::jit::{CompileRequest, CompiledImage, ParamType};
use offload_core::{
    DeviceInfo, DevicePtr, Error, EventHandle, GenericDevice, GlobalSymbol, KernelArg,
    KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle, Result, classify,
};
use std::sync::{Arc, OnceLock};

/// A device-to-device copy with `memmove`'s result for ranges that overlap, through a backend
/// that is only handed ranges that do not: pieces of the ranges' distance in the order that
/// reads every byte before it is overwritten, or, when that would take more than
/// [`MAX_COPY_PIECES`] pieces, a copy through a temporary device allocation (pieces again if
/// none can be had).
pub(crate) fn copy_within<D: DeviceBackend>(
    backend: &D,
    dst: DevicePtr,
    src: DevicePtr,
    len: u64,
    stream: Option<&D::Stream>,
) -> Result<()> {
    let copy = |dst: u64, src: u64, len: u64| {
        backend.execute(
            Op::CopyDeviceToDevice {
                dst: DevicePtr(dst),
                src: DevicePtr(src),
                len,
            },
            stream,
        )
    };
    let distance = dst.0.abs_diff(src.0);
    if distance >= len {
        return copy(dst.0, src.0, len);
    }
    if distance == 0 {
        // The same range: memmove leaves it as it is.
        return Ok(());
    }
    if len.div_ceil(distance) > MAX_COPY_PIECES
        && let Ok(tmp) = backend.alloc(len, MemoryKind::Device)
    {
        let mut result = copy(tmp.0, src.0, len).and_then(|()| copy(dst.0, tmp.0, len));
        // The allocation is free to go once both copies have run: `execute` has run them,
        // unless it only put them on a stream.
        if let Some(stream) = stream
            && backend.stream_ordered()
        {
            // A sync that did not settle wins over an earlier failure: then the first copy
            // may still write the temporary.
            result = match (result, backend.sync_stream(stream)) {
                (_, Err(e)) if e.is_unsettled() => Err(e),
                (r, s) => r.and(s),
            };
        }
        // A copy that did not settle may still write it: never freed (health.rs).
        if !result.as_ref().is_err_and(Error::is_unsettled) {
            backend.free(tmp, len, MemoryKind::Device);
        }
        return result;
    }
    // Copying up: the top piece first; copying down: the bottom one. Each piece is at most
    // `distance` long, so its source and destination are apart.
    let pieces = len.div_ceil(distance);
    for i in 0..pieces {
        let k = if dst.0 > src.0 { pieces - 1 - i } else { i };
        let at = k * distance;
        copy(dst.0 + at, src.0 + at, distance.min(len - at))?;
    }
    Ok(())
}

/// Above this many pieces an overlapping device copy goes through a temporary allocation.
pub const MAX_COPY_PIECES: u64 = 8;

struct ProgramEntry<D: DeviceBackend> {
    program: D::Program,
    jit: Option<Arc<CompiledImage>>,
}

struct KernelEntry<D: DeviceBackend> {
    program: Arc<ProgramEntry<D>>,
    kernel: D::Kernel,
    name: String,
    params: Option<Vec<ParamType>>,
}

struct QueueEntry<D: DeviceBackend> {
    queue: queue::Queue,
    stream: Arc<D::Stream>,
}

fn same<A: ?Sized, B: ?Sized>(a: &Arc<A>, b: &Arc<B>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// A device of a plugin made with [`export_backend!`](crate::export_backend).
pub struct Device<D: DeviceBackend> {
    index: usize,
    name: String,
    backend: Arc<D>,
    served: Arc<select::PluginClaims>,
    jit: Arc<jit::Jit>,
    compute_unit: OnceLock<String>,
    /// The device's information, asked once and kept (its limits check every launch).
    info: OnceLock<DeviceInfo>,
    programs: Table<Arc<ProgramEntry<D>>>,
    kernels: Table<Arc<KernelEntry<D>>>,
    queues: Table<Arc<QueueEntry<D>>>,
    events: Table<Arc<queue::Event>>,
    regions: Arc<Regions>,
    health: Arc<health::Health>,
}

impl<D: DeviceBackend> std::fmt::Debug for Device<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.name)
    }
}

impl<D: DeviceBackend> Device<D> {
    pub(crate) fn new(
        index: usize,
        backend: D,
        served: Arc<select::PluginClaims>,
        jit: Arc<jit::Jit>,
    ) -> Self {
        let plugin = served.plugin;
        Device {
            index,
            name: format!("{plugin}:{index}"),
            backend: Arc::new(backend),
            served,
            jit,
            compute_unit: OnceLock::new(),
            info: OnceLock::new(),
            programs: Table::new(plugin, index, Kind::Program),
            kernels: Table::new(plugin, index, Kind::Kernel),
            queues: Table::new(plugin, index, Kind::Queue),
            events: Table::new(plugin, index, Kind::Event),
            regions: Arc::default(),
            health: Arc::default(),
        }
    }

    /// Whether an operation that did not settle has failed the device for good
    /// ([`health`]).
    pub fn is_failed(&self) -> bool {
        self.health.is_failed()
    }

    /// Before an operation: the device is not failed for good, and the backend is entered.
    fn enter(&self) -> Result<()> {
        self.health.check(&self.name)?;
        self.backend.enter()
    }

    fn compute_unit(&self) -> Result<&str> {
        if let Some(cu) = self.compute_unit.get() {
            return Ok(cu);
        }
        let cu = self.info_ref()?.compute_unit_kind.clone();
        Ok(self.compute_unit.get_or_init(|| cu))
    }

    /// The device's information, asked of the backend once and kept.
    fn info_ref(&self) -> Result<&DeviceInfo> {
        if let Some(info) = self.info.get() {
            return Ok(info);
        }
        self.backend.enter()?;
        let info = self.backend.info()?;
        Ok(self.info.get_or_init(|| info))
    }

    /// Runs `op` now, holding `hold`, or on `queue` in order with its other work.
    fn run(
        &self,
        queue: Option<QueueHandle>,
        hold: Hold,
        op: impl FnOnce(&D, Option<&D::Stream>) -> Result<()> + Send + 'static,
    ) -> Result<()> {
        match queue {
            None => self.run_now(hold, |b| op(b, None)),
            Some(q) => {
                let entry = self.queues.get(q.0)?;
                let backend = self.backend.clone();
                let (stream, health, name) =
                    (entry.stream.clone(), self.health.clone(), self.name.clone());
                let mark = hold.mark_queued();
                if self.streamed() {
                    // Kept until the stream has been drained after the operation (and
                    // quarantined by the queue if that drain does not settle).
                    return entry.queue.submit_enqueued(Box::new(move |keep| {
                        keep.push(Box::new((hold, mark)));
                        health.check(&name)?;
                        backend.enter()?;
                        op(&backend, Some(&stream))
                    }));
                }
                entry.queue.submit(
                    Box::new(move |_| {
                        // As for a synchronous operation.
                        let locks = backend.locks_regions();
                        let held = health::PanicQuarantine::new(&health, (hold, mark), !locks);
                        let result = health.check(&name).and_then(|()| {
                            backend.enter()?;
                            let guards = if locks {
                                held.held().0.lock()
                            } else {
                                Vec::new()
                            };
                            let result = op(&backend, Some(&stream));
                            drop(guards);
                            result
                        });
                        held.end(result)
                    }),
                    false,
                )
            }
        }
    }

    /// Whether queued operations are only put on the queue's stream (see
    /// [`DeviceBackend::stream_ordered`]).
    fn streamed(&self) -> bool {
        !self.backend.locks_regions() && self.backend.stream_ordered()
    }

    /// Runs `op` on the calling thread, holding `hold`: after the queued work on the same
    /// memory, with its regions locked on a device that locks them.
    fn run_now(&self, hold: Hold, op: impl FnOnce(&D) -> Result<()>) -> Result<()> {
        // Queued work on the same memory first (memory.rs); it may have failed the device
        // meanwhile.
        hold.wait_queued();
        self.health.check(&self.name)?;
        let locks = self.backend.locks_regions();
        // Released when settled; quarantined when not (health.rs), and, on a device whose
        // work outlives the call (one that does not lock regions), when a hook panics.
        let hold = health::PanicQuarantine::new(&self.health, hold, !locks);
        let guards = if locks {
            hold.held().lock()
        } else {
            Vec::new()
        };
        let result = op(&self.backend);
        drop(guards);
        hold.end(result)
    }

    fn pin(&self, hold: &mut Hold, ptr: DevicePtr, len: u64, what: &str) -> Result<()> {
        hold.pin(self.regions.find(ptr, len, what, &self.name)?);
        Ok(())
    }
}

impl<D: DeviceBackend> GenericDevice for Device<D> {
    fn index(&self) -> usize {
        self.index
    }

    fn info(&self) -> Result<DeviceInfo> {
        self.info_ref().cloned()
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        not_empty(image)?;
        self.backend.enter()?;
        let cu = self.compute_unit()?.to_string();
        select::for_device(&self.served, &*self.backend, &self.name, &cu, image).map(|_| ())
    }

    unsafe fn load_image(&self, image: &[u8]) -> Result<ProgramHandle> {
        not_empty(image)?;
        self.enter()?;
        let cu = self.compute_unit()?.to_string();
        let choice = select::for_device(&self.served, &*self.backend, &self.name, &cu, image)?;
        let from = |e: Error| match &choice.entry {
            Some(entry) => e.context(format!("container entry {entry}")),
            None => e,
        };
        let entry = if choice.kind.is_jit_input() {
            let (target, post) = self
                .backend
                .jit_target()
                .ok_or_else(|| Error::Unsupported(format!("{} compiles no bitcode", self.name)))?;
            let out = self
                .jit
                .compile(&CompileRequest {
                    image: choice.bytes,
                    target,
                    post,
                })
                .map_err(from)?;
            let kind = classify(&out.image.bytes).map_err(|e| e.context("JIT output"))?;
            let program = self
                .backend
                .load(&out.image.bytes, &kind)
                .map_err(|e| e.context("JIT output"))?;
            ProgramEntry {
                program,
                jit: Some(out.image),
            }
        } else {
            ProgramEntry {
                program: self
                    .backend
                    .load(choice.bytes, &choice.kind)
                    .map_err(from)?,
                jit: None,
            }
        };
        self.programs.insert(Arc::new(entry)).map(ProgramHandle)
    }

    unsafe fn unload_image(&self, program: ProgramHandle) -> Result<()> {
        let entry = self.programs.remove(program.0)?;
        self.kernels
            .remove_where(|k| Arc::ptr_eq(&k.program, &entry));
        self.regions.remove_globals(|p| same(p, &entry));
        // The program itself goes when the last launch that holds it has run.
        Ok(())
    }

    fn kernel(&self, program: ProgramHandle, name: &str) -> Result<KernelHandle> {
        if name.is_empty() {
            return Err(Error::InvalidArgument("kernel name is empty".into()));
        }
        self.enter()?;
        let entry = self.programs.get(program.0)?;
        let (kernel, params) = self.backend.kernel(&entry.program, name)?;
        // What the backend reads of the loaded image first (it knows its device's parameter
        // kinds: Level Zero's `__local` pointers take a size), else the JIT's LLVM signature.
        let params = params.or_else(|| {
            entry
                .jit
                .as_ref()
                .and_then(|image| image.signatures.iter().find(|s| s.name == name))
                .map(|s| s.params.clone())
        });
        self.kernels
            .insert(Arc::new(KernelEntry {
                program: entry,
                kernel,
                name: name.to_string(),
                params,
            }))
            .map(KernelHandle)
    }

    fn global(&self, program: ProgramHandle, name: &str) -> Result<GlobalSymbol> {
        self.enter()?;
        let entry = self.programs.get(program.0)?;
        let g = self.backend.global(&entry.program, name)?;
        if g.size > 0 {
            // Callers copy to and from globals, and pass them to kernels: they are regions
            // of this device, and they keep their program loaded while work uses them.
            let owner: Arc<dyn std::any::Any + Send + Sync> = entry;
            self.regions.insert_global(g.ptr, g.size, owner);
        }
        Ok(g)
    }

    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr> {
        if size == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        self.enter()?;
        let ptr = self.backend.alloc(size, kind)?;
        let (backend, health) = (self.backend.clone(), self.health.clone());
        self.regions.insert(Region::new(
            ptr,
            size,
            RegionKind::Allocation(kind),
            Some(Box::new(move |p, s| {
                // A device failed for good runs nothing more, frees included (a driver's free
                // may wait for the work that did not settle): its memory is left as it is.
                if health.is_failed() {
                    return;
                }
                let _ = backend.enter();
                backend.free(p, s, kind)
            })),
        ));
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.0 == 0 {
            return Err(Error::InvalidArgument(
                "free of a null device pointer".into(),
            ));
        }
        self.regions.free(ptr, &self.name)
    }

    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if src.is_null() || dst.0 == 0 {
            return Err(Error::InvalidArgument(
                "copy to device with a null pointer".into(),
            ));
        }
        self.enter()?;
        let mut hold = Hold::default();
        self.pin(&mut hold, dst, len as u64, "copy to device")?;
        let src = HostPtr(src as *mut u8);
        self.run(queue, hold, move |b, stream| {
            b.execute(Op::CopyToDevice { dst, src, len }, stream)
        })
    }

    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if dst.is_null() || src.0 == 0 {
            return Err(Error::InvalidArgument(
                "copy from device with a null pointer".into(),
            ));
        }
        self.enter()?;
        let mut hold = Hold::default();
        self.pin(&mut hold, src, len as u64, "copy from device")?;
        let dst = HostPtr(dst);
        self.run(queue, hold, move |b, stream| {
            b.execute(Op::CopyFromDevice { dst, src, len }, stream)
        })
    }

    unsafe fn host_access(
        &self,
        ptr: DevicePtr,
        len: u64,
        visit: &mut dyn FnMut(*mut u8) -> Result<()>,
    ) -> Result<()> {
        if ptr.0 == 0 {
            return Err(Error::InvalidArgument(
                "host access with a null device pointer".into(),
            ));
        }
        self.enter()?;
        let unaddressable = || {
            Error::Unsupported(format!(
                "{}: its memory is not this process's to address",
                self.name
            ))
        };
        // The range is checked first: the hook is only asked of pointers into an allocation.
        let mut hold = Hold::default();
        self.pin(&mut hold, ptr, len, "host access")?;
        self.run_now(hold, |b| {
            visit(b.host_address(ptr).ok_or_else(unaddressable)?)
        })
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if dst.0 == 0 || src.0 == 0 {
            return Err(Error::InvalidArgument(
                "device copy with a null pointer".into(),
            ));
        }
        self.enter()?;
        let mut hold = Hold::default();
        self.pin(&mut hold, src, len, "device copy source")?;
        self.pin(&mut hold, dst, len, "device copy destination")?;
        self.run(queue, hold, move |b, stream| {
            copy_within(b, dst, src, len, stream)
        })
    }

    /// # Safety
    /// As [`GenericDevice::launch`]. The layer checks the argument count and types where the
    /// kernel declares them, the launch shape and, where the backend asks for it, that each
    /// pointer points into a live allocation (which it then keeps alive until the launch has
    /// run); not how far the kernel reads or writes.
    unsafe fn launch(
        &self,
        kernel: KernelHandle,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        dims.validate(&self.info_ref()?.limits)?;
        self.enter()?;
        let k = self.kernels.get(kernel.0)?;
        // OpenMP's host side passes a word per captured variable; the kernel may take fewer
        // (a `declare target` variable is the device's own): the words past its parameters are
        // what a C call would ignore, so they are not passed.
        let args = match &k.params {
            Some(params)
                if args.len() > params.len()
                    && args[params.len()..]
                        .iter()
                        .all(|a| matches!(a, KernelArg::Word(_))) =>
            {
                &args[..params.len()]
            }
            _ => args,
        };
        if let Some(params) = &k.params {
            args::check(&k.name, params, args)?;
        }
        self.backend.check_launch(&k.kernel, &k.name, dims, args)?;
        let mut hold = Hold::default();
        for (i, a) in args.iter().enumerate() {
            let KernelArg::Ptr(p) = a else { continue };
            if p.0 == 0 {
                continue;
            }
            // One past the end (`begin, end` parameters) belongs to the allocation before it.
            let found = self.regions.find(*p, 0, "", &self.name).or_else(|e| {
                p.0.checked_sub(1)
                    .ok_or(e)
                    .and_then(|q| self.regions.find(DevicePtr(q), 1, "", &self.name))
            });
            match found {
                Ok(region) => hold.pin(region),
                Err(_) if !self.backend.strict_pointers() => {}
                Err(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "kernel '{}' argument {i}: pointer {p} is not inside any live allocation \
                         or global of {}",
                        k.name, self.name
                    )));
                }
            }
        }
        hold.keep(k.clone());
        let (dims, args) = (*dims, args.to_vec());
        self.run(queue, hold, move |b, stream| {
            b.execute(
                Op::Launch {
                    kernel: &k.kernel,
                    program: &k.program.program,
                    name: &k.name,
                    dims,
                    args: &args,
                },
                stream,
            )
        })
    }

    fn queue_create(&self) -> Result<QueueHandle> {
        self.enter()?;
        let stream = Arc::new(self.backend.stream_create()?);
        // The handle is not known before the insert; the thread is named by a serial.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("queue {n} of {}", self.name);
        let drain: Option<queue::Drain> = if self.streamed() {
            let (backend, stream, what) = (self.backend.clone(), stream.clone(), name.clone());
            Some(Box::new(move || {
                backend.enter()?;
                backend
                    .sync_stream(&stream)
                    .map_err(|e| e.context(format!("work queued on {what}")))
            }))
        } else {
            None
        };
        let health = self.health.clone();
        let quarantine: queue::Quarantine = Box::new(move |keep, why| health.quarantine(keep, why));
        let queue = queue::Queue::new(name, drain, Some(quarantine))?;
        self.queues
            .insert(Arc::new(QueueEntry { queue, stream }))
            .map(QueueHandle)
    }

    fn queue_synchronize(&self, queue: QueueHandle) -> Result<()> {
        self.queues.get(queue.0)?.queue.synchronize()
    }

    fn queue_destroy(&self, queue: QueueHandle) -> Result<()> {
        self.queues.remove(queue.0)?.queue.shutdown()
    }

    fn event_create(&self) -> Result<EventHandle> {
        self.events
            .insert(Arc::new(queue::Event::default()))
            .map(EventHandle)
    }

    fn event_record(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        let e = self.events.get(event.0)?;
        e.record(&self.queues.get(queue.0)?.queue)
    }

    fn event_wait(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        let e = self.events.get(event.0)?;
        e.wait_on(&self.queues.get(queue.0)?.queue)
    }

    fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        self.events.get(event.0)?.synchronize()
    }

    fn event_query(&self, event: EventHandle) -> Result<bool> {
        Ok(self.events.get(event.0)?.query())
    }

    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        self.events.remove(event.0).map(drop)
    }

    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<std::time::Duration> {
        let (start, end) = (self.events.get(start.0)?, self.events.get(end.0)?);
        end.elapsed_since(&start)
    }
}

fn not_empty(image: &[u8]) -> Result<()> {
    if image.is_empty() {
        return Err(Error::InvalidImage("image is empty (0 bytes)".into()));
    }
    Ok(())
}
