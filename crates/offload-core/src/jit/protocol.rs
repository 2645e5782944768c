//! The pipe protocol between the JIT client and the worker process (and the in-process
//! engine's entry point, which takes the same payloads).
//!
//! Every message is a frame: request id (`u64`), kind (`u8`), payload length (`u64`), payload.
//! The worker sends [`HELLO`] first, then one [`RESULT`] per
//! [`COMPILE`], in any order (compiles run in parallel inside the worker).

use super::wire::{Reader, Writer};
use super::*;
use std::io::{Read, Write};

/// Bumped whenever a payload changes; client and worker must agree.
pub const VERSION: u32 = 2;
/// Worker → client, first frame: version, LLVM version, engine version, pid.
pub const HELLO: u8 = 1;
/// Client → worker: compile one image.
pub const COMPILE: u8 = 2;
/// Worker → client: the outcome of one compile.
pub const RESULT: u8 = 3;
/// Largest payload accepted (a bigger length is corruption, not an image).
pub const MAX_PAYLOAD: u64 = 1 << 36;

/// One frame.
#[derive(Debug)]
pub struct Frame {
    /// Request id (0 for the hello).
    pub id: u64,
    /// [`HELLO`], [`COMPILE`] or [`RESULT`].
    pub kind: u8,
    /// The payload.
    pub payload: Vec<u8>,
}

/// The frame header followed by `payload`, as one buffer (written with one call, so frames
/// from several threads never interleave).
pub fn frame(id: u64, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(17 + payload.len());
    v.extend_from_slice(&id.to_le_bytes());
    v.push(kind);
    v.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, id: u64, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    w.write_all(&frame(id, kind, payload))?;
    w.flush()
}

/// Reads one frame; `Ok(None)` at a clean end of stream (before a header).
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
    let mut head = [0u8; 17];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "stream ended inside a frame header",
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let id = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let kind = head[8];
    let len = u64::from_le_bytes(head[9..17].try_into().expect("8 bytes"));
    if len > MAX_PAYLOAD {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame of {len} bytes is larger than any image"),
        ));
    }
    let mut payload = Vec::new();
    payload.try_reserve_exact(len as usize).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::OutOfMemory,
            format!("cannot allocate a {len}-byte frame"),
        )
    })?;
    r.take(len).read_to_end(&mut payload)?;
    if payload.len() as u64 != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "stream ended inside a frame",
        ));
    }
    Ok(Some(Frame { id, kind, payload }))
}

/// The worker's greeting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// [`VERSION`] of the worker.
    pub version: u32,
    /// The LLVM version it links (`19.1.7`).
    pub llvm: String,
    /// Its engine version.
    pub engine: String,
}

impl Hello {
    /// The payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u32(self.version).str(&self.llvm).str(&self.engine);
        w.0
    }
    /// From the payload.
    pub fn decode(b: &[u8]) -> Result<Self> {
        let mut r = Reader::new(b, "JIT worker hello");
        let h = Hello {
            version: r.u32()?,
            llvm: r.str()?,
            engine: r.str()?,
        };
        r.finish()?;
        Ok(h)
    }
}

/// A compile as the worker receives it (the image borrowed from the payload).
#[derive(Debug, Clone)]
pub struct WorkerRequest<'a> {
    /// The device.
    pub target: JitTarget,
    /// Post-processing.
    pub post: PostProcess,
    /// Settings.
    pub options: JitOptions,
    /// The image.
    pub image: &'a [u8],
}

/// The [`COMPILE`] payload.
pub fn encode_compile(
    target: &JitTarget,
    post: &PostProcess,
    options: &JitOptions,
    image: &[u8],
) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(image.len() + 256));
    target.encode(&mut w);
    post.encode(&mut w);
    options.encode(&mut w);
    w.bytes(image);
    w.0
}

/// From the [`COMPILE`] payload.
pub fn decode_compile(b: &[u8]) -> Result<WorkerRequest<'_>> {
    let mut r = Reader::new(b, "JIT compile request");
    let req = WorkerRequest {
        target: JitTarget::decode(&mut r)?,
        post: PostProcess::decode(&mut r)?,
        options: JitOptions::decode(&mut r)?,
        image: r.bytes()?,
    };
    r.finish()?;
    Ok(req)
}

/// A successful compile as the worker reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerOutput {
    /// The output.
    pub output: CompileOutput,
    /// Time spent compiling and post-processing in the worker.
    pub compile_ns: u64,
    /// Most compiles the worker ran at once while this one ran (including it).
    pub concurrency: u32,
    /// The compile's phases (parse, optimise, code generation, post-processing), each
    /// `(name, start, duration)` in nanoseconds from the compile's start.
    pub phases: Vec<(String, u64, u64)>,
}

/// The [`RESULT`] payload.
pub fn encode_result(result: &Result<WorkerOutput>) -> Vec<u8> {
    let mut w = Writer::default();
    match result {
        Ok(o) => {
            w.u8(0).u64(o.compile_ns).u32(o.concurrency);
            o.output.encode(&mut w);
            w.u64(o.phases.len() as u64);
            for (name, start, dur) in &o.phases {
                w.str(name).u64(*start).u64(*dur);
            }
        }
        Err(e) => {
            w.u8(1);
            encode_error(&mut w, e);
        }
    }
    w.0
}

/// From the [`RESULT`] payload: the outer error is a corrupt payload, the inner one the
/// compile's own failure.
pub fn decode_result(b: &[u8]) -> Result<Result<WorkerOutput>> {
    let mut r = Reader::new(b, "JIT compile result");
    let out = match r.u8()? {
        0 => {
            let compile_ns = r.u64()?;
            let concurrency = r.u32()?;
            let output = CompileOutput::decode(&mut r)?;
            let n = r.u64()?;
            let mut phases = Vec::new();
            for _ in 0..n {
                phases.push((r.str()?, r.u64()?, r.u64()?));
            }
            Ok(WorkerOutput {
                compile_ns,
                concurrency,
                output,
                phases,
            })
        }
        1 => Err(decode_error(&mut r)?),
        v => {
            return Err(Error::System(format!(
                "corrupt JIT compile result: tag {v}"
            )));
        }
    };
    r.finish()?;
    Ok(out)
}
