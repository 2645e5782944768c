//! The messages between the program's side (the `mpi` plugin, or any [`crate::client`]) and a
//! proxy rank: each a header and a payload, little-endian.
//!
//! ```text
//! header   magic u32 "OFMP" | version u16 | kind u16 | id u64 | payload length u64
//! ```
//!
//! A request names its device by its index in the proxy's hello; device memory by the
//! proxy's own device addresses, programs, kernels, queues and events by the proxy's own
//! handles. All of them are numbers the program's side never interprets (it adds offsets to
//! addresses, as OpenMP does) and the proxy checks every one against what it handed out.
//! Integers are fixed-width, byte strings and texts a u64 length and the bytes, an optional
//! queue a byte (0 or 1) and the handle.
//!
//! Decoding checks every length against what is left and every value against its field, and
//! names the field and the byte offset it stopped at: a message from a peer of another
//! version, or corrupted bytes, is an error, never a panic. A message that decodes encodes
//! back to the same bytes.
//!
//! **Replies.** A request on a queue ([`Request::answered`] is false) gets no reply: the proxy
//! enqueues it and keeps the first error for the queue's synchronisation. A queued read's
//! bytes come back as a [`Reply::Bytes`] carrying the read's id, before the reply to the
//! synchronisation (of the queue, or of an event recorded after the read) that completes it.
//!
//! **Output.** What the proxy's node printed to its standard output while it served requests
//! (a kernel's `printf`, a target region's) comes as a [`Reply::Output`] before the next
//! reply: the program writes it to its own standard output, so that a region's lines come in
//! the order they would locally, between the program's own.

use offload_core::{DeviceInfo, DeviceLimits, Error, KernelArg, LaunchDims, Result};

/// "OFMP", little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"OFMP");
/// The message format's version: the plugin and its proxies must agree.
pub const VERSION: u16 = 3;
/// Bytes before the payload.
pub const HEADER: usize = 4 + 2 + 2 + 8 + 8;
/// The largest text a message carries (a device name, an error message, a kernel's name).
const MAX_TEXT: u64 = 1 << 16;
/// The most devices one proxy reports, image kinds per device, and arguments per launch.
const MAX_DEVICES: u64 = 1 << 10;
const MAX_CLAIMS: u64 = 64;
const MAX_ARGS: u64 = 1 << 16;
/// The sizes a stream's chunks may have.
pub const MIN_CHUNK: u64 = 4 << 10;
/// See [`MIN_CHUNK`].
pub const MAX_CHUNK: u64 = 64 << 20;
/// The most bytes one message carries: a larger queued copy is sent in pieces, a larger
/// synchronous one as a stream, and a proxy refuses a single read of more.
pub const MAX_MESSAGE: usize = 64 << 20;
/// Synchronous copies from this size on are streams ([`Request::WriteStream`],
/// [`Request::ReadStream`]).
pub const STREAM_FROM: usize = 256 << 10;

/// The chunk a stream of `len` bytes is cut into: 256 KiB whatever its length. A chunk the
/// program has just copied into its buffer is still in its cache when the proxy's MPI reads
/// it, and four are in flight. Measured here (benches/mpi_remote.rs, 2 vCPUs, shared memory),
/// writes of 16 MiB to 256 MiB moved 1.3-1.5x MPI's bandwidth with 256 KiB, 1.0-1.2x with
/// 512 KiB and 0.9-1.2x with an eighth of the stream (up to 4 MiB); 1 MiB did best with
/// 256 KiB too. Across a network larger chunks may do better.
pub fn chunk_for(len: usize) -> usize {
    let _ = len;
    STREAM_CHUNK
}

/// See [`chunk_for`].
const STREAM_CHUNK: usize = 256 << 10;

/// The chunks of a stream of `len` bytes cut at `chunk`: (offset, length) each.
pub fn chunks(len: u64, chunk: u64) -> impl Iterator<Item = (u64, usize)> {
    (0..len.div_ceil(chunk)).map(move |k| (k * chunk, (len - k * chunk).min(chunk) as usize))
}

/// A device of a proxy's node, as the proxy reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteDevice {
    /// The plugin serving it on the proxy's node ("host", "cuda", ...).
    pub plugin: String,
    /// Its index in that plugin.
    pub index: u32,
    /// The image kinds its plugin serves ([`offload_core::ImageClaim::to_text`]).
    pub claims: Vec<String>,
    /// What the device says of itself on its node.
    pub info: DeviceInfo,
}

impl RemoteDevice {
    /// Its address in the job: `mpi:<rank>/<plugin>:<index>`.
    pub fn address(&self, rank: i32) -> String {
        format!("mpi:{rank}/{}:{}", self.plugin, self.index)
    }
}

