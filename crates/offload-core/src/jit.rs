//! The JIT's shared vocabulary: what a plugin asks for, what it gets back, and the byte format
//! both cross in (the plugin ABI's JIT service, and the pipe to the JIT worker process).
//!
//! Nothing here compiles anything and nothing here links LLVM: plugins and the runtime speak
//! these types, the JIT client (`offload-jit-client`) caches and routes them, and the worker
//! (`offload-jit`'s `offload-jit-worker`) is the only process that turns them into code.
//!
//! Decoding is bounded and checked: a truncated or corrupt message is an error naming what was
//! being read, never a panic or an unbounded allocation.

use crate::error::{Error, Result};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// A cache key: BLAKE3 over length-prefixed fields (computed by the JIT client).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CacheKey(pub [u8; 32]);

impl CacheKey {
    /// Lower-case hex.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first 12 hex digits, for messages.
    pub fn short(&self) -> String {
        self.hex()[..12].to_string()
    }
}

/// The type of a kernel parameter as the module declares it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamType {
    /// `i32` (C `int`, `unsigned`).
    I32,
    /// `i64` (C `long long`, `size_t` on 64-bit targets).
    I64,
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// Any pointer.
    Ptr,
    /// Anything else, spelled as LLVM prints it (`i16`, `<4 x float>`, a struct, ...).
    Other(String),
}

impl std::fmt::Display for ParamType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamType::I32 => f.write_str("i32"),
            ParamType::I64 => f.write_str("i64"),
            ParamType::F32 => f.write_str("float"),
            ParamType::F64 => f.write_str("double"),
            ParamType::Ptr => f.write_str("ptr"),
            ParamType::Other(t) => f.write_str(t),
        }
    }
}

/// An exported function of a compiled module and its parameter types, so that a launch with
/// the wrong arguments can be refused instead of calling the kernel with garbage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSignature {
    /// Symbol name.
    pub name: String,
    /// Parameter types in order.
    pub params: Vec<ParamType>,
}

/// The device a compile is for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JitTarget {
    /// LLVM target triple of the device (`nvptx64-nvidia-cuda`, `x86_64-unknown-linux-gnu`).
    pub triple: String,
    /// Exact CPU / compute-unit kind (`sm_90`, `gfx90a`, `znver3`).
    pub cpu: String,
    /// LLVM target features, comma-separated (`+ptx80`, `+avx2,-avx512f`); may be empty.
    pub features: String,
}

/// Variable naming the `ld.lld` that links JIT output (host and AMDGPU images).
pub const ENV_LLD: &str = "OFFLOAD_LLD";
/// Where the linker is looked for when [`ENV_LLD`] is unset, in order: LLVM 19's own, then on
/// `PATH` ([`locate_lld`]).
pub const LLD_CANDIDATES: [&str; 3] = ["/usr/lib/llvm-19/bin/ld.lld", "ld.lld-19", "ld.lld"];

/// The file `name` names: itself when it holds a `/`, else the first match on `PATH`; only a
/// regular file (or a link to one).
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    if name.contains('/') {
        return Some(std::path::PathBuf::from(name)).filter(|p| p.is_file());
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The `ld.lld` that links JIT output: the file [`ENV_LLD`] names (a path, or a name on
/// `PATH`), else the first of [`LLD_CANDIDATES`] that exists. The one rule for both sides: the
/// worker runs this file (and refuses it if it does not answer `--version` as LLD), the JIT
/// client stamps this file into disk-cache keys. Looking does not run anything.
pub fn locate_lld() -> Result<std::path::PathBuf> {
    if let Some((name, value)) = crate::env::raw(&[ENV_LLD])? {
        return on_path(&value).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "environment variable {name}='{value}' is not valid: no such file{}",
                if value.contains('/') { "" } else { " on PATH" }
            ))
        });
    }
    LLD_CANDIDATES
        .iter()
        .find_map(|c| on_path(c))
        .ok_or_else(|| {
            Error::Unsupported(format!(
                "linking JIT output needs ld.lld from LLVM 19 (looked for {}; set {ENV_LLD}); \
                 install lld-19",
                LLD_CANDIDATES.join(", ")
            ))
        })
}

