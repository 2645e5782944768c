//! # offload-jit-client
//!
//! The JIT as every process that is not the compiler sees it, without linking LLVM: it computes
//! cache keys, serves repeated requests from a content-addressed, single-flight cache, and hands
//! real compiles to the JIT worker process (`offload-jit-worker`, the only executable that links
//! LLVM). A crash, abort, runaway or memory bomb inside LLVM kills the worker, never the caller:
//! the compile that caused it gets one clear error, other compiles in flight are retried on a
//! fresh worker, and the key is remembered as failed (see [`worker`]).
//!
//! One client per process: the runtime makes it and offers it to every plugin through the
//! plugin ABI ([`JitClient::service`]), so all plugins share one worker and one cache. A
//! plugin used without the runtime makes its own.
//!
//! `OFFLOAD_JIT_ISOLATION=inprocess` compiles in the calling process instead, through the
//! engine library (`liboffload_jit.so`): for embedding and tests, and documented as not
//! crash-safe.

pub mod cache;
pub mod config;
pub mod disk;
pub mod inprocess;
pub mod key;
pub mod limits;
pub mod ptxas;
pub mod remote;
pub mod worker;

pub use cache::{Cache, CompileError};
pub use config::{DiskConfig, DiskMode, Isolation, JitConfig};
pub use disk::{DiskCache, DiskStats};
pub use key::KeyBuilder;
pub use remote::{RemoteCache, RemoteConfig, RemoteStats};
pub use worker::WorkerStats;

use offload_core::jit::protocol;
use offload_core::jit::{
    CacheKey, CompileOutput, CompileRequest, JitOutput, JitService, OutputPath, Served,
};
use offload_core::{Error, JitStats, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// File name of the worker executable.
pub const WORKER_NAME: &str = "offload-jit-worker";
/// File name of the engine library used in in-process mode.
pub const ENGINE_LIBRARY: &str = "liboffload_jit.so";
/// The LLVM version the worker is built against (from `llvm-config` at build time): part of
/// every key, and checked against the worker's own report when it starts.
pub const LLVM_VERSION: &str = env!("OFFLOAD_LLVM_VERSION");
/// The engine version this client expects the worker to be: part of every key.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The directory of the LLVM shared library the worker loads (`llvm-config --libdir` at build
/// time).
pub const LLVM_LIBDIR: &str = env!("OFFLOAD_LLVM_LIBDIR");

enum Backend {
    Worker(worker::Supervisor),
    InProcess(inprocess::InProcess),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Worker(s) => write!(f, "Worker({})", s.path().display()),
            Backend::InProcess(l) => write!(f, "InProcess({})", l.path().display()),
        }
    }
}

/// See the crate docs.
#[derive(Debug)]
pub struct JitClient {
    config: Result<JitConfig>,
    cache: Cache,
    search_dirs: Mutex<Vec<PathBuf>>,
    backend: OnceLock<std::result::Result<Backend, Error>>,
    requesters: Mutex<HashMap<String, (JitStats, u64, u64)>>,
    disk: DiskCache,
    /// The remote tier (`OFFLOAD_CACHE_REMOTE`).
    remote: Option<RemoteCache>,
    /// The toolchain's part of disk keys (`None`: the engine could not be found, so nothing
    /// compiles and the disk is not used).
    toolchain: OnceLock<Option<[u8; 32]>>,
}

use offload_core::sync::lock;

/// Whether the bytes are JIT input (bitcode, raw or wrapped, or textual IR).
pub fn is_jit_input(bytes: &[u8]) -> bool {
    use offload_core::image::{BITCODE_MAGIC, BITCODE_WRAPPER_MAGIC};
    (bytes.len() >= 4 && (bytes[..4] == BITCODE_MAGIC || bytes[..4] == BITCODE_WRAPPER_MAGIC))
        || offload_core::image::looks_like_llvm_ir(bytes)
}

impl JitClient {
    /// A client with an explicit configuration (a configuration error is reported by every
    /// compile). `search_dirs` are where the worker is looked for when `OFFLOAD_JIT_WORKER` is
    /// not set, before the executable's own directory. Nothing is started yet.
    pub fn new(config: Result<JitConfig>, search_dirs: Vec<PathBuf>) -> Self {
        let capacity = config.as_ref().map_or(0, |c| c.cache_capacity);
        let disk = DiskCache::new(
            config
                .as_ref()
                .map_or_else(|_| JitConfig::default().disk, |c| c.disk.clone()),
        );
        let remote = config
            .as_ref()
            .ok()
            .and_then(|c| c.remote.clone())
            .map(RemoteCache::new);
        JitClient {
            config,
            remote,
            cache: Cache::new(capacity),
            search_dirs: Mutex::new(search_dirs),
            backend: OnceLock::new(),
            requesters: Mutex::default(),
            disk,
            toolchain: OnceLock::new(),
        }
    }