/// What the program's side asks of a proxy. `device` is an index into the proxy's hello;
/// `queue: None` is a synchronous operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// Say the version and the devices.
    Hello,
    /// Whether the device can run an image.
    CheckImage { device: u32, image: Vec<u8> },
    /// Load an image (JIT input is compiled on the proxy's node) → [`Reply::Value`]: the program.
    Load { device: u32, image: Vec<u8> },
    /// Unload a program.
    Unload { device: u32, program: u64 },
    /// Look a kernel up → [`Reply::Value`]: the kernel.
    Kernel {
        device: u32,
        program: u64,
        name: String,
    },
    /// Look a global up → [`Reply::Global`].
    Global {
        device: u32,
        program: u64,
        name: String,
    },
    /// Allocate → [`Reply::Value`]: the device address. `kind` is a
    /// [`offload_core::MemoryKind`] code.
    Alloc { device: u32, bytes: u64, kind: u32 },
    /// Free an allocation.
    Free { device: u32, ptr: u64 },
    /// Copy the bytes to device memory at `dst`.
    Write {
        device: u32,
        dst: u64,
        queue: Option<u64>,
        bytes: Vec<u8>,
    },
    /// Copy `len` bytes at `src` back → [`Reply::Bytes`].
    Read {
        device: u32,
        src: u64,
        len: u64,
        queue: Option<u64>,
    },
    /// Copy between two ranges of the device's memory.
    Copy {
        device: u32,
        dst: u64,
        src: u64,
        len: u64,
        queue: Option<u64>,
    },
    /// Launch a kernel.
    Launch {
        device: u32,
        kernel: u64,
        dims: LaunchDims,
        args: Vec<KernelArg>,
        queue: Option<u64>,
    },
    /// Create a queue → [`Reply::Value`].
    QueueCreate { device: u32 },
    /// Wait for a queue; its queued reads' bytes come first.
    QueueSync { device: u32, queue: u64 },
    /// Drain and destroy a queue; its queued reads' bytes come first.
    QueueDestroy { device: u32, queue: u64 },
    /// Create an event → [`Reply::Value`].
    EventCreate { device: u32 },
    /// Record an event on a queue (no reply).
    EventRecord { device: u32, event: u64, queue: u64 },
    /// Make a queue wait for an event (no reply).
    EventWait { device: u32, event: u64, queue: u64 },
    /// Wait for an event; the bytes of the reads queued before its record come first.
    EventSync { device: u32, event: u64 },
    /// Whether an event completed → [`Reply::Value`] 0 or 1 (when 1, the bytes of the reads
    /// queued before its record come first).
    EventQuery { device: u32, event: u64 },
    /// Destroy an event.
    EventDestroy { device: u32, event: u64 },
    /// The time between two completed events → [`Reply::Value`]: nanoseconds.
    EventElapsed { device: u32, start: u64, end: u64 },
    /// A synchronous copy of `len` bytes to device memory at `dst`, whose bytes follow as
    /// [`crate::TAG_DATA`] messages of `chunk` bytes each (the last one the rest): the proxy
    /// copies one chunk to the device while the next one arrives.
    WriteStream {
        device: u32,
        dst: u64,
        len: u64,
        chunk: u64,
    },
    /// A synchronous copy of `len` bytes at `src` back, sent as [`crate::TAG_DATA`] messages of
    /// `chunk` bytes each before the reply: up to the first chunk the device could not read,
    /// then an empty one that ends the stream; the reply says whether all came.
    ReadStream {
        device: u32,
        src: u64,
        len: u64,
        chunk: u64,
    },
}

/// What a proxy answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The proxy's message version and devices.
    Hello {
        version: u16,
        devices: Vec<RemoteDevice>,
    },
    /// A handle, an address, a count (what the request says it returns).
    Value { value: u64 },
    /// A global's address and size.
    Global { ptr: u64, size: u64 },
    /// Done.
    Done,
    /// The bytes a read asked for.
    Bytes { bytes: Vec<u8> },
    /// The request failed: the error's kind (offload's ABI kind) and message.
    Failed { kind: u16, message: String },
    /// What the proxy's node printed to its standard output since the last reply, sent before
    /// the next one (id 0: it answers no request).
    Output { bytes: Vec<u8> },
}

impl Request {
    fn kind(&self) -> u16 {
        match self {
            Request::Hello => 1,
            Request::CheckImage { .. } => 2,
            Request::Load { .. } => 3,
            Request::Unload { .. } => 4,
            Request::Kernel { .. } => 5,
            Request::Global { .. } => 6,
            Request::Alloc { .. } => 7,
            Request::Free { .. } => 8,
            Request::Write { .. } => 9,
            Request::Read { .. } => 10,
            Request::Copy { .. } => 11,
            Request::Launch { .. } => 12,
            Request::QueueCreate { .. } => 13,
            Request::QueueSync { .. } => 14,
            Request::QueueDestroy { .. } => 15,
            Request::EventCreate { .. } => 16,
            Request::EventRecord { .. } => 17,
            Request::EventWait { .. } => 18,
            Request::EventSync { .. } => 19,
            Request::EventQuery { .. } => 20,
            Request::EventDestroy { .. } => 21,
            Request::EventElapsed { .. } => 22,
            Request::WriteStream { .. } => 23,
            Request::ReadStream { .. } => 24,
        }
    }