/// What turns the code generator's output into what a device loads. Runs in the worker; its
/// [`PostProcess::id`] is part of the cache key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostProcess {
    /// Hand the generated code over as it is (PTX for a driver that assembles it itself).
    Unchanged,
    /// Link the object into a host shared object with `ld.lld -shared`.
    LinkHostSharedObject,
    /// Link the object into an AMDGPU code object: `ld.lld -shared --no-undefined
    /// -plugin-opt=mcpu=<gfx>`, as upstream links JIT output.
    LinkAmdgpuCodeObject {
        /// The gfx target (`gfx90a`).
        gfx: String,
    },
    /// Assemble PTX into a cubin with NVIDIA's `ptxas` (`-arch=<arch> -O<JIT opt level>`).
    Ptxas {
        /// The `ptxas` executable the plugin found.
        path: String,
        /// Its `--version` (part of the key: another ptxas makes another cubin).
        version: String,
        /// The SM (`sm_90a`).
        arch: String,
    },
}

impl PostProcess {
    /// The step for code of `triple` compiled for `arch` (the SM or gfx target the image is
    /// for): `ptxas -arch=<arch>` for NVIDIA code when a `ptxas` (path, `--version`) was found,
    /// else the PTX as it is (the driver assembles it); an AMDGPU code object linked for
    /// `arch`; a shared object for a host triple (Linux); else the object as it is. Every
    /// backend and `offload jit` take their step from here.
    pub fn for_target(triple: &str, arch: &str, ptxas: Option<(&str, &str)>) -> PostProcess {
        match triple.split('-').next().unwrap_or("") {
            "nvptx64" | "nvptx" => match ptxas {
                Some((path, version)) => PostProcess::Ptxas {
                    path: path.into(),
                    version: version.into(),
                    arch: arch.into(),
                },
                None => PostProcess::Unchanged,
            },
            "amdgcn" => PostProcess::LinkAmdgpuCodeObject { gfx: arch.into() },
            _ if triple.contains("linux") => PostProcess::LinkHostSharedObject,
            _ => PostProcess::Unchanged,
        }
    }

    /// Identifies the step and its settings (goes into the cache key).
    pub fn id(&self) -> String {
        match self {
            PostProcess::Unchanged => "unchanged".into(),
            PostProcess::LinkHostSharedObject => "lld-shared".into(),
            PostProcess::LinkAmdgpuCodeObject { gfx } => {
                format!("lld-shared --no-undefined -plugin-opt=mcpu={gfx}")
            }
            PostProcess::Ptxas { version, arch, .. } => format!("ptxas -arch={arch} ({version})"),
        }
    }

    /// What the result is, for messages (`PTX text`, `linked shared object`).
    pub fn describe(&self, triple: &str) -> &'static str {
        match self {
            PostProcess::Unchanged if triple.starts_with("nvptx") => "PTX text",
            PostProcess::Unchanged => "object file",
            PostProcess::LinkHostSharedObject => "linked shared object",
            PostProcess::LinkAmdgpuCodeObject { .. } => "linked AMDGPU code object",
            PostProcess::Ptxas { .. } => "cubin (assembled by ptxas)",
        }
    }
}

/// What a plugin asks of the JIT: compile `image` for `target`, then `post`.
#[derive(Debug, Clone)]
pub struct CompileRequest<'a> {
    /// LLVM bitcode (raw or wrapped) or textual IR.
    pub image: &'a [u8],
    /// The device.
    pub target: JitTarget,
    /// The device's post-processing step.
    pub post: PostProcess,
}

/// A file a variable names as input, read when the configuration is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFile {
    /// The variable that named it (for messages).
    pub variable: String,
    /// The path.
    pub path: PathBuf,
    /// Its contents.
    pub bytes: Vec<u8>,
}

/// A path a variable names for output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPath {
    /// The variable that named it (for messages).
    pub variable: String,
    /// The path.
    pub path: PathBuf,
}

impl OutputPath {
    /// Writes `bytes`, with an error that names the variable.
    pub fn write(&self, bytes: &[u8]) -> Result<()> {
        std::fs::write(&self.path, bytes).map_err(|e| {
            Error::System(format!(
                "{}='{}': cannot write: {e}",
                self.variable,
                self.path.display()
            ))
        })
    }
}

