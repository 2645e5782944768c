//! The JIT's environment variables, read in one place.
//!
//! The upstream ones have an `OFFLOAD_JIT_*` name and upstream's `LIBOMPTARGET_JIT_*` name as
//! an alias (the first that is set wins). Unlike upstream, a bad value is an error naming the
//! variable, and paths may contain spaces. The isolation settings (`OFFLOAD_JIT_ISOLATION`,
//! `OFFLOAD_JIT_WORKER`, `OFFLOAD_JIT_TIMEOUT`, and the worker's resource limits of
//! [`crate::limits`]) are this project's own.

use offload_core::env;
use offload_core::jit::{JitOptions, NamedFile, OutputPath};
use offload_core::{Error, Result};
use std::path::PathBuf;
use std::time::Duration;

/// Optimisation level `0..=3` (default 3).
pub const OPT_LEVEL: [&str; 2] = ["OFFLOAD_JIT_OPT_LEVEL", "LIBOMPTARGET_JIT_OPT_LEVEL"];
/// Skip the optimisation pipeline (boolean).
pub const SKIP_OPT: [&str; 2] = ["OFFLOAD_JIT_SKIP_OPT", "LIBOMPTARGET_JIT_SKIP_OPT"];
/// A bitcode or IR file that replaces every input module.
pub const REPLACEMENT_MODULE: [&str; 2] = [
    "OFFLOAD_JIT_REPLACEMENT_MODULE",
    "LIBOMPTARGET_JIT_REPLACEMENT_MODULE",
];
/// An object file that replaces the result of code generation.
pub const REPLACEMENT_OBJECT: [&str; 2] = [
    "OFFLOAD_JIT_REPLACEMENT_OBJECT",
    "LIBOMPTARGET_JIT_REPLACEMENT_OBJECT",
];
/// Where to write the module's IR before optimisation.
pub const PRE_OPT_IR_MODULE: [&str; 2] = [
    "OFFLOAD_JIT_PRE_OPT_IR_MODULE",
    "LIBOMPTARGET_JIT_PRE_OPT_IR_MODULE",
];
/// Where to write the module's IR after optimisation.
pub const POST_OPT_IR_MODULE: [&str; 2] = [
    "OFFLOAD_JIT_POST_OPT_IR_MODULE",
    "LIBOMPTARGET_JIT_POST_OPT_IR_MODULE",
];
/// A directory where every compiled image is written as `<cache key>.<ext>`.
pub const SAVE_IMAGE: [&str; 2] = ["OFFLOAD_JIT_SAVE_IMAGE", "LIBOMPTARGET_JIT_SAVE_IMAGE"];
/// In-memory cache capacity in MiB (default 256).
pub const CACHE_MB: [&str; 1] = ["OFFLOAD_JIT_CACHE_MB"];
/// `worker` (default) or `inprocess`.
pub const ISOLATION: [&str; 1] = ["OFFLOAD_JIT_ISOLATION"];
/// Path of the worker executable (default: found next to the plugins).
pub const WORKER: [&str; 1] = ["OFFLOAD_JIT_WORKER"];
/// Seconds one compile may take before the worker is killed (default 300; 0: no limit).
pub const TIMEOUT: [&str; 1] = ["OFFLOAD_JIT_TIMEOUT"];
/// The worker's address-space limit (default: the machine's memory, at least 4 GiB, or the
/// inherited limit where that is smaller; `none`: no limit of the JIT's own). The other
/// limits are in [`crate::limits`].
pub const MEMORY_LIMIT: [&str; 1] = ["OFFLOAD_JIT_MEMORY_LIMIT"];

/// The disk cache: `1`/`on` (default), `0`/`off`, or `read-only` (look up, never write).
pub const DISK_CACHE: [&str; 1] = ["OFFLOAD_CACHE"];
/// The disk cache's directory (default `$XDG_CACHE_HOME/offload/jit`, else
/// `~/.cache/offload/jit`).
pub const DISK_CACHE_DIR: [&str; 1] = ["OFFLOAD_CACHE_DIR"];
/// The disk cache's size cap (bytes, or with a K/M/G/T suffix; default 1 GiB).
pub const DISK_CACHE_MAX_SIZE: [&str; 1] = ["OFFLOAD_CACHE_MAX_SIZE"];
/// Load entries from a directory that is group- or world-writable or owned by another user
/// (a shared, pre-populated cache): boolean, default no.
pub const DISK_CACHE_TRUST: [&str; 1] = ["OFFLOAD_CACHE_TRUST"];
/// Default [`DISK_CACHE_MAX_SIZE`].
pub const DEFAULT_DISK_CACHE_MAX_SIZE: u64 = 1 << 30;

/// Default [`TIMEOUT`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
pub use crate::limits::MIN_MEMORY_LIMIT;

/// Where compiles run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    /// In the JIT worker process: a crash, abort, runaway or memory bomb in LLVM kills only
    /// the worker, and the caller gets an error.
    Worker,
    /// In the calling process, through the engine library (`liboffload_jit.so`): no process
    /// start, but **not crash-safe**: whatever kills LLVM kills the caller, and the time and
    /// memory limits do not apply. For embedding and for the engine's own tests.
    InProcess,
}