    /// A client configured from the environment (`OFFLOAD_JIT_*`).
    pub fn from_env(search_dirs: Vec<PathBuf>) -> Self {
        Self::new(JitConfig::from_env(), search_dirs)
    }

    /// The configuration, or the error that the environment gave.
    pub fn config(&self) -> Result<&JitConfig> {
        self.config.as_ref().map_err(Clone::clone)
    }

    /// The disk cache.
    pub fn disk(&self) -> &DiskCache {
        &self.disk
    }

    /// The remote cache, if one is configured.
    pub fn remote(&self) -> Option<&RemoteCache> {
        self.remote.as_ref()
    }

    /// The toolchain identity: the engine's contents (the worker, or the in-process engine
    /// library) and the LLVM library's file, computed once, without loading LLVM (see
    /// [`disk`]).
    fn toolchain(&self) -> Option<[u8; 32]> {
        *self.toolchain.get_or_init(|| {
            let config = self.config().ok()?;
            let name = match config.isolation {
                Isolation::Worker => WORKER_NAME,
                Isolation::InProcess => ENGINE_LIBRARY,
            };
            let engine = self.locate(name).ok()?;
            let memo = (config.disk.mode == DiskMode::ReadWrite && self.disk.usable().is_ok())
                .then_some(config.disk.dir.as_path());
            let digest = key::file_digest(&engine, memo).ok()?;
            Some(key::toolchain(&digest, name))
        })
    }

    /// The key a request whose in-memory key is `key` has on disk and in the remote cache:
    /// that key, the toolchain, the post-processing tool's file and the entry schema. `None`
    /// when neither is to be used for it (the disk off or unusable and no remote, or the
    /// request asks for IR dumps, which only a compile writes).
    fn disk_key(
        &self,
        config: &JitConfig,
        request: &CompileRequest<'_>,
        key: &CacheKey,
    ) -> Option<CacheKey> {
        if config.options.pre_opt_ir.is_some()
            || config.options.post_opt_ir.is_some()
            || (!self.disk_in_use(config) && self.remote.is_none())
        {
            return None;
        }
        Some(key::disk_key(key, &self.toolchain()?, &request.post))
    }

    fn disk_in_use(&self, config: &JitConfig) -> bool {
        config.disk.mode != DiskMode::Off && self.disk.usable().is_ok()
    }

    /// Adds directories to look for the worker in (the runtime adds its plugin directories).
    pub fn add_search_dirs(&self, dirs: &[PathBuf]) {
        let mut mine = lock(&self.search_dirs);
        for d in dirs {
            if !mine.contains(d) {
                mine.push(d.clone());
            }
        }
    }

