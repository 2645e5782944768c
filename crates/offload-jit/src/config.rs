//! The JIT's environment variables, read in one place.
//!
//! Each has an `OFFLOAD_JIT_*` name and upstream's `LIBOMPTARGET_JIT_*` name as an alias (the
//! first that is set wins). Unlike upstream, a bad value is an error naming the variable, and
//! paths may contain spaces.

use offload_core::env;
use offload_core::{Error, Result};
use std::path::PathBuf;

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
/// In-memory cache capacity in MiB (default 256; 0 keeps only images in use).
pub const CACHE_MB: [&str; 1] = ["OFFLOAD_JIT_CACHE_MB"];

/// A file named by a variable, read when the configuration is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFile {
    /// The variable that named it.
    pub variable: String,
    /// The path.
    pub path: PathBuf,
    /// Its contents.
    pub bytes: Vec<u8>,
}

/// A path a variable names for output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputPath {
    /// The variable that named it.
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

/// Everything the environment can change about JIT compilation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitConfig {
    /// `default<On>` pipeline level and the code generator's level.
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
    /// Directory for compiled images.
    pub save_image_dir: Option<OutputPath>,
    /// In-memory cache capacity in bytes.
    pub cache_capacity: u64,
}

impl Default for JitConfig {
    fn default() -> Self {
        JitConfig {
            opt_level: 3,
            skip_opt: false,
            replacement_module: None,
            replacement_object: None,
            pre_opt_ir: None,
            post_opt_ir: None,
            save_image_dir: None,
            cache_capacity: 256 << 20,
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
    let path = PathBuf::from(&value);
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
        Ok(JitConfig {
            opt_level,
            skip_opt: boolean(&SKIP_OPT)?.unwrap_or(false),
            replacement_module: input_file(&REPLACEMENT_MODULE)?,
            replacement_object: input_file(&REPLACEMENT_OBJECT)?,
            pre_opt_ir: output_path(&PRE_OPT_IR_MODULE, false)?,
            post_opt_ir: output_path(&POST_OPT_IR_MODULE, false)?,
            save_image_dir: output_path(&SAVE_IMAGE, true)?,
            cache_capacity: cache_mb << 20,
        })
    }
}