/// What the disk cache may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskMode {
    /// No disk cache.
    Off,
    /// Look up and store.
    ReadWrite,
    /// Look up only (a shared, pre-populated cache).
    ReadOnly,
}

impl DiskMode {
    /// `off`, `read-write` or `read-only`.
    pub fn name(self) -> &'static str {
        match self {
            DiskMode::Off => "off",
            DiskMode::ReadWrite => "read-write",
            DiskMode::ReadOnly => "read-only",
        }
    }
}

/// The disk cache's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// What it may do (`Off` also when no directory could be found; see `note`).
    pub mode: DiskMode,
    /// Its directory (absolute).
    pub dir: PathBuf,
    /// The size cap in bytes.
    pub max_size: u64,
    /// Load entries from a directory others may write ([`DISK_CACHE_TRUST`]).
    pub trust: bool,
    /// Why it is off when it was not asked to be (no home directory).
    pub note: Option<String>,
}

impl DiskConfig {
    /// Reads `OFFLOAD_CACHE*`; the first bad one is the error.
    pub fn from_env() -> Result<Self> {
        let mode = match env::raw(&DISK_CACHE)? {
            None => DiskMode::ReadWrite,
            Some((name, v)) => match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => DiskMode::ReadWrite,
                "0" | "false" | "no" | "off" => DiskMode::Off,
                "read-only" | "readonly" | "ro" => DiskMode::ReadOnly,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "environment variable {name}='{v}' is not valid: expected 1/on (the default), 0/off, or read-only"
                    )));
                }
            },
        };
        let max_size = env::size_in_range(&DISK_CACHE_MAX_SIZE, 1, 1 << 50)?
            .unwrap_or(DEFAULT_DISK_CACHE_MAX_SIZE);
        let trust = boolean(&DISK_CACHE_TRUST)?.unwrap_or(false);
        let (dir, note) = match env::raw(&DISK_CACHE_DIR)? {
            Some((name, v)) => {
                let p = std::path::absolute(PathBuf::from(&v)).map_err(|e| {
                    Error::InvalidArgument(format!("environment variable {name}='{v}': {e}"))
                })?;
                (p, None)
            }
            None => {
                let base = env::raw(&["XDG_CACHE_HOME"])?
                    .map(|(_, v)| PathBuf::from(v))
                    .filter(|p| p.is_absolute())
                    .or_else(|| {
                        env::raw(&["HOME"])
                            .ok()
                            .flatten()
                            .map(|(_, v)| PathBuf::from(v).join(".cache"))
                            .filter(|p| p.is_absolute())
                    });
                match base {
                    Some(b) => (b.join("offload").join("jit"), None),
                    None => (
                        PathBuf::new(),
                        Some(format!(
                            "no cache directory: neither XDG_CACHE_HOME nor HOME is set to an absolute path (set {})",
                            DISK_CACHE_DIR[0]
                        )),
                    ),
                }
            }
        };
        Ok(DiskConfig {
            mode: if note.is_some() { DiskMode::Off } else { mode },
            dir,
            max_size,
            trust,
            note,
        })
    }
}

/// A time or memory limit and the variable that set it (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit<T> {
    /// The value.
    pub value: T,
    /// `OFFLOAD_JIT_TIMEOUT=2` or `default`.
    pub source: String,
}

/// Everything the environment can change about JIT compilation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitConfig {
    /// What each compile is told (part of the cache key).
    pub options: JitOptions,
    /// Directory for compiled images.
    pub save_image_dir: Option<OutputPath>,
    /// In-memory cache capacity in bytes.
    pub cache_capacity: u64,
    /// Where compiles run.
    pub isolation: Isolation,
    /// An explicit worker executable (`OFFLOAD_JIT_WORKER`).
    pub worker: Option<PathBuf>,
    /// Per-compile time limit (`None`: no limit).
    pub timeout: Option<Limit<Duration>>,
    /// The worker's resource limits, as asked (resolved against the inherited ones when a
    /// worker starts).
    pub limits: crate::limits::WorkerLimits,
    /// The disk cache.
    pub disk: DiskConfig,
    /// The remote tier (`OFFLOAD_CACHE_REMOTE`), if any.
    pub remote: Option<crate::remote::RemoteConfig>,
}

impl Default for JitConfig {
    fn default() -> Self {
        JitConfig {
            options: JitOptions::default(),
            save_image_dir: None,
            cache_capacity: 256 << 20,
            isolation: Isolation::Worker,
            worker: None,
            timeout: Some(Limit {
                value: DEFAULT_TIMEOUT,
                source: format!("{} default", TIMEOUT[0]),
            }),
            limits: crate::limits::WorkerLimits::default(),
            disk: DiskConfig {
                mode: DiskMode::Off,
                dir: PathBuf::new(),
                max_size: DEFAULT_DISK_CACHE_MAX_SIZE,
                trust: false,
                note: None,
            },
            remote: None,
        }
    }
}

