//! The proxy's side: a node's devices behind the messages of [`crate::wire`].
//!
//! Each request is served by the node's own device (the generic device layer of its plugin),
//! which checks every address, range and handle the request carries against what it handed
//! out: an unknown handle, a range outside a live allocation or a corrupted message is a
//! [`Reply::Failed`], never a crash. An image is loaded by the node's device, so JIT input is
//! compiled here, for this node's devices, through this node's JIT cache.
//!
//! Work on a queue is enqueued on the device's own queue and not answered: the bytes it
//! writes stay here until the queue has run it, the first error is kept for the queue's
//! synchronisation, and a queued read's bytes are sent back before the reply to the
//! synchronisation that completes it (of the queue, or of an event recorded after it).

use crate::wire::{RemoteDevice, Reply, Request, VERSION};
use offload_core::{
    DevicePtr, Error, ErrorKind, EventHandle, GenericDevice, KernelHandle, MemoryKind,
    ProgramHandle, QueueHandle, Result,
};
use std::collections::HashMap;
use std::sync::Arc;

/// A device the proxy serves: its plugin's name, its index there, and the device.
#[derive(Clone)]
pub struct Served {
    /// The plugin's name ("host", "cuda").
    pub plugin: String,
    /// The device's index in its plugin.
    pub index: usize,
    /// The image kinds its plugin serves.
    pub claims: Vec<offload_core::ImageClaim>,
    /// The device.
    pub device: Arc<dyn GenericDevice>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Served({}:{})", self.plugin, self.index)
    }
}

/// Write streams from this size on copy to the device on a second thread (see
/// [`Server::write_stream`]).
const THREADED_FROM: u64 = 16 << 20;

/// What a queue of a device has pending on the proxy.
#[derive(Debug, Default)]
struct Pending {
    /// Bytes queued copies read from, kept until the queue has run them (the queue's
    /// synchronisation, or an event's recorded after them); `held_base` counts those already
    /// let go, so an event can name the ones before its record.
    held: std::collections::VecDeque<Vec<u8>>,
    held_base: u64,
    /// Queued reads: the request's id and the bytes the device writes.
    reads: Vec<(u64, Vec<u8>)>,
    /// Buffers of reads already answered (failed) that the device may still write: kept until
    /// the queue's synchronisation.
    retired: Vec<Vec<u8>>,
    /// The first error met enqueueing work.
    error: Option<Error>,
}

/// How a stream's chunks travel (MPI in the proxy; a test's own in tests).
pub trait Data {
    /// The next chunk of the write stream being served, into `buf` (the chunk's length): an
    /// error if none comes within the proxy's timeout, or one of another length.
    fn receive(&mut self, buf: &mut [u8]) -> Result<()>;
    /// Sends the chunks of a read stream, of lengths `lens` in order, each filled by `fill`
    /// (its offset in the stream, its bytes) just before it goes, while earlier ones are still
    /// on their way; stops after a chunk `fill` fails, and always ends with an empty chunk.
    fn send(
        &mut self,
        lens: &mut dyn Iterator<Item = (u64, usize)>,
        fill: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    );
    /// Sends the chunks of a read stream straight from `memory` (device memory this process
    /// addresses), cut at `lens`, then the empty chunk; returns once nothing reads `memory`
    /// any more. Where a chunk is not taken in time, the implementation makes sure nobody
    /// frees `memory` while it may still be read (the proxy ends).
    fn send_from(&mut self, lens: &mut dyn Iterator<Item = (u64, usize)>, memory: &[u8]);
}

/// An event's record: its queue, the reads queued there before it, how many held buffers
/// precede it, and the record's error (the reads before a failed record fail with it).
#[derive(Debug, Clone)]
struct Mark {
    queue: u64,
    reads: Vec<u64>,
    held_upto: u64,
    recorded: Option<Error>,
}

/// What a proxy serves: its node's devices and what their queues have pending.
#[derive(Debug)]
pub struct Server {
    /// Buffers of write streams, reused.
    pool: Vec<Vec<u8>>,
    devices: Vec<Served>,
    queues: HashMap<(u32, u64), Pending>,
    /// Each recorded event: what was queued before its record.
    events: HashMap<(u32, u64), Mark>,
}

