//! # plugin-mpi: the devices of other ranks of an MPI job
//!
//! The program runs as rank 0 of an MPMD job whose other ranks are `offload-mpi-proxy`
//! (`mpirun -n 1 ./app : -n 2 offload-mpi-proxy`). Each proxy loads the plugins of its node
//! and says hello to rank 0 with its devices; this plugin makes each of them a device of the
//! program, `mpi:<rank>/<plugin>:<n>` (numbered in rank order, then in the proxy's order), with
//! the remote device's properties and compute-unit kind.
//!
//! Every operation is a message to the proxy (`offload_mpi::wire`), served there by the node's
//! own device, whose generic layer checks each address, range and handle: device addresses and
//! handles are the proxy's, numbers this side never interprets. An image travels as its bytes;
//! JIT input is compiled on the proxy's node, for its device, through its cache.
//!
//! **Queues.** Work on a queue is sent without waiting: the proxy enqueues it on the device's
//! own queue and answers nothing, so many operations are in flight per queue and across queues.
//! A queued read's bytes come back with the synchronisation that completes it (the queue's, or
//! an event's recorded after it), and are written to the program's memory then.
//!
//! **When MPI starts.** Only in an MPI job (`OMPI_COMM_WORLD_SIZE`, `PMI_RANK` or `PMIX_RANK`
//! set by the launcher): outside one the plugin has no device and says why, and MPI is never
//! initialised. In a job it initialises MPI on first use (unless the program did), waits at
//! most `OFFLOAD_MPI_TIMEOUT` seconds (default 30) for every other rank's hello, and at exit
//! shuts the proxies down and finalises MPI (if it initialised it).
//!
//! **Faults.** A wait lasts until the proxy has said nothing for the timeout (a busy proxy
//! sends heartbeats): then the operation fails naming the rank and the operation, and that
//! proxy's devices refuse all later work; the other proxies' devices keep working.