    /// What the request is, for messages (`copy to the device`, `launch`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello => "hello",
            Request::CheckImage { .. } => "image check",
            Request::Load { .. } => "image load",
            Request::Unload { .. } => "image unload",
            Request::Kernel { .. } => "kernel lookup",
            Request::Global { .. } => "global lookup",
            Request::Alloc { .. } => "alloc",
            Request::Free { .. } => "free",
            Request::Write { .. } => "copy to the device",
            Request::Read { .. } => "copy from the device",
            Request::Copy { .. } => "device-to-device copy",
            Request::Launch { .. } => "launch",
            Request::QueueCreate { .. } => "queue create",
            Request::QueueSync { .. } => "queue synchronize",
            Request::QueueDestroy { .. } => "queue destroy",
            Request::EventCreate { .. } => "event create",
            Request::EventRecord { .. } => "event record",
            Request::EventWait { .. } => "event wait",
            Request::EventSync { .. } => "event synchronize",
            Request::EventQuery { .. } => "event query",
            Request::EventDestroy { .. } => "event destroy",
            Request::EventElapsed { .. } => "event elapsed time",
            Request::WriteStream { .. } => "copy to the device",
            Request::ReadStream { .. } => "copy from the device",
        }
    }

    /// Whether the proxy answers this request when it has served it. Work on a queue is not
    /// answered: it is enqueued, and its errors and a read's bytes come with a later
    /// synchronisation.
    pub fn answered(&self) -> bool {
        !matches!(
            self,
            Request::Write { queue: Some(_), .. }
                | Request::Read { queue: Some(_), .. }
                | Request::Copy { queue: Some(_), .. }
                | Request::Launch { queue: Some(_), .. }
                | Request::EventRecord { .. }
                | Request::EventWait { .. }
        )
    }

    /// The message for request `id`.
    pub fn encode(&self, id: u64) -> Vec<u8> {
        let mut w = Writer::new(self.kind(), id);
        match self {
            Request::Hello => {}
            Request::CheckImage { device, image } | Request::Load { device, image } => {
                w.u32(*device);
                w.bytes(image);
            }
            Request::Unload { device, program } => {
                w.u32(*device);
                w.u64(*program);
            }
            Request::Kernel {
                device,
                program,
                name,
            }
            | Request::Global {
                device,
                program,
                name,
            } => {
                w.u32(*device);
                w.u64(*program);
                w.text(name);
            }
            Request::Alloc {
                device,
                bytes,
                kind,
            } => {
                w.u32(*device);
                w.u64(*bytes);
                w.u32(*kind);
            }
            Request::Free { device, ptr } => {
                w.u32(*device);
                w.u64(*ptr);
            }
            Request::Write {
                device,
                dst,
                queue,
                bytes,
            } => {
                w.u32(*device);
                w.u64(*dst);
                w.queue(*queue);
                w.bytes(bytes);
            }
            Request::Read {
                device,
                src,
                len,
                queue,
            } => {
                w.u32(*device);
                w.u64(*src);
                w.u64(*len);
                w.queue(*queue);
            }
            Request::Copy {
                device,
                dst,
                src,
                len,
                queue,
            } => {
                w.u32(*device);
                w.u64(*dst);
                w.u64(*src);
                w.u64(*len);
                w.queue(*queue);
            }
            Request::Launch {
                device,
                kernel,
                dims,
                args,
                queue,
            } => {
                w.u32(*device);
                w.u64(*kernel);
                for v in dims.grid.iter().chain(&dims.block) {
                    w.u32(*v);
                }
                w.u32(dims.shared_mem_bytes);
                w.u64(args.len() as u64);
                for a in args {
                    let (kind, bits) = a.to_bits();
                    w.u32(kind);
                    w.u64(bits);
                }
                w.queue(*queue);
            }
            Request::QueueCreate { device } | Request::EventCreate { device } => w.u32(*device),
            Request::QueueSync { device, queue } | Request::QueueDestroy { device, queue } => {
                w.u32(*device);
                w.u64(*queue);
            }
            Request::EventRecord {
                device,
                event,
                queue,
            }
            | Request::EventWait {
                device,
                event,
                queue,
            } => {
                w.u32(*device);
                w.u64(*event);
                w.u64(*queue);
            }
            Request::EventSync { device, event }
            | Request::EventQuery { device, event }
            | Request::EventDestroy { device, event } => {
                w.u32(*device);
                w.u64(*event);
            }
            Request::EventElapsed { device, start, end } => {
                w.u32(*device);
                w.u64(*start);
                w.u64(*end);
            }
            Request::WriteStream {
                device,
                dst: at,
                len,
                chunk,
            }
            | Request::ReadStream {
                device,
                src: at,
                len,
                chunk,
            } => {
                w.u32(*device);
                w.u64(*at);
                w.u64(*len);
                w.u64(*chunk);
            }
        }
        w.finish()
    }

    /// A request and its id, from a message.
    pub fn decode(message: &[u8]) -> Result<(u64, Request)> {
        let (kind, id, mut r) = Reader::header(message)?;
        let r = &mut r;
        let request = match kind {
            1 => Request::Hello,
            2 => Request::CheckImage {
                device: r.u32("device")?,
                image: r.bytes("image", u64::MAX)?.to_vec(),
            },
            3 => Request::Load {
                device: r.u32("device")?,
                image: r.bytes("image", u64::MAX)?.to_vec(),
            },
            4 => Request::Unload {
                device: r.u32("device")?,
                program: r.u64("program")?,
            },
            5 => Request::Kernel {
                device: r.u32("device")?,
                program: r.u64("program")?,
                name: r.text("name")?,
            },
            6 => Request::Global {
                device: r.u32("device")?,
                program: r.u64("program")?,
                name: r.text("name")?,
            },
            7 => Request::Alloc {
                device: r.u32("device")?,
                bytes: r.u64("bytes")?,
                kind: r.u32("memory kind")?,
            },
            8 => Request::Free {
                device: r.u32("device")?,
                ptr: r.u64("ptr")?,
            },
            9 => Request::Write {
                device: r.u32("device")?,
                dst: r.u64("dst")?,
                queue: r.queue()?,
                bytes: r.bytes("bytes", u64::MAX)?.to_vec(),
            },
            10 => Request::Read {
                device: r.u32("device")?,
                src: r.u64("src")?,
                len: r.u64("len")?,
                queue: r.queue()?,
            },
            11 => Request::Copy {
                device: r.u32("device")?,
                dst: r.u64("dst")?,
                src: r.u64("src")?,
                len: r.u64("len")?,
                queue: r.queue()?,
            },
            12 => {
                let device = r.u32("device")?;
                let kernel = r.u64("kernel")?;
                let mut v = [0u32; 6];
                for (i, x) in v.iter_mut().enumerate() {
                    *x = r.u32(if i < 3 { "grid" } else { "block" })?;
                }
                let dims = LaunchDims {
                    grid: [v[0], v[1], v[2]],
                    block: [v[3], v[4], v[5]],
                    shared_mem_bytes: r.u32("shared memory bytes")?,
                };
                let n = r.count("argument count", MAX_ARGS, 12)?;
                let mut args = Vec::with_capacity(n);
                for i in 0..n {
                    let kind = r.u32("argument kind")?;
                    let bits = r.u64("argument value")?;
                    let arg = KernelArg::from_bits(kind, bits, i)
                        .map_err(|e| r.error("argument kind", e.message()))?;
                    if arg.to_bits() != (kind, bits) {
                        return Err(r.error(
                            "argument value",
                            &format!(
                                "argument {i} ({}) has bits set beyond its type: {bits:#x}",
                                arg.type_name()
                            ),
                        ));
                    }
                    args.push(arg);
                }
                Request::Launch {
                    device,
                    kernel,
                    dims,
                    args,
                    queue: r.queue()?,
                }
            }
            13 => Request::QueueCreate {
                device: r.u32("device")?,
            },
            14 => Request::QueueSync {
                device: r.u32("device")?,
                queue: r.u64("queue")?,
            },
            15 => Request::QueueDestroy {
                device: r.u32("device")?,
                queue: r.u64("queue")?,
            },
            16 => Request::EventCreate {
                device: r.u32("device")?,
            },
            17 => Request::EventRecord {
                device: r.u32("device")?,
                event: r.u64("event")?,
                queue: r.u64("queue")?,
            },
            18 => Request::EventWait {
                device: r.u32("device")?,
                event: r.u64("event")?,
                queue: r.u64("queue")?,
            },
            19 => Request::EventSync {
                device: r.u32("device")?,
                event: r.u64("event")?,
            },
            20 => Request::EventQuery {
                device: r.u32("device")?,
                event: r.u64("event")?,
            },
            21 => Request::EventDestroy {
                device: r.u32("device")?,
                event: r.u64("event")?,
            },
            22 => Request::EventElapsed {
                device: r.u32("device")?,
                start: r.u64("start event")?,
                end: r.u64("end event")?,
            },
            23 | 24 => {
                let device = r.u32("device")?;
                let at = r.u64(if kind == 23 { "dst" } else { "src" })?;
                let len = r.u64("len")?;
                let at_chunk = r.at;
                let chunk = r.u64("chunk")?;
                if !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
                    r.at = at_chunk;
                    return Err(r.error(
                        "chunk",
                        &format!("{chunk} bytes (a chunk is {MIN_CHUNK} to {MAX_CHUNK} bytes)"),
                    ));
                }
                if kind == 23 {
                    Request::WriteStream {
                        device,
                        dst: at,
                        len,
                        chunk,
                    }
                } else {
                    Request::ReadStream {
                        device,
                        src: at,
                        len,
                        chunk,
                    }
                }
            }
            k => return Err(r.error("kind", &format!("no request has kind {k}"))),
        };
        r.end()?;
        Ok((id, request))
    }
}

