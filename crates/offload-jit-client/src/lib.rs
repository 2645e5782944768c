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
pub mod inprocess;
pub mod ptxas;
pub mod worker;

pub use cache::{Cache, CompileError, KeyBuilder};
pub use config::{Isolation, JitConfig};
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
    requesters: Mutex<HashMap<String, JitStats>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
        JitClient {
            config,
            cache: Cache::new(capacity),
            search_dirs: Mutex::new(search_dirs),
            backend: OnceLock::new(),
            requesters: Mutex::default(),
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

    /// The cache key of a request: BLAKE3 over the image, the target, every setting that
    /// changes the output, the LLVM and engine versions and the post-processing step.
    pub fn key(config: &JitConfig, request: &CompileRequest<'_>) -> CacheKey {
        let o = &config.options;
        let mut k = KeyBuilder::new();
        k.field("image", request.image)
            .field("triple", request.target.triple.as_bytes())
            .field("cpu", request.target.cpu.as_bytes())
            .field("features", request.target.features.as_bytes())
            .field("opt", &[o.opt_level, u8::from(o.skip_opt)])
            .field("llvm", LLVM_VERSION.as_bytes())
            .field("engine", ENGINE_VERSION.as_bytes())
            .field(
                "replacement-module",
                o.replacement_module.as_ref().map_or(&[][..], |r| &r.bytes),
            )
            .field(
                "replacement-object",
                o.replacement_object.as_ref().map_or(&[][..], |r| &r.bytes),
            )
            .field("post-process", request.post.id().as_bytes());
        k.finish()
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
    /// search directories, else the directory of the running executable.
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
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let dirs = lock(&self.search_dirs).clone();
        for dir in dirs.iter().chain(exe_dir.iter()) {
            let candidate = dir.join(name);
            if candidate.is_file() {
                return Ok(candidate);
            }
            tried.push(dir.display().to_string());
        }
        Err(Error::NotFound(format!(
            "the JIT {} '{name}' is not in any of: {} (build it with `cargo build --workspace`, or \
             set {} to its path)",
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
                            memory_limit: config.memory_limit.clone(),
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
        match &result {
            Ok(out) => match out.served {
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
        let key = Self::key(config, request);
        let describe = || {
            format!(
                "image {} ({} bytes) for {} {}",
                key.short(),
                request.image.len(),
                request.target.triple,
                request.target.cpu
            )
        };
        let (image, served) = self.cache.get_or_compile(key, || {
            let payload = protocol::encode_compile(
                &request.target,
                &request.post,
                &config.options,
                request.image,
            );
            let output = match self.backend()? {
                Backend::Worker(s) => match s.compile(&payload, &describe) {
                    Ok(o) => o.output,
                    Err(worker::WorkerFailure::Compile(e)) => return Err(e.into()),
                    Err(worker::WorkerFailure::Died { error, remember }) => {
                        return Err(CompileError { error, remember });
                    }
                },
                Backend::InProcess(lib) => lib.compile(&payload)??.output,
            };
            if let Some(dir) = &config.save_image_dir {
                save_image(dir, &key, request, &output)?;
            }
            Ok(output)
        })?;
        Ok(JitOutput { image, served })
    }

    /// Counters over every requester.
    pub fn stats(&self) -> JitStats {
        self.cache.stats()
    }

    /// Counters of one requester (cache-wide sizes included); `None` if it never asked.
    pub fn stats_for(&self, requester: &str) -> Option<JitStats> {
        let mine = *lock(&self.requesters).get(requester)?;
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