/// The settings that change what a compile produces (all of them are part of the key), plus
/// where to dump IR. Sent with every request, so the worker holds no configuration of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitOptions {
    /// `default<On>` pipeline level and the code generator's level (0..=3).
    pub opt_level: u8,
    /// Skip the optimisation pipeline.
    pub skip_opt: bool,
    /// Replaces every input module.
    pub replacement_module: Option<NamedFile>,
    /// Replaces code generation output.
    pub replacement_object: Option<NamedFile>,
    /// IR dump before optimisation.
    pub pre_opt_ir: Option<OutputPath>,
    /// IR dump after optimisation.
    pub post_opt_ir: Option<OutputPath>,
}

impl Default for JitOptions {
    fn default() -> Self {
        JitOptions {
            opt_level: 3,
            skip_opt: false,
            replacement_module: None,
            replacement_object: None,
            pre_opt_ir: None,
            post_opt_ir: None,
        }
    }
}

/// What one compile produces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompileOutput {
    /// The image bytes.
    pub bytes: Vec<u8>,
    /// Signatures of the module's exported functions.
    pub signatures: Vec<KernelSignature>,
}

/// A compiled image as the JIT hands it out.
#[derive(Debug)]
pub struct CompiledImage {
    /// The key it is stored under.
    pub key: CacheKey,
    /// What the device loads (PTX text, an object, or a linked image).
    pub bytes: Vec<u8>,
    /// Signatures of the module's exported functions.
    pub signatures: Vec<KernelSignature>,
    /// How long the compile (and post-processing) took.
    pub compile_time: Duration,
}

/// How a request was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Found in memory.
    MemoryHit,
    /// Another thread was compiling the same key; this one waited for it.
    SharedCompile,
    /// Compiled by this request.
    Compiled,
    /// Read from the disk cache (written by this or another process, or by another node).
    DiskHit,
}

/// The result of a JIT request.
#[derive(Debug, Clone)]
pub struct JitOutput {
    /// The image to load.
    pub image: Arc<CompiledImage>,
    /// How the request was served.
    pub served: Served,
}

/// A JIT that plugins can ask for compiled images: the runtime's client (one per process,
/// handed to every plugin over the ABI), or a plugin's own when no runtime provides one.
pub trait JitService: Send + Sync {
    /// Compiles (or finds) the image for `request`.
    fn compile(&self, request: &CompileRequest<'_>) -> Result<JitOutput>;
}

/// Bounded binary encoding: little-endian integers, length-prefixed byte strings.
pub mod wire {
    use super::*;

    /// Appends values to a buffer.
    #[derive(Debug, Default)]
    pub struct Writer(pub Vec<u8>);

    impl Writer {
        /// A `u8`.
        pub fn u8(&mut self, v: u8) -> &mut Self {
            self.0.push(v);
            self
        }
        /// A `u32`.
        pub fn u32(&mut self, v: u32) -> &mut Self {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        /// A `u64`.
        pub fn u64(&mut self, v: u64) -> &mut Self {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        /// Length-prefixed bytes.
        pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
            self.u64(v.len() as u64);
            self.0.extend_from_slice(v);
            self
        }
        /// A length-prefixed UTF-8 string.
        pub fn str(&mut self, v: &str) -> &mut Self {
            self.bytes(v.as_bytes())
        }
        /// A path (its bytes; paths need not be UTF-8).
        pub fn path(&mut self, p: &std::path::Path) -> &mut Self {
            use std::os::unix::ffi::OsStrExt;
            self.bytes(p.as_os_str().as_bytes())
        }
    }

    /// Reads values back, failing with a message that names `what` on any short or bad field.
    #[derive(Debug)]
    pub struct Reader<'a> {
        buf: &'a [u8],
        pos: usize,
        what: &'static str,
    }

    impl<'a> Reader<'a> {
        /// Reads `buf`, a `what` (for messages).
        pub fn new(buf: &'a [u8], what: &'static str) -> Self {
            Reader { buf, pos: 0, what }
        }

        fn short(&self, need: u64) -> Error {
            Error::System(format!(
                "corrupt {}: {need} more bytes needed at offset {}, {} left",
                self.what,
                self.pos,
                self.buf.len() - self.pos
            ))
        }

        fn take(&mut self, n: u64) -> Result<&'a [u8]> {
            let left = (self.buf.len() - self.pos) as u64;
            if n > left {
                return Err(self.short(n));
            }
            let s = &self.buf[self.pos..self.pos + n as usize];
            self.pos += n as usize;
            Ok(s)
        }