impl Reply {
    fn kind(&self) -> u16 {
        match self {
            Reply::Hello { .. } => 101,
            Reply::Value { .. } => 102,
            Reply::Global { .. } => 103,
            Reply::Done => 104,
            Reply::Bytes { .. } => 105,
            Reply::Failed { .. } => 106,
            Reply::Output { .. } => 107,
        }
    }

    /// The error a [`Reply::Failed`] carries, as the proxy had it (kind and message), or
    /// `None` for any other reply.
    pub fn error(&self) -> Option<Error> {
        match self {
            Reply::Failed { kind, message } => {
                Some(Error::from_parts(u32::from(*kind), 0, message.clone()))
            }
            _ => None,
        }
    }

    /// The reply to an error.
    pub fn failed(e: &Error) -> Reply {
        Reply::Failed {
            kind: e.kind() as u16,
            message: e.message().to_string(),
        }
    }

    /// What the reply is, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Reply::Hello { .. } => "a hello",
            Reply::Value { .. } => "a value",
            Reply::Global { .. } => "a global",
            Reply::Done => "done",
            Reply::Bytes { .. } => "bytes",
            Reply::Failed { .. } => "an error",
            Reply::Output { .. } => "output",
        }
    }

    /// The message answering request `id`.
    pub fn encode(&self, id: u64) -> Vec<u8> {
        let mut w = Writer::new(self.kind(), id);
        match self {
            Reply::Hello { version, devices } => {
                w.u16(*version);
                w.u64(devices.len() as u64);
                for d in devices {
                    w.text(&d.plugin);
                    w.u32(d.index);
                    w.u64(d.claims.len() as u64);
                    for c in &d.claims {
                        w.text(c);
                    }
                    let i = &d.info;
                    w.text(&i.name);
                    w.text(&i.compute_unit_kind);
                    w.text(&i.target_features);
                    w.u64(i.total_memory);
                    w.u32(i.compute_units);
                    let l = &i.limits;
                    for v in l.max_grid.iter().chain(&l.max_block) {
                        w.u32(*v);
                    }
                    w.u32(l.max_threads_per_block);
                    w.u32(l.warp_size);
                }
            }
            Reply::Value { value } => w.u64(*value),
            Reply::Global { ptr, size } => {
                w.u64(*ptr);
                w.u64(*size);
            }
            Reply::Done => {}
            Reply::Bytes { bytes } | Reply::Output { bytes } => w.bytes(bytes),
            Reply::Failed { kind, message } => {
                w.u16(*kind);
                w.text(message);
            }
        }
        w.finish()
    }

    /// A reply and the id it answers, from a message.
    pub fn decode(message: &[u8]) -> Result<(u64, Reply)> {
        let (kind, id, mut r) = Reader::header(message)?;
        let r = &mut r;
        let reply = match kind {
            101 => {
                let version = r.u16("version")?;
                let n = r.count("device count", MAX_DEVICES, 1)?;
                let mut devices = Vec::new();
                for _ in 0..n {
                    let plugin = r.text("plugin")?;
                    let index = r.u32("index")?;
                    let claims = (0..r.count("claim count", MAX_CLAIMS, 8)?)
                        .map(|_| r.text("claim"))
                        .collect::<Result<_>>()?;
                    let name = r.text("name")?;
                    let compute_unit_kind = r.text("compute unit kind")?;
                    let target_features = r.text("target features")?;
                    let total_memory = r.u64("total memory")?;
                    let compute_units = r.u32("compute units")?;
                    let mut v = [0u32; 6];
                    for (i, x) in v.iter_mut().enumerate() {
                        *x = r.u32(if i < 3 { "max grid" } else { "max block" })?;
                    }
                    let limits = DeviceLimits {
                        max_grid: [v[0], v[1], v[2]],
                        max_block: [v[3], v[4], v[5]],
                        max_threads_per_block: r.u32("max threads per block")?,
                        warp_size: r.u32("warp size")?,
                    };
                    devices.push(RemoteDevice {
                        plugin,
                        index,
                        claims,
                        info: DeviceInfo {
                            name,
                            compute_unit_kind,
                            target_features,
                            total_memory,
                            compute_units,
                            limits,
                        },
                    });
                }
                Reply::Hello { version, devices }
            }
            102 => Reply::Value {
                value: r.u64("value")?,
            },
            103 => Reply::Global {
                ptr: r.u64("ptr")?,
                size: r.u64("size")?,
            },
            104 => Reply::Done,
            105 => Reply::Bytes {
                bytes: r.bytes("bytes", u64::MAX)?.to_vec(),
            },
            106 => Reply::Failed {
                kind: r.u16("error kind")?,
                message: r.text("message")?,
            },
            107 => Reply::Output {
                bytes: r.bytes("output", MAX_MESSAGE as u64)?.to_vec(),
            },
            k => return Err(r.error("kind", &format!("no reply has kind {k}"))),
        };
        r.end()?;
        Ok((id, reply))
    }
}