    /// Where the worker (or, in-process, the engine library) is: `OFFLOAD_JIT_WORKER`, else the
    /// search directories, else the directory of the running executable, else (the worker
    /// only) the directories of `PATH`, where `cargo install --path crates/offload-jit` puts
    /// it.
    pub fn locate(&self, name: &str) -> Result<PathBuf> {
        let config = self.config()?;
        if let Some(w) = &config.worker {
            return Ok(if name == WORKER_NAME {
                w.clone()
            } else {
                w.parent().unwrap_or(Path::new(".")).join(name)
            });
        }
        let mut tried = Vec::new();
        let exe_dir = offload_core::fs::exe_dir();
        let dirs = lock(&self.search_dirs).clone();
        let path_dirs: Vec<PathBuf> = if name == WORKER_NAME {
            offload_core::fs::path_dirs()
        } else {
            Vec::new()
        };
        for dir in dirs.iter().chain(exe_dir.iter()).chain(path_dirs.iter()) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
            tried.push(dir.display().to_string());
        }
        Err(Error::NotFound(format!(
            "the JIT {} '{name}' is not in any of: {} (build it with `cargo build --workspace` or \
             install it with `cargo install --path crates/offload-jit`, or set {} to its path)",
            if name == WORKER_NAME {
                "worker"
            } else {
                "engine library"
            },
            if tried.is_empty() {
                "(no directory)".to_string()
            } else {
                tried.join(", ")
            },
            config::WORKER[0]
        )))
    }

    fn backend(&self) -> Result<&Backend> {
        self.backend
            .get_or_init(|| {
                let config = self.config()?;
                Ok(match config.isolation {
                    Isolation::Worker => {
                        Backend::Worker(worker::Supervisor::new(worker::WorkerSettings {
                            path: self.locate(WORKER_NAME)?,
                            limits: config.limits.clone(),
                            timeout: config.timeout.clone(),
                            llvm_version: LLVM_VERSION.into(),
                            engine_version: ENGINE_VERSION.into(),
                        }))
                    }
                    Isolation::InProcess => Backend::InProcess(inprocess::InProcess::open(
                        &self.locate(ENGINE_LIBRARY)?,
                    )?),
                })
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Compiles (or finds) `request` on behalf of `requester` (a plugin name, for the
    /// per-plugin counters).
    pub fn compile_for(&self, requester: &str, request: &CompileRequest<'_>) -> Result<JitOutput> {
        let result = self.compile_inner(request);
        let mut all = lock(&self.requesters);
        let stats = all.entry(requester.to_string()).or_default();
        let (stats, disk_hits, remote_hits) = (&mut stats.0, &mut stats.1, &mut stats.2);
        match &result {
            Ok(out) => match out.served {
                Served::DiskHit => *disk_hits += 1,
                Served::RemoteHit => *remote_hits += 1,
                Served::MemoryHit => stats.memory_hits += 1,
                Served::SharedCompile => stats.shared_waits += 1,
                Served::Compiled => {
                    stats.misses += 1;
                    stats.compiles += 1;
                    stats.compile_ns += out.image.compile_time.as_nanos() as u64;
                }
            },
            Err(_) => stats.failures += 1,
        }
        result
    }

    fn compile_inner(&self, request: &CompileRequest<'_>) -> Result<JitOutput> {
        let config = self.config()?;
        if !is_jit_input(request.image) {
            return Err(Error::InvalidImage(
                "neither LLVM bitcode (magic 'BC' c0 de, or wrapper de c0 17 0b) nor textual LLVM IR"
                    .into(),
            ));
        }
        let key = key::request_key(config, request);
        let describe = || {
            format!(
                "image {} ({} bytes) for {} {}",
                key.short(),
                request.image.len(),
                request.target.triple,
                request.target.cpu
            )
        };
        // (At debug level: the info log has the outcome below instead.)
        let _span = tracing::debug_span!(
            target: "offload::jit",
            "jit request",
            key = %key.short(),
            bytes = request.image.len(),
            "{}",
            describe()
        )
        .entered();
        let (image, served) = self.cache.get_or_produce(key, || {
            let compile = || -> std::result::Result<CompileOutput, CompileError> {
                let payload = protocol::encode_compile(
                    &request.target,
                    &request.post,
                    &config.options,
                    request.image,
                );
                let _activity = offload_core::diag::activity(format!("compiling {}", describe()));
                let _span = tracing::info_span!(
                    target: "offload::jit",
                    "compile",
                    key = %key.short(),
                    "compile {}",
                    describe()
                )
                .entered();
                Ok(match self.backend()? {
                    Backend::Worker(s) => match s.compile(&payload, &describe) {
                        Ok(o) => o.output,
                        Err(worker::WorkerFailure::Compile(e)) => return Err(e.into()),
                        Err(worker::WorkerFailure::Died { error, remember }) => {
                            return Err(CompileError { error, remember });
                        }
                    },
                    Backend::InProcess(lib) => {
                        let out = lib.compile(&payload)??;
                        report_phases(std::process::id(), &out);
                        out.output
                    }
                })
            };
            // The disk, then the remote, before any worker is started.
            let (output, source) = match self.disk_key(config, request, &key) {
                Some(disk_key) => {
                    let label = format!(
                        "{} {} {}, {}-byte input",
                        request.target.triple,
                        request.target.cpu,
                        request.post.id(),
                        request.image.len()
                    );
                    let from_remote = std::cell::Cell::new(false);
                    // Under the disk's lock: one process of the machine asks the remote.
                    let remote_or_compile = || match &self.remote {
                        Some(r) => r
                            .get_or_compile(&disk_key, &label, compile)
                            .map(|(o, hit)| {
                                from_remote.set(hit);
                                o
                            }),
                        None => compile(),
                    };
                    let (output, from_disk) = if self.disk_in_use(config) {
                        self.disk
                            .get_or_compile(&disk_key, &label, remote_or_compile)?
                    } else {
                        (remote_or_compile()?, false)
                    };
                    let source = if from_disk {
                        Served::DiskHit
                    } else if from_remote.get() {
                        Served::RemoteHit
                    } else {
                        Served::Compiled
                    };
                    (output, source)
                }
                None => (compile()?, Served::Compiled),
            };
            if let Some(dir) = &config.save_image_dir {
                save_image(dir, &key, request, &output)?;
            }
            Ok((output, source))
        })?;
        tracing::info!(
            target: "offload::jit",
            key = %key.short(),
            "{}: {}",
            describe(),
            match served {
                Served::MemoryHit => "found in memory".to_string(),
                Served::DiskHit => "read from the disk cache".to_string(),
                Served::RemoteHit => "read from the remote cache".to_string(),
                Served::SharedCompile => "another thread's compile, waited for".to_string(),
                Served::Compiled => format!(
                    "compiled in {:.3} ms ({} bytes)",
                    image.compile_time.as_secs_f64() * 1e3,
                    image.bytes.len()
                ),
            }
        );
        Ok(JitOutput { image, served })
    }

    /// Counters over every requester.
    pub fn stats(&self) -> JitStats {
        self.cache.stats()
    }

    /// Requests of one requester served from the disk cache.
    pub fn disk_hits_for(&self, requester: &str) -> u64 {
        lock(&self.requesters).get(requester).map_or(0, |s| s.1)
    }

    /// Requests of one requester served from the remote cache.
    pub fn remote_hits_for(&self, requester: &str) -> u64 {
        lock(&self.requesters).get(requester).map_or(0, |s| s.2)
    }

    /// Counters of one requester (cache-wide sizes included); `None` if it never asked.
    pub fn stats_for(&self, requester: &str) -> Option<JitStats> {
        let mine = lock(&self.requesters).get(requester)?.0;
        let all = self.cache.stats();
        Some(JitStats {
            entries: all.entries,
            bytes: all.bytes,
            evictions: all.evictions,
            in_flight: all.in_flight,
            peak_in_flight: all.peak_in_flight,
            ..mine
        })
    }

    /// The worker's counters (zero in in-process mode or before the first compile).
    pub fn worker_stats(&self) -> WorkerStats {
        match self.backend.get() {
            Some(Ok(Backend::Worker(s))) => s.stats(),
            _ => WorkerStats::default(),
        }
    }

    /// The running worker's pid.
    pub fn worker_pid(&self) -> Option<u32> {
        match self.backend.get() {
            Some(Ok(Backend::Worker(s))) => s.pid(),
            _ => None,
        }
    }

    /// This client as a [`JitService`] whose requests count as `requester`'s.
    pub fn service(self: &Arc<Self>, requester: &str) -> Arc<dyn JitService> {
        Arc::new(Requester {
            client: self.clone(),
            name: requester.to_string(),
        })
    }
}

/// Puts the phases of a compile that just ended on the trace: `pid`'s track, placed from the
/// compile's length as the worker measured it (it ended now).
pub(crate) fn report_phases(pid: u32, out: &protocol::WorkerOutput) {
    if !tracing::enabled!(target: "offload::jit", tracing::Level::DEBUG) {
        return;
    }
    let end = std::time::Instant::now();
    let start = end
        .checked_sub(std::time::Duration::from_nanos(out.compile_ns))
        .unwrap_or(end);
    for (phase, at, dur) in &out.phases {
        let ts = offload_core::diag::micros(start + std::time::Duration::from_nanos(*at));
        tracing::debug!(
            target: "offload::jit",
            worker_pid = pid,
            phase = %phase,
            phase_ts_us = ts,
            phase_dur_us = *dur as f64 / 1e3,
            "compile phase {phase}: {:.3} ms",
            *dur as f64 / 1e6
        );
    }
}

fn save_image(
    dir: &OutputPath,
    key: &CacheKey,
    request: &CompileRequest<'_>,
    output: &CompileOutput,
) -> Result<()> {
    let ext = match &request.post {
        offload_core::jit::PostProcess::Unchanged if request.target.triple.starts_with("nvptx") => {
            "ptx"
        }
        offload_core::jit::PostProcess::Ptxas { .. } => "cubin",
        _ => "img",
    };
    OutputPath {
        variable: dir.variable.clone(),
        path: dir.path.join(format!("{}.{ext}", key.hex())),
    }
    .write(&output.bytes)
}

impl JitService for JitClient {
    fn compile(&self, request: &CompileRequest<'_>) -> Result<JitOutput> {
        self.compile_for("", request)
    }
}

#[derive(Debug)]
struct Requester {
    client: Arc<JitClient>,
    name: String,
}

impl JitService for Requester {
    fn compile(&self, request: &CompileRequest<'_>) -> Result<JitOutput> {
        self.client.compile_for(&self.name, request)
    }
}