        /// A `u8`.
        pub fn u8(&mut self) -> Result<u8> {
            Ok(self.take(1)?[0])
        }
        /// A `u32`.
        pub fn u32(&mut self) -> Result<u32> {
            Ok(u32::from_le_bytes(
                self.take(4)?.try_into().expect("4 bytes"),
            ))
        }
        /// A `u64`.
        pub fn u64(&mut self) -> Result<u64> {
            Ok(u64::from_le_bytes(
                self.take(8)?.try_into().expect("8 bytes"),
            ))
        }
        /// Length-prefixed bytes (borrowed).
        pub fn bytes(&mut self) -> Result<&'a [u8]> {
            let n = self.u64()?;
            self.take(n)
        }
        /// A length-prefixed UTF-8 string.
        pub fn str(&mut self) -> Result<String> {
            let what = self.what;
            let b = self.bytes()?;
            String::from_utf8(b.to_vec())
                .map_err(|_| Error::System(format!("corrupt {what}: a string is not UTF-8")))
        }
        /// A path.
        pub fn path(&mut self) -> Result<PathBuf> {
            use std::os::unix::ffi::OsStrExt;
            Ok(PathBuf::from(std::ffi::OsStr::from_bytes(self.bytes()?)))
        }
        /// A boolean (0 or 1).
        pub fn bool(&mut self) -> Result<bool> {
            match self.u8()? {
                0 => Ok(false),
                1 => Ok(true),
                v => Err(Error::System(format!(
                    "corrupt {}: boolean byte {v}",
                    self.what
                ))),
            }
        }
        /// Fails unless everything was read.
        pub fn finish(self) -> Result<()> {
            if self.pos == self.buf.len() {
                Ok(())
            } else {
                Err(Error::System(format!(
                    "corrupt {}: {} unread bytes at the end",
                    self.what,
                    self.buf.len() - self.pos
                )))
            }
        }
        /// What is being read (for messages of callers).
        pub fn what(&self) -> &'static str {
            self.what
        }
    }
}

use wire::{Reader, Writer};

fn bad(r: &Reader<'_>, what: impl std::fmt::Display) -> Error {
    Error::System(format!("corrupt {}: {what}", r.what()))
}

impl JitTarget {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        w.str(&self.triple).str(&self.cpu).str(&self.features);
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        Ok(JitTarget {
            triple: r.str()?,
            cpu: r.str()?,
            features: r.str()?,
        })
    }
}

impl PostProcess {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        match self {
            PostProcess::Unchanged => {
                w.u8(0);
            }
            PostProcess::LinkHostSharedObject => {
                w.u8(1);
            }
            PostProcess::LinkAmdgpuCodeObject { gfx } => {
                w.u8(2).str(gfx);
            }
            PostProcess::Ptxas {
                path,
                version,
                arch,
            } => {
                w.u8(3).str(path).str(version).str(arch);
            }
        }
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        Ok(match r.u8()? {
            0 => PostProcess::Unchanged,
            1 => PostProcess::LinkHostSharedObject,
            2 => PostProcess::LinkAmdgpuCodeObject { gfx: r.str()? },
            3 => PostProcess::Ptxas {
                path: r.str()?,
                version: r.str()?,
                arch: r.str()?,
            },
            v => return Err(bad(r, format!("post-processing step {v}"))),
        })
    }
}

fn encode_named_file(w: &mut Writer, f: &Option<NamedFile>) {
    match f {
        None => {
            w.u8(0);
        }
        Some(f) => {
            w.u8(1).str(&f.variable).path(&f.path).bytes(&f.bytes);
        }
    }
}

fn decode_named_file(r: &mut Reader<'_>) -> Result<Option<NamedFile>> {
    Ok(if r.bool()? {
        Some(NamedFile {
            variable: r.str()?,
            path: r.path()?,
            bytes: r.bytes()?.to_vec(),
        })
    } else {
        None
    })
}

fn encode_output_path(w: &mut Writer, p: &Option<OutputPath>) {
    match p {
        None => {
            w.u8(0);
        }
        Some(p) => {
            w.u8(1).str(&p.variable).path(&p.path);
        }
    }
}