/// Builds one message.
struct Writer(Vec<u8>);

impl Writer {
    fn new(kind: u16, id: u64) -> Writer {
        let mut w = Writer(Vec::with_capacity(HEADER));
        w.u32(MAGIC);
        w.u16(VERSION);
        w.u16(kind);
        w.u64(id);
        w.u64(0); // the payload's length, set by `finish`
        w
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    /// An optional queue: a byte (0: none, 1: this queue) and, with one, its handle.
    fn queue(&mut self, q: Option<u64>) {
        match q {
            None => self.0.push(0),
            Some(q) => {
                self.0.push(1);
                self.u64(q);
            }
        }
    }
    /// A text, cut to [`MAX_TEXT`] bytes at a character boundary.
    fn text(&mut self, t: &str) {
        let mut end = t.len().min(MAX_TEXT as usize);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&t.as_bytes()[..end]);
    }
    fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - HEADER) as u64;
        self.0[HEADER - 8..HEADER].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

/// Reads one message, every length checked.
struct Reader<'m> {
    message: &'m [u8],
    at: usize,
}

impl<'m> Reader<'m> {
    /// The kind, the id and a reader of the payload; the magic, the version and the payload's
    /// length checked.
    fn header(message: &'m [u8]) -> Result<(u16, u64, Reader<'m>)> {
        let mut r = Reader { message, at: 0 };
        let magic = r.u32("magic")?;
        if magic != MAGIC {
            return Err(r.error(
                "magic",
                &format!("{magic:#010x} is not an offload MPI message"),
            ));
        }
        let version = r.u16("version")?;
        if version != VERSION {
            return Err(r.error(
                "version",
                &format!("message version {version}; this side speaks version {VERSION}"),
            ));
        }
        let kind = r.u16("kind")?;
        let id = r.u64("id")?;
        let len = r.u64("payload length")?;
        let left = (message.len() - HEADER) as u64;
        if len != left {
            return Err(r.error(
                "payload length",
                &format!("the header says {len} bytes, the message has {left}"),
            ));
        }
        Ok((kind, id, r))
    }