impl Server {
    /// Serves `devices` (in this order: their indices in the hello).
    pub fn new(devices: Vec<Served>) -> Server {
        Server {
            pool: Vec::new(),
            devices,
            queues: HashMap::new(),
            events: HashMap::new(),
        }
    }

    /// The hello: this side's version and devices.
    pub fn hello(&self) -> Result<Reply> {
        let devices = self
            .devices
            .iter()
            .map(|d| {
                Ok(RemoteDevice {
                    plugin: d.plugin.clone(),
                    index: d.index as u32,
                    claims: d.claims.iter().map(|c| c.to_text()).collect(),
                    info: d.device.info()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Reply::Hello {
            version: VERSION,
            devices,
        })
    }

    /// Answers one message: the replies' bytes, in order (none for work on a queue). A message
    /// that does not decode is answered with the error (id 0: its own id cannot be trusted).
    pub fn answer(&mut self, message: &[u8], data: &mut dyn Data) -> Vec<Vec<u8>> {
        let (id, request) = match Request::decode(message) {
            Ok(r) => r,
            Err(e) => return vec![Reply::failed(&e).encode(0)],
        };
        let mut replies = Vec::new();
        let answered = request.answered();
        let queue = queue_of(&request);
        let queued_read = matches!(request, Request::Read { queue: Some(_), .. });
        match self.serve(id, request, &mut replies, data) {
            Ok(reply) if answered => replies.push(reply.encode(id)),
            Ok(_) => {}
            Err(e) if answered => replies.push(Reply::failed(&e).encode(id)),
            // Work on a queue: the first error waits for the queue's synchronisation.
            // A queued read the device refused is answered now: the program waits for its
            // bytes at the synchronisation, and they will never come.
            Err(e) => {
                if queued_read {
                    replies.push(Reply::failed(&e).encode(id));
                }
                if let Some(key) = queue {
                    self.queues.entry(key).or_default().error.get_or_insert(e);
                }
            }
        }
        replies
    }

    fn device(&self, device: u32) -> Result<&Arc<dyn GenericDevice>> {
        self.devices
            .get(device as usize)
            .map(|d| &d.device)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "device {device}: this proxy has {} device(s)",
                    self.devices.len()
                ))
            })
    }

    /// Sends back the bytes of the reads `ids` queued on `key` (those still pending), or
    /// their failure.
    /// `drained`: the queue has run everything before (its synchronisation returned): a failed
    /// read's buffer can go. Else (an event's synchronisation failed) the device may still
    /// write it, and it is kept until the queue's synchronisation.
    fn flush_reads(
        &mut self,
        key: (u32, u64),
        ids: Option<&[u64]>,
        outcome: &Result<()>,
        drained: bool,
        replies: &mut Vec<Vec<u8>>,
    ) {
        let Some(p) = self.queues.get_mut(&key) else {
            return;
        };
        let (done, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut p.reads)
            .into_iter()
            .partition(|(id, _)| ids.is_none_or(|ids| ids.contains(id)));
        p.reads = kept;
        for (id, bytes) in done {
            replies.push(match outcome {
                Ok(()) => Reply::Bytes { bytes }.encode(id),
                Err(e) => {
                    let reply = Reply::failed(e).encode(id);
                    if drained {
                        keep_if_unsettled(e, bytes);
                    } else {
                        p.retired.push(bytes);
                    }
                    reply
                }
            });
        }
    }

    /// A queue's outcome at its synchronisation: the first enqueue error, else the device's.
    fn settle(&mut self, key: (u32, u64), synced: Result<()>) -> Result<()> {
        let p = self.queues.entry(key).or_default();
        let first = p.error.take();
        let held = std::mem::take(&mut p.held);
        p.held_base += held.len() as u64;
        let retired = std::mem::take(&mut p.retired);
        match &synced {
            Err(e) => held
                .into_iter()
                .chain(retired)
                .for_each(|b| keep_if_unsettled(e, b)),
            Ok(()) => drop((held, retired)),
        }
        match first {
            Some(e) => Err(e),
            None => synced,
        }
    }

    fn serve(
        &mut self,
        id: u64,
        request: Request,
        replies: &mut Vec<Vec<u8>>,
        data: &mut dyn Data,
    ) -> Result<Reply> {
        let done = |r: Result<()>| r.map(|()| Reply::Done);
        match request {
            Request::Hello => self.hello(),
            Request::CheckImage { device, image } => done(self.device(device)?.check_image(&image)),
            Request::Load { device, image } => {
                // SAFETY: the image is the program's, which the job runs as its own code: the
                // proxy runs it for the program on this node as the program would locally.
                let p = unsafe { self.device(device)?.load_image(&image)? };
                Ok(Reply::Value { value: p.0 })
            }
            Request::Unload { device, program } => {
                // SAFETY: the program's side holds no address into it after unloading (its
                // own unload's contract, which it passes on).
                done(unsafe { self.device(device)?.unload_image(ProgramHandle(program)) })
            }
            Request::Kernel {
                device,
                program,
                name,
            } => {
                let k = self.device(device)?.kernel(ProgramHandle(program), &name)?;
                Ok(Reply::Value { value: k.0 })
            }
            Request::Global {
                device,
                program,
                name,
            } => {
                let g = self.device(device)?.global(ProgramHandle(program), &name)?;
                Ok(Reply::Global {
                    ptr: g.ptr.0,
                    size: g.size,
                })
            }
            Request::Alloc {
                device,
                bytes,
                kind,
            } => {
                let p = self
                    .device(device)?
                    .alloc(bytes, MemoryKind::from_u32(kind)?)?;
                Ok(Reply::Value { value: p.0 })
            }
            Request::Free { device, ptr } => {
                // SAFETY: the layer refuses an address it did not hand out or already freed,
                // and keeps memory until the queued work that uses it has run; the program's
                // side uses the allocation no more (its free's contract).
                done(unsafe { self.device(device)?.free(DevicePtr(ptr)) })
            }
            Request::Write {
                device,
                dst,
                queue,
                bytes,
            } => {
                let d = self.device(device)?.clone();
                // SAFETY: `bytes` is live for `bytes.len()` bytes; with a queue it is held in
                // the queue's pending list (its heap block does not move) until the queue is
                // synchronised. The layer checks that the destination lies in a live
                // allocation of the device.
                unsafe {
                    d.copy_to_device(
                        DevicePtr(dst),
                        bytes.as_ptr(),
                        bytes.len(),
                        queue.map(QueueHandle),
                    )?
                };
                if let Some(q) = queue {
                    self.queues
                        .entry((device, q))
                        .or_default()
                        .held
                        .push_back(bytes);
                }
                Ok(Reply::Done)
            }
            Request::Read {
                device,
                src,
                len,
                queue,
            } => {
                let d = self.device(device)?.clone();
                if len > crate::wire::MAX_MESSAGE as u64 {
                    return Err(Error::InvalidArgument(format!(
                        "a read of {len} bytes in one message (at most {} bytes; larger reads \
                         are streams)",
                        crate::wire::MAX_MESSAGE
                    )));
                }
                let len = len as usize;
                let mut bytes = Vec::new();
                bytes.try_reserve_exact(len).map_err(|_| {
                    Error::OutOfMemory(format!("no room on the proxy for a read of {len} bytes"))
                })?;
                bytes.resize(len, 0);
                // SAFETY: `bytes` is writable for `len` bytes; with a queue it is kept in the
                // queue's pending reads (its heap block does not move) until the queue or an
                // event after it is synchronised, and nobody else touches it. The layer checks
                // the source range.
                unsafe {
                    d.copy_from_device(
                        bytes.as_mut_ptr(),
                        DevicePtr(src),
                        len,
                        queue.map(QueueHandle),
                    )?
                };
                match queue {
                    None => Ok(Reply::Bytes { bytes }),
                    Some(q) => {
                        self.queues
                            .entry((device, q))
                            .or_default()
                            .reads
                            .push((id, bytes));
                        Ok(Reply::Done)
                    }
                }
            }
            Request::Copy {
                device,
                dst,
                src,
                len,
                queue,
            } => {
                // SAFETY: the layer checks that both ranges lie in live allocations of this
                // device; that nobody else uses the destination meanwhile is the program's
                // promise, passed on from its own copy.
                done(unsafe {
                    self.device(device)?.copy_device_to_device(
                        DevicePtr(dst),
                        DevicePtr(src),
                        len,
                        queue.map(QueueHandle),
                    )
                })
            }
            Request::Launch {
                device,
                kernel,
                dims,
                args,
                queue,
            } => {
                // SAFETY: the program's launch contract (pointers into live memory as long as
                // the kernel touches, arguments that are the kernel's parameters), passed on
                // from its own launch; the layer checks handles, the shape and what the
                // kernel declares.
                done(unsafe {
                    self.device(device)?.launch(
                        KernelHandle(kernel),
                        &dims,
                        &args,
                        queue.map(QueueHandle),
                    )
                })
            }
            Request::QueueCreate { device } => {
                let q = self.device(device)?.queue_create()?;
                Ok(Reply::Value { value: q.0 })
            }
            Request::QueueSync { device, queue } | Request::QueueDestroy { device, queue } => {
                let d = self.device(device)?.clone();
                let destroy = matches!(request, Request::QueueDestroy { .. });
                let synced = if destroy {
                    d.queue_destroy(QueueHandle(queue))
                } else {
                    d.queue_synchronize(QueueHandle(queue))
                };
                let key = (device, queue);
                self.flush_reads(key, None, &synced, true, replies);
                let outcome = self.settle(key, synced);
                if destroy {
                    self.queues.remove(&key);
                }
                done(outcome)
            }
            Request::EventCreate { device } => {
                let e = self.device(device)?.event_create()?;
                Ok(Reply::Value { value: e.0 })
            }
            Request::EventRecord {
                device,
                event,
                queue,
            } => {
                let recorded = self
                    .device(device)
                    .and_then(|d| d.event_record(EventHandle(event), QueueHandle(queue)));
                // Marked whatever happened: the program counts on the reads before it.
                let p = self.queues.entry((device, queue)).or_default();
                let mark = Mark {
                    queue,
                    reads: p.reads.iter().map(|(id, _)| *id).collect(),
                    held_upto: p.held_base + p.held.len() as u64,
                    recorded: recorded.clone().err(),
                };
                self.events.insert((device, event), mark);
                recorded.map(|()| Reply::Done)
            }
            Request::EventWait {
                device,
                event,
                queue,
            } => done(
                self.device(device)?
                    .event_wait(EventHandle(event), QueueHandle(queue)),
            ),
            Request::EventSync { device, event } => {
                let synced = self.device(device)?.event_synchronize(EventHandle(event));
                self.flush_event(device, event, &synced, replies);
                done(synced)
            }
            Request::EventQuery { device, event } => {
                let complete = self.device(device)?.event_query(EventHandle(event))?;
                if complete {
                    self.flush_event(device, event, &Ok(()), replies);
                }
                Ok(Reply::Value {
                    value: u64::from(complete),
                })
            }
            Request::EventDestroy { device, event } => {
                self.events.remove(&(device, event));
                done(self.device(device)?.event_destroy(EventHandle(event)))
            }
            Request::WriteStream {
                device,
                dst,
                len,
                chunk,
            } => self.write_stream(device, dst, len, chunk, data),
            Request::ReadStream {
                device,
                src,
                len,
                chunk,
            } => {
                let d = self.device(device).cloned();
                if let Ok(d) = &d {
                    // Memory this process addresses (the host's devices) is sent as it is,
                    // with no copy before it.
                    let mut visited = false;
                    // SAFETY: the visit only reads the range it is given, and `send_from`
                    // returns once nothing reads it any more.
                    let direct = unsafe {
                        d.host_access(DevicePtr(src), len, &mut |at| {
                            visited = true;
                            let memory = std::slice::from_raw_parts(at.cast_const(), len as usize);
                            data.send_from(&mut crate::wire::chunks(len, chunk), memory);
                            Ok(())
                        })
                    };
                    if visited {
                        return direct.map(|()| Reply::Done);
                    }
                    // Else memory the process does not address, or a range refused: the
                    // copies below, which end the stream and say why.
                }
                let mut first = None;
                data.send(&mut crate::wire::chunks(len, chunk), &mut |at, buf| {
                    let outcome = d.as_ref().map_err(Clone::clone).and_then(|d| {
                        let from = DevicePtr(src).offset(at)?;
                        // SAFETY: `buf` is writable for its length and the copy is synchronous;
                        // the layer checks the source range.
                        unsafe { d.copy_from_device(buf.as_mut_ptr(), from, buf.len(), None) }
                    });
                    if let Err(e) = &outcome {
                        first = Some(e.clone());
                    }
                    outcome
                });
                first.map_or(Ok(Reply::Done), Err)
            }
            Request::EventElapsed { device, start, end } => {
                let t = self
                    .device(device)?
                    .event_elapsed(EventHandle(start), EventHandle(end))?;
                Ok(Reply::Value {
                    value: u64::try_from(t.as_nanos()).unwrap_or(u64::MAX),
                })
            }
        }
    }

    /// A write stream: received straight into device memory this process addresses
    /// ([`GenericDevice::host_access`]); else each chunk is copied to the device by a second
    /// thread while the next one arrives. Every chunk is received whatever the device does
    /// (the stream stays in step with the program); after the device's first error the rest
    /// are dropped, and the error is the reply. A chunk that does not come in time, or of
    /// another length, ends the stream there (the program broke it: its later chunks, if any,
    /// are not waited for).
    fn write_stream(
        &mut self,
        device: u32,
        dst: u64,
        len: u64,
        chunk: u64,
        data: &mut dyn Data,
    ) -> Result<Reply> {
        let (d, refused) = match self.device(device) {
            Ok(d) => (Some(d.clone()), None),
            Err(e) => (None, Some(e)),
        };
        if let Some(d) = &d {
            // Memory this process addresses (the host's devices) takes the chunks as they
            // arrive, with no copy after them.
            let mut visited = false;
            // SAFETY: the visit writes only the range it is given (the chunks cut `len`), and
            // keeps no pointer into it: every receive has completed when it returns.
            let direct = unsafe {
                d.host_access(DevicePtr(dst), len, &mut |at| {
                    visited = true;
                    for (off, n) in crate::wire::chunks(len, chunk) {
                        // `off + n <= len`: inside the visited range.
                        let part = std::slice::from_raw_parts_mut(at.add(off as usize), n);
                        data.receive(part)?;
                    }
                    Ok(())
                })
            };
            if visited {
                return direct.map(|()| Reply::Done);
            }
            // Else memory the process does not address, or a range refused: the copies below,
            // which take every chunk and say why.
        }
        if len < THREADED_FROM {
            // Below this size handing chunks to a thread costs more than it overlaps.
            return self.write_stream_inline(d, refused, dst, len, chunk, data);
        }
        let mut pool = std::mem::take(&mut self.pool);
        pool.resize_with(3, Vec::new);
        let (to_copy, copying) = std::sync::mpsc::channel::<(u64, Vec<u8>, usize)>();
        let (to_reuse, reusable) = std::sync::mpsc::channel::<Vec<u8>>();
        let outcome = std::thread::scope(|s| {
            let copier = s.spawn(move || {
                let mut first: Option<Error> = refused;
                for (at, buf, n) in copying {
                    if first.is_none()
                        && let Some(d) = &d
                    {
                        let copied = DevicePtr(dst).offset(at).and_then(|to| {
                            // SAFETY: `buf` holds `n` received bytes and the copy is synchronous;
                            // the layer checks the destination range.
                            unsafe { d.copy_to_device(to, buf.as_ptr(), n, None) }
                        });
                        if let Err(e) = copied {
                            first = Some(e);
                        }
                    }
                    if to_reuse.send(buf).is_err() {
                        break;
                    }
                }
                first
            });
            let mut received = Ok(());
            for (at, n) in crate::wire::chunks(len, chunk) {
                let mut buf = match pool.pop() {
                    Some(b) => b,
                    None => match reusable.recv() {
                        Ok(b) => b,
                        Err(_) => break,
                    },
                };
                buf.resize(n.max(buf.len()), 0);
                if let Err(e) = data.receive(&mut buf[..n]) {
                    // The program stopped sending: the stream ends here.
                    received = Err(e);
                    pool.push(buf);
                    break;
                }
                if to_copy.send((at, buf, n)).is_err() {
                    break;
                }
            }
            drop(to_copy);
            let copied = copier.join().unwrap_or_else(|_| {
                Some(Error::DeviceFailure(
                    "the stream's copy thread panicked".into(),
                ))
            });
            received.and(copied.map_or(Ok(()), Err))
        });
        pool.extend(reusable.try_iter());
        pool.truncate(3);
        self.pool = pool;
        outcome.map(|()| Reply::Done)
    }

    /// [`Server::write_stream`] on this thread: each chunk copied to the device as it arrives.
    fn write_stream_inline(
        &mut self,
        d: Option<Arc<dyn GenericDevice>>,
        refused: Option<Error>,
        dst: u64,
        len: u64,
        chunk: u64,
        data: &mut dyn Data,
    ) -> Result<Reply> {
        let mut first = refused;
        let mut buf = self.pool.pop().unwrap_or_default();
        for (at, n) in crate::wire::chunks(len, chunk) {
            buf.resize(n.max(buf.len()), 0);
            if let Err(e) = data.receive(&mut buf[..n]) {
                first.get_or_insert(e);
                break;
            }
            if first.is_none()
                && let Some(d) = &d
            {
                let copied = DevicePtr(dst).offset(at).and_then(|to| {
                    // SAFETY: `buf` holds `n` received bytes and the copy is synchronous; the
                    // layer checks the destination range.
                    unsafe { d.copy_to_device(to, buf.as_ptr(), n, None) }
                });
                if let Err(e) = copied {
                    first = Some(e);
                }
            }
        }
        self.pool.push(buf);
        first.map_or(Ok(Reply::Done), Err)
    }

    /// After an event completed: the bytes of the reads queued before its record.
    fn flush_event(
        &mut self,
        device: u32,
        event: u64,
        outcome: &Result<()>,
        replies: &mut Vec<Vec<u8>>,
    ) {
        let Some(mark) = self.events.get(&(device, event)).cloned() else {
            return;
        };
        let outcome = match mark.recorded {
            Some(e) => Err(e),
            None => outcome.clone(),
        };
        let drained = outcome.is_ok();
        self.flush_reads(
            (device, mark.queue),
            Some(&mark.reads),
            &outcome,
            drained,
            replies,
        );
        // The queue has run the copies before the event: their bytes can go.
        if outcome.is_ok()
            && let Some(p) = self.queues.get_mut(&(device, mark.queue))
        {
            while p.held_base < mark.held_upto && p.held.pop_front().is_some() {
                p.held_base += 1;
            }
        }
    }
}

/// The queue a request's work goes on, if any (where its enqueue error is kept).
fn queue_of(request: &Request) -> Option<(u32, u64)> {
    match *request {
        Request::Write {
            device,
            queue: Some(q),
            ..
        }
        | Request::Read {
            device,
            queue: Some(q),
            ..
        }
        | Request::Copy {
            device,
            queue: Some(q),
            ..
        }
        | Request::Launch {
            device,
            queue: Some(q),
            ..
        } => Some((device, q)),
        Request::EventRecord { device, queue, .. } | Request::EventWait { device, queue, .. } => {
            Some((device, queue))
        }
        _ => None,
    }
}

/// Memory a device may still write after an unsettled operation (a copy that never
/// finished) is never freed: it is leaked, as the layer leaks its own staging.
fn keep_if_unsettled(e: &Error, bytes: Vec<u8>) {
    if e.kind() == ErrorKind::Unsettled {
        std::mem::forget(bytes);
    }
}