use mpi::topology::{Communicator, SimpleCommunicator};
use offload_core::sync::lock;
use offload_core::{
    DeviceInfo, DevicePtr, Error, EventHandle, GenericDevice, GenericPlugin, GlobalSymbol,
    ImageClaim, KernelArg, KernelHandle, LaunchDims, MemoryKind, ProgramHandle, QueueHandle,
    Result,
};
use offload_mpi::client::Client;
use offload_mpi::wire::{RemoteDevice, Reply, Request};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The variables by which MPI launchers tell a process it is a rank of a job (Open MPI,
/// MPICH's and Intel MPI's Hydra, PMIx launchers such as Open MPI 5 and Slurm's `srun`).
pub const JOB_VARIABLES: [&str; 3] = ["OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMIX_RANK"];

/// The remote-device plugin.
#[derive(Debug, Default)]
pub struct MpiPlugin {
    job: OnceLock<Result<Arc<Job>>>,
}

/// The job as rank 0 sees it: the proxies and their devices.
#[derive(Debug)]
struct Job {
    client: Arc<Client>,
    devices: Vec<Arc<MpiDevice>>,
}

/// The job this process joined (one per process: MPI is), for the exit handler.
static JOB: OnceLock<Arc<Job>> = OnceLock::new();
/// MPI, when this plugin initialised it (it finalises it at exit).
static UNIVERSE: Mutex<Option<mpi::environment::Universe>> = Mutex::new(None);

impl MpiPlugin {
    /// The plugin (cheap: nothing is initialised, MPI included).
    pub fn new() -> MpiPlugin {
        MpiPlugin::default()
    }

    fn job(&self) -> Result<&Arc<Job>> {
        self.job
            .get_or_init(|| join().map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Joins the job: initialises MPI if needed, checks this is rank 0, waits for the proxies.
fn join() -> Result<Job> {
    if let Some(job) = JOB.get() {
        // Another plugin object of this process joined already (the runtime makes one).
        return Ok(Job {
            client: job.client.clone(),
            devices: job.devices.clone(),
        });
    }
    let in_job = JOB_VARIABLES
        .iter()
        .any(|v| offload_core::env::os(v).is_some());
    if !in_job && !mpi::environment::is_initialized() {
        return Err(Error::NoDevice(format!(
            "not in an MPI job (none of {} is set), so there are no remote devices and MPI is \
             not started: run the program as rank 0 of a job whose other ranks are proxies, \
             e.g. mpirun -n 1 ./app : -n 2 offload-mpi-proxy",
            JOB_VARIABLES.join(", ")
        )));
    }
    let timeout = Duration::from_secs(u64::from(offload_mpi::timeout_secs()?));
    let world = if mpi::environment::is_initialized() {
        if mpi::environment::is_finalized() {
            return Err(Error::NoDevice(
                "the program has finalised MPI already: remote devices must be used before \
                 MPI_Finalize"
                    .into(),
            ));
        }
        let level = mpi::environment::threading_support();
        if !matches!(level, mpi::Threading::Serialized | mpi::Threading::Multiple) {
            return Err(Error::Unsupported(format!(
                "the program initialised MPI with {level:?} threading; remote devices need \
                 MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE (MPI_Init_thread)"
            )));
        }
        SimpleCommunicator::world()
    } else {
        let Some((universe, level)) = mpi::initialize_with_threading(mpi::Threading::Serialized)
        else {
            return Err(Error::DeviceFailure("MPI could not be initialised".into()));
        };
        let world = universe.world();
        *lock(&UNIVERSE) = Some(universe);
        if !matches!(level, mpi::Threading::Serialized | mpi::Threading::Multiple) {
            return Err(Error::Unsupported(format!(
                "this MPI library grants {level:?} threading; remote devices need \
                 MPI_THREAD_SERIALIZED"
            )));
        }
        world
    };
    let (rank, size) = (world.rank(), world.size());
    if rank != 0 {
        return Err(Error::NoDevice(format!(
            "this process is rank {rank} of the job; the proxies serve rank 0 only (start one \
             program: mpirun -n 1 ./app : -n N offload-mpi-proxy)"
        )));
    }
    // From here on the other ranks may be proxies waiting for this one: they are ended at
    // exit, whatever comes of the hellos.
    // SAFETY: `at_exit` is an `extern "C" fn()` that catches its own panics; registering it
    // has no other precondition.
    if unsafe { libc::atexit(at_exit) } != 0 {
        eprintln!("offload mpi plugin: could not register the exit handler: proxies are not ended");
    }
    if size == 1 {
        return Err(Error::NoDevice(
            "the job has no other rank, so no proxy: start them beside the program, \
             mpirun -n 1 ./app : -n N offload-mpi-proxy"
                .into(),
        ));
    }
    let client = Arc::new(Client::connect(world, timeout)?);
    let mut devices = Vec::new();
    for p in client.proxies() {
        for (remote, d) in p.devices.iter().enumerate() {
            devices.push(Arc::new(MpiDevice {
                index: devices.len(),
                rank: p.rank,
                remote: remote as u32,
                address: d.address(p.rank),
                desc: d.clone(),
                client: client.clone(),
                queues: Mutex::default(),
            }));
        }
    }
    let job = Job { client, devices };
    let _ = JOB.set(Arc::new(Job {
        client: job.client.clone(),
        devices: job.devices.clone(),
    }));
    Ok(job)
}

/// At exit: every other rank is told to end (the proxies, also those refused at start or
/// failed: a proxy that stopped answering may be alive, and waits for its end like the
/// others), then MPI is finalised if this plugin initialised it (`mpirun` reports a rank that
/// exits without finalising as a failure).
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if mpi::environment::is_finalized() {
            return;
        }
        // With a rank of the job dead, MPI_Finalize would wait for it (Open MPI's does under
        // --enable-recovery): then this process ends without finalising, and so do the
        // proxies.
        let finalize = |finalize: bool| match lock(&UNIVERSE).take() {
            Some(universe) if finalize => drop(universe),
            Some(universe) => std::mem::forget(universe),
            None => {}
        };
        match JOB.get() {
            // Under the client's lock: a thread of the program may still be in a call.
            Some(job) => job.client.shutdown_all_then(finalize),
            None => {
                let world = SimpleCommunicator::world();
                let others: Vec<i32> = (1..world.size()).collect();
                offload_mpi::client::shutdown(&world, &others, true);
                finalize(true);
            }
        }
    });
}

impl GenericPlugin for MpiPlugin {
    fn name(&self) -> &str {
        "mpi"
    }

    /// No ELF machine of its own (`EM_NONE`): its devices' kinds are their nodes'
    /// ([`GenericPlugin::image_claims`]).
    fn elf_machine(&self) -> u16 {
        0
    }

    fn target_triple(&self) -> &str {
        ""
    }

    fn init(&self) -> Result<usize> {
        Ok(self.job()?.devices.len())
    }

    /// Whether some remote device can run the image (each is asked, in order).
    fn check_image(&self, image: &[u8]) -> Result<()> {
        if image.is_empty() {
            return Err(Error::InvalidImage("image is empty (0 bytes)".into()));
        }
        let job = self.job()?;
        let mut reasons = Vec::new();
        for d in &job.devices {
            match d.check_image(image) {
                Ok(()) => return Ok(()),
                Err(e) => reasons.push(format!("{}: {}", d.address, e.message())),
            }
        }
        Err(Error::Unsupported(if reasons.is_empty() {
            "the job's proxies serve no device".into()
        } else {
            format!("no remote device runs this image ({})", reasons.join("; "))
        }))
    }

    /// The image kinds the remote devices' plugins serve (none before the job is joined).
    fn image_claims(&self) -> Vec<ImageClaim> {
        let Ok(job) = self.job() else {
            return Vec::new();
        };
        let mut claims: Vec<ImageClaim> = Vec::new();
        for c in job
            .devices
            .iter()
            .flat_map(|d| d.desc.claims.iter())
            .filter_map(|c| ImageClaim::from_text(c))
        {
            if !claims.contains(&c) {
                claims.push(c);
            }
        }
        claims
    }

    fn device(&self, index: usize) -> Result<Arc<dyn GenericDevice>> {
        let job = self.job()?;
        job.devices
            .get(index)
            .map(|d| d.clone() as Arc<dyn GenericDevice>)
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "device {index} of plugin 'mpi' (the job's proxies serve {})",
                    job.devices.len()
                ))
            })
    }

    fn properties(&self) -> Vec<(String, String)> {
        let mut props = vec![(
            "timeout".to_string(),
            match offload_mpi::timeout_secs() {
                Ok(s) => format!("{s} s (OFFLOAD_MPI_TIMEOUT)"),
                Err(e) => e.to_string(),
            },
        )];
        if let Ok(job) = self.job() {
            for p in job.client.proxies() {
                props.push((
                    format!("rank {}", p.rank),
                    format!(
                        "offload-mpi-proxy, {} device(s): {}",
                        p.devices.len(),
                        p.devices
                            .iter()
                            .map(|d| d.address(p.rank))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        props
    }
}

/// A read queued on a remote queue: where its bytes go when they come back.
#[derive(Debug)]
struct QueuedRead {
    id: u64,
    /// The program's memory (`copy_from_device`'s contract keeps it valid and untouched until
    /// the queue is synchronised).
    dst: usize,
    len: usize,
}

/// What this side tracks of a device's remote queues and events.
#[derive(Debug, Default)]
struct Queues {
    reads: HashMap<u64, Vec<QueuedRead>>,
    /// Each recorded event: its queue and the reads queued before its record.
    events: HashMap<u64, (u64, Vec<u64>)>,
}

/// A device of a proxy rank.
#[derive(Debug)]
pub struct MpiDevice {
    index: usize,
    rank: i32,
    /// Its index in the proxy's hello.
    remote: u32,
    /// `mpi:<rank>/<plugin>:<n>`.
    address: String,
    desc: RemoteDevice,
    client: Arc<Client>,
    queues: Mutex<Queues>,
}

impl MpiDevice {
    fn call(&self, request: Request) -> Result<Reply> {
        self.client
            .request(self.rank, &request)
            .map_err(|e| e.context(&self.address))
    }

    fn post(&self, request: &Request) -> Result<u64> {
        self.client
            .post(self.rank, request)
            .map_err(|e| e.context(&self.address))
    }

    fn wait(&self, id: u64, what: &str) -> Result<Reply> {
        self.client
            .wait(self.rank, id, what)
            .map_err(|e| e.context(&self.address))
    }

    fn value(&self, request: Request) -> Result<u64> {
        let what = request.name();
        match self.call(request)? {
            Reply::Value { value } => Ok(value),
            other => Err(self.unexpected(what, &other)),
        }
    }

    fn done(&self, request: Request) -> Result<()> {
        let what = request.name();
        self.expect_done(what, self.client.request(self.rank, &request))
    }

    /// An answer that must be [`Reply::Done`], its error named by this device.
    fn expect_done(&self, what: &str, answer: Result<Reply>) -> Result<()> {
        match answer.map_err(|e| e.context(&self.address))? {
            Reply::Done => Ok(()),
            other => Err(self.unexpected(what, &other)),
        }
    }

    fn unexpected(&self, what: &str, reply: &Reply) -> Error {
        Error::DeviceFailure(format!(
            "{}: proxy rank {} answered {what} with {}",
            self.address,
            self.rank,
            reply.name()
        ))
    }

    /// Waits for the queued reads `reads` and writes their bytes where they go; the first
    /// error, if any.
    fn land(&self, reads: Vec<QueuedRead>) -> Result<()> {
        let mut first = None;
        for r in reads {
            match self.wait(r.id, "a queued copy from the device") {
                Ok(Reply::Bytes { bytes }) if bytes.len() == r.len => {
                    // SAFETY: `copy_from_device`'s contract: `dst` is valid for `len` writes
                    // and nobody else's until the queue (or an event after the read) is
                    // synchronised, which is now.
                    unsafe {
                        std::ptr::copy_nonoverlapping(bytes.as_ptr(), r.dst as *mut u8, r.len)
                    };
                }
                Ok(other) => {
                    first.get_or_insert(self.unexpected("a queued copy from the device", &other));
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Queue synchronise or destroy: the request, then the queue's reads, then its reply.
    fn drain(&self, request: Request, queue: u64) -> Result<()> {
        let what = request.name();
        let (id, reads) = {
            let mut q = lock(&self.queues);
            let id = self.post(&request)?;
            (id, q.reads.remove(&queue).unwrap_or_default())
        };
        let landed = self.land(reads);
        let reply = self.wait(id, what);
        match reply? {
            Reply::Done => landed,
            other => Err(self.unexpected(what, &other)),
        }
    }

    /// The reads queued before `event`'s record that are still pending, taken off their queue.
    fn reads_before(&self, q: &mut Queues, event: u64) -> Vec<QueuedRead> {
        let Some((queue, before)) = q.events.get(&event).cloned() else {
            return Vec::new();
        };
        let Some(pending) = q.reads.get_mut(&queue) else {
            return Vec::new();
        };
        let (done, kept) = std::mem::take(pending)
            .into_iter()
            .partition(|r| before.contains(&r.id));
        *pending = kept;
        done
    }
}

impl GenericDevice for MpiDevice {
    fn index(&self) -> usize {
        self.index
    }

    fn info(&self) -> Result<DeviceInfo> {
        let mut info = self.desc.info.clone();
        info.name = format!("{} ({})", self.address, info.name);
        Ok(info)
    }

    fn check_image(&self, image: &[u8]) -> Result<()> {
        self.done(Request::CheckImage {
            device: self.remote,
            image: image.to_vec(),
        })
    }

    unsafe fn load_image(&self, image: &[u8]) -> Result<ProgramHandle> {
        self.value(Request::Load {
            device: self.remote,
            image: image.to_vec(),
        })
        .map(ProgramHandle)
    }

    unsafe fn unload_image(&self, program: ProgramHandle) -> Result<()> {
        self.done(Request::Unload {
            device: self.remote,
            program: program.0,
        })
    }

    fn kernel(&self, program: ProgramHandle, name: &str) -> Result<KernelHandle> {
        self.value(Request::Kernel {
            device: self.remote,
            program: program.0,
            name: name.into(),
        })
        .map(KernelHandle)
    }

    fn global(&self, program: ProgramHandle, name: &str) -> Result<GlobalSymbol> {
        let request = Request::Global {
            device: self.remote,
            program: program.0,
            name: name.into(),
        };
        match self.call(request)? {
            Reply::Global { ptr, size } => Ok(GlobalSymbol {
                ptr: DevicePtr(ptr),
                size,
            }),
            other => Err(self.unexpected("global lookup", &other)),
        }
    }

    fn alloc(&self, size: u64, kind: MemoryKind) -> Result<DevicePtr> {
        if size == 0 {
            return Err(Error::InvalidArgument("allocation of 0 bytes".into()));
        }
        if kind != MemoryKind::Device {
            // The runtime hands host and shared memory out as slices of this process; a
            // remote node's is not.
            return Err(Error::Unsupported(format!(
                "{kind:?} memory of {} is memory of another node, not of this process: \
                 allocate device memory and copy",
                self.address
            )));
        }
        self.value(Request::Alloc {
            device: self.remote,
            bytes: size,
            kind: kind.to_u32(),
        })
        .map(DevicePtr)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.done(Request::Free {
            device: self.remote,
            ptr: ptr.0,
        })
    }

    unsafe fn copy_to_device(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len > 0 && src.is_null() {
            return Err(Error::InvalidArgument(
                "copy to device from a null host pointer".into(),
            ));
        }
        if queue.is_none() && len >= offload_mpi::wire::STREAM_FROM {
            // SAFETY: the caller's contract: `src` is valid for `len` reads until this
            // synchronous copy returns.
            let data = unsafe { std::slice::from_raw_parts(src, len) };
            let request = Request::WriteStream {
                device: self.remote,
                dst: dst.0,
                len: len as u64,
                chunk: offload_mpi::wire::chunk_for(len) as u64,
            };
            let answer = self.client.write_stream(self.rank, &request, data);
            return self.expect_done(request.name(), answer);
        }
        let data: &[u8] = if len == 0 {
            &[]
        } else {
            // SAFETY: the caller's contract: `src` is valid for `len` reads (the bytes are
            // copied into the messages now, so a queue does not need them later).
            unsafe { std::slice::from_raw_parts(src, len) }
        };
        let Some(q) = queue else {
            return self.done(Request::Write {
                device: self.remote,
                dst: dst.0,
                queue: None,
                bytes: data.to_vec(),
            });
        };
        // Queued: one message per piece of at most MAX_MESSAGE bytes, in order on the queue.
        let mut at = 0;
        loop {
            let n = (len - at).min(offload_mpi::wire::MAX_MESSAGE);
            self.post(&Request::Write {
                device: self.remote,
                dst: dst.offset(at as u64)?.0,
                queue: Some(q.0),
                bytes: data[at..at + n].to_vec(),
            })?;
            at += n;
            if at >= len {
                return Ok(());
            }
        }
    }

    unsafe fn copy_from_device(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        if len > 0 && dst.is_null() {
            return Err(Error::InvalidArgument(
                "copy from device to a null host pointer".into(),
            ));
        }
        if queue.is_none() && len >= offload_mpi::wire::STREAM_FROM {
            // SAFETY: the caller's contract: `dst` is valid for `len` writes, and nobody
            // else's, until this synchronous copy returns.
            let out = unsafe { std::slice::from_raw_parts_mut(dst, len) };
            let request = Request::ReadStream {
                device: self.remote,
                src: src.0,
                len: len as u64,
                chunk: offload_mpi::wire::chunk_for(len) as u64,
            };
            let answer = self.client.read_stream(self.rank, &request, out);
            return self.expect_done(request.name(), answer);
        }
        let Some(q) = queue else {
            let request = Request::Read {
                device: self.remote,
                src: src.0,
                len: len as u64,
                queue: None,
            };
            return match self.call(request)? {
                Reply::Bytes { bytes } if bytes.len() == len => {
                    if len > 0 {
                        // SAFETY: the caller's contract: `dst` is valid for `len` writes.
                        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst, len) };
                    }
                    Ok(())
                }
                Reply::Bytes { bytes } => Err(Error::DeviceFailure(format!(
                    "{}: proxy rank {} sent {} bytes for a copy from the device of {len} bytes",
                    self.address,
                    self.rank,
                    bytes.len()
                ))),
                other => Err(self.unexpected("copy from the device", &other)),
            };
        };
        // Queued: one read per piece of at most MAX_MESSAGE bytes, each landing at its place.
        let mut queues = lock(&self.queues);
        let mut at = 0;
        loop {
            let n = (len - at).min(offload_mpi::wire::MAX_MESSAGE);
            let id = self.post(&Request::Read {
                device: self.remote,
                src: src.offset(at as u64)?.0,
                len: n as u64,
                queue: Some(q.0),
            })?;
            queues.reads.entry(q.0).or_default().push(QueuedRead {
                id,
                dst: dst as usize + at,
                len: n,
            });
            at += n;
            if at >= len {
                return Ok(());
            }
        }
    }

    unsafe fn copy_device_to_device(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: u64,
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let request = Request::Copy {
            device: self.remote,
            dst: dst.0,
            src: src.0,
            len,
            queue: queue.map(|q| q.0),
        };
        match queue {
            None => self.done(request),
            Some(_) => self.post(&request).map(drop),
        }
    }

    unsafe fn launch(
        &self,
        kernel: KernelHandle,
        dims: &LaunchDims,
        args: &[KernelArg],
        queue: Option<QueueHandle>,
    ) -> Result<()> {
        let request = Request::Launch {
            device: self.remote,
            kernel: kernel.0,
            dims: *dims,
            args: args.to_vec(),
            queue: queue.map(|q| q.0),
        };
        match queue {
            None => self.done(request),
            Some(_) => self.post(&request).map(drop),
        }
    }

    fn queue_create(&self) -> Result<QueueHandle> {
        self.value(Request::QueueCreate {
            device: self.remote,
        })
        .map(QueueHandle)
    }

    fn queue_synchronize(&self, queue: QueueHandle) -> Result<()> {
        self.drain(
            Request::QueueSync {
                device: self.remote,
                queue: queue.0,
            },
            queue.0,
        )
    }

    fn queue_destroy(&self, queue: QueueHandle) -> Result<()> {
        self.drain(
            Request::QueueDestroy {
                device: self.remote,
                queue: queue.0,
            },
            queue.0,
        )
    }

    fn event_create(&self) -> Result<EventHandle> {
        self.value(Request::EventCreate {
            device: self.remote,
        })
        .map(EventHandle)
    }

    fn event_record(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        let mut q = lock(&self.queues);
        self.post(&Request::EventRecord {
            device: self.remote,
            event: event.0,
            queue: queue.0,
        })?;
        let before = q
            .reads
            .get(&queue.0)
            .map(|r| r.iter().map(|r| r.id).collect())
            .unwrap_or_default();
        q.events.insert(event.0, (queue.0, before));
        Ok(())
    }

    fn event_wait(&self, event: EventHandle, queue: QueueHandle) -> Result<()> {
        self.post(&Request::EventWait {
            device: self.remote,
            event: event.0,
            queue: queue.0,
        })
        .map(drop)
    }

    fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        let request = Request::EventSync {
            device: self.remote,
            event: event.0,
        };
        let (id, reads) = {
            let mut q = lock(&self.queues);
            let id = self.post(&request)?;
            (id, self.reads_before(&mut q, event.0))
        };
        let landed = self.land(reads);
        match self.wait(id, "event synchronize")? {
            Reply::Done => landed,
            other => Err(self.unexpected("event synchronize", &other)),
        }
    }

    fn event_query(&self, event: EventHandle) -> Result<bool> {
        let mut q = lock(&self.queues);
        let id = self.post(&Request::EventQuery {
            device: self.remote,
            event: event.0,
        })?;
        let complete = match self.wait(id, "event query")? {
            Reply::Value { value } => value == 1,
            other => return Err(self.unexpected("event query", &other)),
        };
        if complete {
            // The proxy sent the bytes of the reads before the event's record with its
            // answer; they are written before the program learns the event completed.
            let reads = self.reads_before(&mut q, event.0);
            drop(q);
            self.land(reads)?;
        }
        Ok(complete)
    }

    fn event_destroy(&self, event: EventHandle) -> Result<()> {
        lock(&self.queues).events.remove(&event.0);
        self.done(Request::EventDestroy {
            device: self.remote,
            event: event.0,
        })
    }

    fn event_elapsed(&self, start: EventHandle, end: EventHandle) -> Result<Duration> {
        self.value(Request::EventElapsed {
            device: self.remote,
            start: start.0,
            end: end.0,
        })
        .map(Duration::from_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload_core::ErrorKind;

    #[test]
    fn outside_a_job_there_is_no_device_a_reason_and_no_mpi() {
        // (Run outside any launcher, as the suite runs it: under mpirun this process would be
        // a rank of a job.)
        let plugin = MpiPlugin::new();
        let e = plugin.init().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoDevice, "{e}");
        assert!(e.to_string().contains("not in an MPI job"), "{e}");
        // Asked again (the runtime asks for claims, images and devices): the same answer,
        // and still no MPI.
        assert!(plugin.image_claims().is_empty());
        assert!(plugin.check_image(b"\x7fELF").is_err());
        assert!(plugin.device(0).is_err());
        assert!(!mpi::environment::is_initialized());
    }
}