    fn error(&self, field: &str, what: &str) -> Error {
        Error::InvalidArgument(format!(
            "offload MPI message ({} bytes), byte {}: field '{field}': {what}",
            self.message.len(),
            self.at
        ))
    }

    fn take(&mut self, field: &str, n: usize) -> Result<&'m [u8]> {
        let left = self.message.len() - self.at;
        if n > left {
            return Err(self.error(field, &format!("needs {n} bytes, {left} left")));
        }
        let b = &self.message[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }
    fn u16(&mut self, field: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(field, 2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(field, 4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(field, 8)?.try_into().expect("8 bytes"),
        ))
    }
    fn bytes(&mut self, field: &str, max: u64) -> Result<&'m [u8]> {
        let len = self.u64(field)?;
        if len > max {
            return Err(self.error(field, &format!("{len} bytes (at most {max})")));
        }
        let left = (self.message.len() - self.at) as u64;
        if len > left {
            return Err(self.error(field, &format!("{len} bytes, {left} left")));
        }
        self.take(field, len as usize)
    }
    /// A count of items each at least `each` bytes long: at most `max`, and no more than
    /// the bytes left could hold (so a corrupted count allocates nothing).
    fn count(&mut self, field: &str, max: u64, each: u64) -> Result<usize> {
        let n = self.u64(field)?;
        let left = (self.message.len() - self.at) as u64;
        if n > max {
            return Err(self.error(field, &format!("{n} (at most {max})")));
        }
        if n.saturating_mul(each) > left {
            return Err(self.error(
                field,
                &format!("{n} items of at least {each} bytes, {left} bytes left"),
            ));
        }
        Ok(n as usize)
    }
    fn queue(&mut self) -> Result<Option<u64>> {
        match self.take("queue", 1)?[0] {
            0 => Ok(None),
            1 => Ok(Some(self.u64("queue")?)),
            b => {
                self.at -= 1;
                Err(self.error("queue", &format!("flag {b} (expected 0 or 1)")))
            }
        }
    }
    fn text(&mut self, field: &str) -> Result<String> {
        let b = self.bytes(field, MAX_TEXT)?;
        String::from_utf8(b.to_vec()).map_err(|e| self.error(field, &format!("not UTF-8 ({e})")))
    }
    fn end(&self) -> Result<()> {
        let left = self.message.len() - self.at;
        if left > 0 {
            return Err(self.error("end", &format!("{left} bytes after the last field")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload_core::DevicePtr;

    fn requests() -> Vec<Request> {
        let dims = LaunchDims {
            grid: [3, 2, 1],
            block: [64, 1, 1],
            shared_mem_bytes: 512,
        };
        vec![
            Request::Hello,
            Request::CheckImage {
                device: 1,
                image: b"\x7fELF....".to_vec(),
            },
            Request::Load {
                device: 0,
                image: (0..300u32).map(|i| i as u8).collect(),
            },
            Request::Unload {
                device: 2,
                program: 9,
            },
            Request::Kernel {
                device: 0,
                program: 4,
                name: "saxpy".into(),
            },
            Request::Global {
                device: 0,
                program: 4,
                name: "counter".into(),
            },
            Request::Alloc {
                device: 3,
                bytes: 1 << 40,
                kind: 1,
            },
            Request::Free {
                device: 0,
                ptr: 0x7f00_0000_1000,
            },
            Request::Write {
                device: 0,
                dst: 0x1000,
                queue: Some(5),
                bytes: vec![1, 2, 3],
            },
            Request::Write {
                device: 0,
                dst: 0x1000,
                queue: None,
                bytes: Vec::new(),
            },
            Request::Read {
                device: 1,
                src: 2,
                len: 3,
                queue: None,
            },
            Request::Copy {
                device: 1,
                dst: 8,
                src: 16,
                len: 4,
                queue: Some(1),
            },
            Request::Launch {
                device: 0,
                kernel: 7,
                dims,
                args: vec![
                    KernelArg::I32(-5),
                    KernelArg::U32(7),
                    KernelArg::I64(-1 << 40),
                    KernelArg::U64(1 << 63),
                    KernelArg::F32(2.5),
                    KernelArg::F64(-0.125),
                    KernelArg::Ptr(DevicePtr(0x1000)),
                    KernelArg::Word(42),
                ],
                queue: Some(3),
            },
            Request::QueueCreate { device: 0 },
            Request::QueueSync {
                device: 0,
                queue: 3,
            },
            Request::QueueDestroy {
                device: 0,
                queue: 3,
            },
            Request::EventCreate { device: 0 },
            Request::EventRecord {
                device: 0,
                event: 1,
                queue: 3,
            },
            Request::EventWait {
                device: 0,
                event: 1,
                queue: 4,
            },
            Request::EventSync {
                device: 0,
                event: 1,
            },
            Request::EventQuery {
                device: 0,
                event: 1,
            },
            Request::EventDestroy {
                device: 0,
                event: 1,
            },
            Request::EventElapsed {
                device: 0,
                start: 1,
                end: 2,
            },
            Request::WriteStream {
                device: 0,
                dst: 0x1000,
                len: (1 << 20) + 5,
                chunk: 1 << 17,
            },
            Request::ReadStream {
                device: 1,
                src: 0x2000,
                len: 0,
                chunk: 64 << 10,
            },
        ]
    }

    fn replies() -> Vec<Reply> {
        vec![
            Reply::Hello {
                version: VERSION,
                devices: vec![RemoteDevice {
                    plugin: "host".into(),
                    index: 0,
                    claims: vec!["elf:62".into(), "bitcode:x86_64-unknown-linux-gnu".into()],
                    info: DeviceInfo {
                        name: "Host CPU (2 threads)".into(),
                        compute_unit_kind: "znver3".into(),
                        target_features: "+avx2".into(),
                        total_memory: 24 << 30,
                        compute_units: 2,
                        limits: DeviceLimits {
                            max_grid: [1 << 31, 65535, 65535],
                            max_block: [1024, 1024, 64],
                            max_threads_per_block: 1024,
                            warp_size: 1,
                        },
                    },
                }],
            },
            Reply::Value { value: 42 },
            Reply::Global {
                ptr: 0x1000,
                size: 8,
            },
            Reply::Done,
            Reply::Bytes {
                bytes: vec![1, 2, 3],
            },
            Reply::Failed {
                kind: 3,
                message: "0x9 is not an allocation of this device".into(),
            },
            Reply::Output {
                bytes: b"region 3\n".to_vec(),
            },
        ]
    }

    #[test]
    fn every_message_comes_back_as_it_went() {
        let requests = requests();
        // Every kind of request is in the list (the kinds are 1..=24, none left out).
        let mut kinds: Vec<u16> = requests.iter().map(Request::kind).collect();
        kinds.dedup();
        assert_eq!(kinds, (1..=24).collect::<Vec<_>>());
        for (i, r) in requests.into_iter().enumerate() {
            assert_eq!(Request::decode(&r.encode(i as u64)).unwrap(), (i as u64, r));
        }
        let replies = replies();
        let kinds: Vec<u16> = replies.iter().map(Reply::kind).collect();
        assert_eq!(kinds, (101..=107).collect::<Vec<_>>());
        for (i, r) in replies.into_iter().enumerate() {
            assert_eq!(Reply::decode(&r.encode(i as u64)).unwrap(), (i as u64, r));
        }
    }

    #[test]
    fn streams_cut_every_length_into_chunks_that_cover_it_once() {
        for len in [
            0usize,
            1,
            4095,
            256 << 10,
            (1 << 20) + 3,
            64 << 20,
            (256 << 20) + 1,
        ] {
            let chunk = chunk_for(len);
            assert!((MIN_CHUNK..=MAX_CHUNK).contains(&(chunk as u64)));
            let mut next = 0u64;
            for (at, n) in chunks(len as u64, chunk as u64) {
                assert_eq!(at, next, "{len}");
                assert!(n > 0 && n <= chunk, "{len}");
                next += n as u64;
            }
            assert_eq!(next, len as u64);
        }
        let mut m = Request::WriteStream {
            device: 0,
            dst: 0,
            len: 8,
            chunk: 1 << 20,
        }
        .encode(1);
        let at = m.len() - 8;
        m[at..].copy_from_slice(&3u64.to_le_bytes());
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "byte {at}: field 'chunk': 3 bytes (a chunk is 4096 to"
            )),
            "{e}"
        );
    }

    #[test]
    fn work_on_a_queue_is_not_answered() {
        let unanswered: Vec<&str> = requests()
            .iter()
            .filter(|r| !r.answered())
            .map(Request::name)
            .collect();
        assert_eq!(
            unanswered,
            [
                "copy to the device",
                "device-to-device copy",
                "launch",
                "event record",
                "event wait"
            ]
        );
        let queued_read = Request::Read {
            device: 0,
            src: 0,
            len: 1,
            queue: Some(1),
        };
        assert!(!queued_read.answered());
    }

    #[test]
    fn a_text_too_long_is_cut_at_a_character_and_still_decodes() {
        let message = "é".repeat(MAX_TEXT as usize); // two bytes each
        let (_, back) = Reply::decode(
            &Reply::Failed {
                kind: 10,
                message: format!("x{message}"),
            }
            .encode(3),
        )
        .unwrap();
        let Reply::Failed { message: cut, .. } = back else {
            panic!("{back:?}")
        };
        assert!(cut.len() <= MAX_TEXT as usize && cut.len() >= MAX_TEXT as usize - 1);
        assert!(cut.starts_with("xé") && cut.ends_with('é'));
    }

    #[test]
    fn errors_name_the_field_and_the_byte() {
        let mut m = Request::Alloc {
            device: 1,
            bytes: 2,
            kind: 0,
        }
        .encode(7);
        m.truncate(m.len() - 3);
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(e.contains("payload length") && e.contains("byte 24"), "{e}");
        let mut m = Request::Hello.encode(1);
        m[4] = 9;
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(
            e.contains(&format!(
                "message version 9; this side speaks version {VERSION}"
            )),
            "{e}"
        );
        let e = Request::decode(b"OFM").unwrap_err().to_string();
        assert!(e.contains("field 'magic': needs 4 bytes, 3 left"), "{e}");
        let e = Reply::decode(&Request::Hello.encode(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no reply has kind 1"), "{e}");
        // A queue flag that is neither 0 nor 1, at its byte.
        let mut m = Request::Read {
            device: 0,
            src: 0,
            len: 0,
            queue: None,
        }
        .encode(1);
        let at = m.len() - 1;
        m[at] = 7;
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(
            e.contains(&format!("byte {at}: field 'queue': flag 7")),
            "{e}"
        );
        // An i32 argument with bits above its 32.
        let mut m = Request::Launch {
            device: 0,
            kernel: 1,
            dims: LaunchDims::linear(1, 1),
            args: vec![KernelArg::I32(1)],
            queue: None,
        }
        .encode(1);
        let at = m.len() - 1 - 8 + 7;
        m[at] = 1;
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(
            e.contains("argument 0 (i32) has bits set beyond its type"),
            "{e}"
        );
        // A count the message cannot hold allocates nothing and names itself.
        let mut m = Reply::Hello {
            version: VERSION,
            devices: Vec::new(),
        }
        .encode(0);
        let at = m.len() - 8;
        m[at..].copy_from_slice(&900u64.to_le_bytes());
        let e = Reply::decode(&m).unwrap_err().to_string();
        assert!(
            e.contains("field 'device count': 900 items of at least 1 bytes, 0 bytes left"),
            "{e}"
        );
    }

    #[test]
    fn mutated_messages_decode_to_an_error_or_a_message_never_a_panic() {
        // Seeded: flipped bytes, truncations, extensions and length fields set to huge
        // values, over every kind of message; each decode must return (a mutant that still
        // parses is a message like any other, and must encode back to the same bytes).
        let mut rng = offload_core::rand::XorShift(0x0ff1_0ad5_eed5);
        let mut next = || rng.next_u64();
        let messages: Vec<Vec<u8>> = requests()
            .iter()
            .map(|r| r.encode(11))
            .chain(replies().iter().map(|r| r.encode(12)))
            .collect();
        let (mut errors, mut parsed) = (0, 0);
        for round in 0..40_000 {
            let mut m = messages[round % messages.len()].clone();
            match next() % 4 {
                0 => {
                    for _ in 0..1 + next() % 4 {
                        let i = (next() % m.len() as u64) as usize;
                        m[i] ^= 1 << (next() % 8);
                    }
                }
                1 => m.truncate((next() % m.len() as u64) as usize),
                2 => m.extend((0..1 + next() % 16).map(|_| next() as u8)),
                _ => {
                    // A length field (the header's, or one in the payload) huge.
                    let at = if next() % 2 == 0 || m.len() < HEADER + 8 {
                        HEADER - 8
                    } else {
                        HEADER + (next() % (m.len() - HEADER - 7) as u64) as usize
                    };
                    m[at..at + 8].copy_from_slice(&(u64::MAX - next() % 3).to_le_bytes());
                }
            }
            let as_request = Request::decode(&m).map(|(id, r)| r.encode(id));
            let as_reply = Reply::decode(&m).map(|(id, r)| r.encode(id));
            for back in [as_request, as_reply] {
                match back {
                    Ok(b) => {
                        assert_eq!(b, m, "round {round}: a parsed mutant encodes back");
                        parsed += 1;
                    }
                    Err(_) => errors += 1,
                }
            }
        }
        assert!(errors > 60_000, "{errors} errors, {parsed} parsed");
        assert!(parsed > 100, "{errors} errors, {parsed} parsed");
    }
}