fn decode_output_path(r: &mut Reader<'_>) -> Result<Option<OutputPath>> {
    Ok(if r.bool()? {
        Some(OutputPath {
            variable: r.str()?,
            path: r.path()?,
        })
    } else {
        None
    })
}

impl JitOptions {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        w.u8(self.opt_level).u8(u8::from(self.skip_opt));
        encode_named_file(w, &self.replacement_module);
        encode_named_file(w, &self.replacement_object);
        encode_output_path(w, &self.pre_opt_ir);
        encode_output_path(w, &self.post_opt_ir);
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let opt_level = r.u8()?;
        if opt_level > 3 {
            return Err(bad(r, format!("optimisation level {opt_level}")));
        }
        Ok(JitOptions {
            opt_level,
            skip_opt: r.bool()?,
            replacement_module: decode_named_file(r)?,
            replacement_object: decode_named_file(r)?,
            pre_opt_ir: decode_output_path(r)?,
            post_opt_ir: decode_output_path(r)?,
        })
    }
}

fn encode_param(w: &mut Writer, p: &ParamType) {
    match p {
        ParamType::I32 => {
            w.u8(0);
        }
        ParamType::I64 => {
            w.u8(1);
        }
        ParamType::F32 => {
            w.u8(2);
        }
        ParamType::F64 => {
            w.u8(3);
        }
        ParamType::Ptr => {
            w.u8(4);
        }
        ParamType::Other(t) => {
            w.u8(5).str(t);
        }
    }
}

fn decode_param(r: &mut Reader<'_>) -> Result<ParamType> {
    Ok(match r.u8()? {
        0 => ParamType::I32,
        1 => ParamType::I64,
        2 => ParamType::F32,
        3 => ParamType::F64,
        4 => ParamType::Ptr,
        5 => ParamType::Other(r.str()?),
        v => return Err(bad(r, format!("parameter type {v}"))),
    })
}

impl CompileOutput {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        encode_signatures(w, &self.signatures);
        w.bytes(&self.bytes);
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let signatures = decode_signatures(r)?;
        Ok(CompileOutput {
            signatures,
            bytes: r.bytes()?.to_vec(),
        })
    }
}

/// Appends kernel signatures.
pub fn encode_signatures(w: &mut Writer, sigs: &[KernelSignature]) {
    w.u64(sigs.len() as u64);
    for s in sigs {
        w.str(&s.name).u64(s.params.len() as u64);
        for p in &s.params {
            encode_param(w, p);
        }
    }
}

/// Reads kernel signatures; counts are bounded by what is left to read.
pub fn decode_signatures(r: &mut Reader<'_>) -> Result<Vec<KernelSignature>> {
    let n = r.u64()?;
    let mut sigs = Vec::new();
    for _ in 0..n {
        let name = r.str()?;
        let count = r.u64()?;
        let mut params = Vec::new();
        for _ in 0..count {
            params.push(decode_param(r)?);
        }
        sigs.push(KernelSignature { name, params });
    }
    Ok(sigs)
}

/// Appends an error as `(kind, native code, message)`.
pub fn encode_error(w: &mut Writer, e: &Error) {
    w.u32(e.kind() as u32)
        .u64(e.native_code() as u64)
        .str(e.message());
}

/// Reads an error written by [`encode_error`].
pub fn decode_error(r: &mut Reader<'_>) -> Result<Error> {
    let kind = r.u32()?;
    let code = r.u64()? as i64;
    Ok(Error::from_parts(kind, code, r.str()?))
}

impl Served {
    /// Wire code.
    pub fn to_u8(self) -> u8 {
        match self {
            Served::MemoryHit => 0,
            Served::SharedCompile => 1,
            Served::Compiled => 2,
            Served::DiskHit => 3,
        }
    }
    /// From the wire code.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Served::MemoryHit,
            1 => Served::SharedCompile,
            2 => Served::Compiled,
            3 => Served::DiskHit,
            _ => return None,
        })
    }
}

/// The part of a [`CompileRequest`] besides the image, as the plugin ABI carries it.
pub fn encode_request_head(target: &JitTarget, post: &PostProcess) -> Vec<u8> {
    let mut w = Writer::default();
    target.encode(&mut w);
    post.encode(&mut w);
    w.0
}

