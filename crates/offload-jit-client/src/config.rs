//! The JIT's environment variables, read in one place.
//!
//! The upstream ones have an `OFFLOAD_JIT_*` name and upstream's `LIBOMPTARGET_JIT_*` name as
//! an alias (the first that is set wins). Unlike upstream, a bad value is an error naming the
//! variable, and paths may contain spaces. The isolation settings (`OFFLOAD_JIT_ISOLATION`,
//! `OFFLOAD_JIT_WORKER`, `OFFLOAD_JIT_TIMEOUT`, `OFFLOAD_JIT_MEMORY_LIMIT`) are this project's
//! own.

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
/// The worker's address-space limit (default: the machine's memory, at least 4 GiB; `none`:
/// no limit).
pub const MEMORY_LIMIT: [&str; 1] = ["OFFLOAD_JIT_MEMORY_LIMIT"];

/// Default [`TIMEOUT`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Smallest [`MEMORY_LIMIT`]: below this the worker cannot even map LLVM.
pub const MIN_MEMORY_LIMIT: u64 = 256 << 20;

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
    /// The worker's address-space limit in bytes (`None`: no limit).
    pub memory_limit: Option<Limit<u64>>,
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
            memory_limit: Some(default_memory_limit()),
        }
    }
}

/// The machine's memory, at least 4 GiB: a compile that needs more is a runaway.
fn default_memory_limit() -> Limit<u64> {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical = if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        0
    };
    Limit {
        value: physical.max(4 << 30),
        source: format!("{} default", MEMORY_LIMIT[0]),
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

fn memory_limit() -> Result<Option<Limit<u64>>> {
    let Some((name, value)) = env::raw(&MEMORY_LIMIT)? else {
        return Ok(Some(default_memory_limit()));
    };
    if matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "none" | "unlimited" | "0"
    ) {
        return Ok(None);
    }
    let v =
        env::size_in_range(&MEMORY_LIMIT, MIN_MEMORY_LIMIT, 1 << 50)?.expect("the variable is set");
    Ok(Some(Limit {
        value: v,
        source: format!("{name}={}", value.trim()),
    }))
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
        Ok(JitConfig {
            options: JitOptions {
                opt_level,
                skip_opt: boolean(&SKIP_OPT)?.unwrap_or(false),
                replacement_module: input_file(&REPLACEMENT_MODULE)?,
                replacement_object: input_file(&REPLACEMENT_OBJECT)?,
                pre_opt_ir: output_path(&PRE_OPT_IR_MODULE, false)?,
                post_opt_ir: output_path(&POST_OPT_IR_MODULE, false)?,
            },
            save_image_dir: output_path(&SAVE_IMAGE, true)?,
            cache_capacity: cache_mb << 20,
            isolation,
            worker,
            timeout: timeout()?,
            memory_limit: memory_limit()?,
        })
    }
}