fn boolean(names: &[&str]) -> Result<Option<bool>> {
    let Some((name, value)) = env::raw(names)? else {
        return Ok(None);
    };
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(Some(true)),
        "0" | "false" | "no" | "off" => Ok(Some(false)),
        _ => Err(Error::InvalidArgument(format!(
            "environment variable {name}='{value}' is not valid: expected 1/0, true/false, yes/no or on/off"
        ))),
    }
}

fn input_file(names: &[&str]) -> Result<Option<NamedFile>> {
    let Some((variable, value)) = env::raw(names)? else {
        return Ok(None);
    };
    let path = PathBuf::from(&value);
    let bytes = offload_core::fs::read_regular(&path, "the file")
        .map_err(|e| e.context(format!("environment variable {variable}='{value}'")))?;
    Ok(Some(NamedFile {
        variable,
        path,
        bytes,
    }))
}

fn output_path(names: &[&str], must_be_dir: bool) -> Result<Option<OutputPath>> {
    let Some((variable, value)) = env::raw(names)? else {
        return Ok(None);
    };
    // Relative paths are made absolute here: the worker writes the dumps, and what the user
    // meant is the directory they started in.
    let path = std::path::absolute(PathBuf::from(&value)).map_err(|e| {
        Error::InvalidArgument(format!("environment variable {variable}='{value}': {e}"))
    })?;
    let dir = if must_be_dir {
        Some(path.as_path())
    } else {
        path.parent().filter(|p| !p.as_os_str().is_empty())
    };
    if let Some(dir) = dir
        && !dir.is_dir()
    {
        return Err(Error::InvalidArgument(format!(
            "environment variable {variable}='{value}': directory '{}' does not exist",
            dir.display()
        )));
    }
    Ok(Some(OutputPath { variable, path }))
}

fn timeout() -> Result<Option<Limit<Duration>>> {
    let Some((name, value)) = env::raw(&TIMEOUT)? else {
        return Ok(JitConfig::default().timeout);
    };
    match value.trim().parse::<f64>() {
        Ok(0.0) => Ok(None),
        Ok(s) if s.is_finite() && (0.001..=86400.0).contains(&s) => Ok(Some(Limit {
            value: Duration::from_secs_f64(s),
            source: format!("{name}={}", value.trim()),
        })),
        _ => Err(Error::InvalidArgument(format!(
            "environment variable {name}='{value}' is not valid: expected seconds from 0.001 to \
             86400 (decimals allowed), or 0 for no limit"
        ))),
    }
}

impl JitConfig {
    /// Reads every JIT variable; the first bad one is the error.
    pub fn from_env() -> Result<Self> {
        let opt_level =
            env::parsed::<u8>(&OPT_LEVEL, |v| *v <= 3, "an integer from 0 to 3")?.unwrap_or(3);
        let cache_mb = env::parsed::<u64>(
            &CACHE_MB,
            |v| *v <= 1 << 30,
            "a size in MiB from 0 to 1073741824",
        )?
        .unwrap_or(256);
        let isolation = match env::raw(&ISOLATION)? {
            None => Isolation::Worker,
            Some((name, v)) => match v.trim().to_ascii_lowercase().as_str() {
                "worker" => Isolation::Worker,
                "inprocess" | "in-process" => Isolation::InProcess,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "environment variable {name}='{v}' is not valid: expected 'worker' \
                         (compile in a separate process; the default) or 'inprocess' (not \
                         crash-safe)"
                    )));
                }
            },
        };
        let worker = match env::raw(&WORKER)? {
            None => None,
            Some((name, v)) => {
                let p = PathBuf::from(&v);
                if !p.is_file() {
                    return Err(Error::InvalidArgument(format!(
                        "environment variable {name}='{v}': no such executable file"
                    )));
                }
                Some(p)
            }
        };
        let device_runtime_dir = match env::raw(&[offload_core::jit::ENV_DEVICE_RUNTIME_DIR])? {
            None => PathBuf::from(crate::LLVM_LIBDIR),
            Some((name, v)) => {
                let p = PathBuf::from(&v);
                if !p.is_dir() {
                    return Err(Error::InvalidArgument(format!(
                        "environment variable {name}='{v}': no such directory (it names where \
                         LLVM's OpenMP device runtimes libomptarget-*.bc are)"
                    )));
                }
                p
            }
        };
        Ok(JitConfig {
            options: JitOptions {
                opt_level,
                skip_opt: boolean(&SKIP_OPT)?.unwrap_or(false),
                replacement_module: input_file(&REPLACEMENT_MODULE)?,
                replacement_object: input_file(&REPLACEMENT_OBJECT)?,
                pre_opt_ir: output_path(&PRE_OPT_IR_MODULE, false)?,
                post_opt_ir: output_path(&POST_OPT_IR_MODULE, false)?,
                device_runtime_dir: Some(device_runtime_dir),
            },
            save_image_dir: output_path(&SAVE_IMAGE, true)?,
            cache_capacity: cache_mb << 20,
            isolation,
            worker,
            timeout: timeout()?,
            limits: crate::limits::WorkerLimits::from_env()?,
            disk: DiskConfig::from_env()?,
            remote: crate::remote::RemoteConfig::from_env()?,
        })
    }
}