/// Inverse of [`encode_request_head`].
pub fn decode_request_head(bytes: &[u8]) -> Result<(JitTarget, PostProcess)> {
    let mut r = Reader::new(bytes, "JIT request");
    let target = JitTarget::decode(&mut r)?;
    let post = PostProcess::decode(&mut r)?;
    r.finish()?;
    Ok((target, post))
}

/// A [`JitOutput`] as the plugin ABI carries it back.
pub fn encode_output(out: &JitOutput) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(out.served.to_u8())
        .bytes(&out.image.key.0)
        .u64(out.image.compile_time.as_nanos() as u64);
    encode_signatures(&mut w, &out.image.signatures);
    w.bytes(&out.image.bytes);
    w.0
}

/// Inverse of [`encode_output`].
pub fn decode_output(bytes: &[u8]) -> Result<JitOutput> {
    let mut r = Reader::new(bytes, "JIT result");
    let served = r.u8()?;
    let served = Served::from_u8(served).ok_or_else(|| bad(&r, format!("served code {served}")))?;
    let key: [u8; 32] = r
        .bytes()?
        .try_into()
        .map_err(|_| Error::System("corrupt JIT result: key is not 32 bytes".into()))?;
    let compile_time = Duration::from_nanos(r.u64()?);
    let signatures = decode_signatures(&mut r)?;
    let image = r.bytes()?.to_vec();
    r.finish()?;
    Ok(JitOutput {
        image: Arc::new(CompiledImage {
            key: CacheKey(key),
            bytes: image,
            signatures,
            compile_time,
        }),
        served,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_round_trip_and_every_truncation_is_an_error() {
        let out = JitOutput {
            image: Arc::new(CompiledImage {
                key: CacheKey([7; 32]),
                bytes: b"image".to_vec(),
                signatures: vec![KernelSignature {
                    name: "k".into(),
                    params: vec![
                        ParamType::I32,
                        ParamType::Other("i16".into()),
                        ParamType::Ptr,
                    ],
                }],
                compile_time: Duration::from_micros(5),
            }),
            served: Served::SharedCompile,
        };
        let bytes = encode_output(&out);
        let back = decode_output(&bytes).unwrap();
        assert_eq!(back.served, Served::SharedCompile);
        assert_eq!(back.image.bytes, b"image");
        assert_eq!(back.image.signatures, out.image.signatures);
        assert_eq!(back.image.key, CacheKey([7; 32]));
        for len in 0..bytes.len() {
            let e = decode_output(&bytes[..len]).unwrap_err();
            assert!(e.to_string().contains("corrupt JIT result"), "{e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_output(&longer).is_err());
    }

    #[test]
    fn options_and_requests_round_trip() {
        let options = JitOptions {
            opt_level: 1,
            skip_opt: true,
            replacement_module: Some(NamedFile {
                variable: "V".into(),
                path: "/a b/m.bc".into(),
                bytes: vec![1, 2],
            }),
            replacement_object: None,
            pre_opt_ir: Some(OutputPath {
                variable: "P".into(),
                path: "x.ll".into(),
            }),
            post_opt_ir: None,
        };
        let mut w = Writer::default();
        options.encode(&mut w);
        let mut r = Reader::new(&w.0, "options");
        assert_eq!(JitOptions::decode(&mut r).unwrap(), options);
        r.finish().unwrap();
        let target = JitTarget {
            triple: "amdgcn-amd-amdhsa".into(),
            cpu: "gfx90a".into(),
            features: "+xnack".into(),
        };
        let post = PostProcess::LinkAmdgpuCodeObject {
            gfx: "gfx90a".into(),
        };
        let head = encode_request_head(&target, &post);
        assert_eq!(decode_request_head(&head).unwrap(), (target, post));
    }
}

/// The pipe protocol between the JIT client and the worker process (and the in-process
/// engine's entry point, which takes the same payloads).
///
/// Every message is a frame: request id (`u64`), kind (`u8`), payload length (`u64`), payload.
/// The worker sends [`protocol::HELLO`] first, then one [`protocol::RESULT`] per
/// [`protocol::COMPILE`], in any order (compiles run in parallel inside the worker).
pub mod protocol {
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
    pub fn write_frame(
        w: &mut impl Write,
        id: u64,
        kind: u8,
        payload: &[u8],
    ) -> std::io::Result<()> {
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
}
