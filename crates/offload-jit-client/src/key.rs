//! The JIT cache's keys, all in one place: what makes two requests the same compile.
//!
//! - The memory key ([`request_key`]): BLAKE3 over length-prefixed fields ([`KeyBuilder`]): the
//!   image bytes, the target (triple, CPU, features), the options that change the output, the
//!   LLVM and engine versions, any replacement module or object, the post-processing step, and
//!   the OpenMP device runtime file that would be linked for the target (by its stamp).
//!   Never an address: a freed image whose address is reused can never hit another program's
//!   entry.
//! - The toolchain ([`toolchain`]): the engine's contents (the worker executable, or the
//!   in-process engine library) and the LLVM library's file, so that a rebuilt engine or
//!   another LLVM never reads entries the old one wrote, without loading LLVM to ask it.
//! - The disk key ([`disk_key`]): the memory key, the toolchain, the post-processing tool's file
//!   (the same `ld.lld` the worker runs, `offload_core::jit::locate_lld`, or the `ptxas` the
//!   plugin found) and the entry schema.

use crate::{ENGINE_VERSION, JitConfig, LLVM_LIBDIR, LLVM_VERSION};
use offload_core::jit::{CacheKey, CompileRequest, PostProcess};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Builds a [`CacheKey`]: each field is its name and its bytes, both length-prefixed, so no
/// two different field lists can produce the same byte stream.
#[derive(Debug, Default)]
pub struct KeyBuilder(blake3::Hasher);

impl KeyBuilder {
    /// Starts a key.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a field.
    pub fn field(&mut self, name: &str, bytes: &[u8]) -> &mut Self {
        for part in [name.as_bytes(), bytes] {
            self.0.update(&(part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
        self
    }

    /// The key.
    pub fn finish(&self) -> CacheKey {
        CacheKey(*self.0.finalize().as_bytes())
    }
}

/// The memory key of a request under `config`.
pub fn request_key(config: &JitConfig, request: &CompileRequest<'_>) -> CacheKey {
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
        .field("post-process", request.post.id().as_bytes())
        // The OpenMP device runtime the worker links into OpenMP device modules for this
        // target (by its file's identity, as the tools are): another runtime, another result.
        .field(
            "device-runtime",
            o.device_runtime_dir
                .as_deref()
                .and_then(|d| {
                    offload_core::jit::openmp_device_runtime(
                        d,
                        &request.target.triple,
                        &request.target.cpu,
                    )
                })
                .map(|p| file_stamp(&p))
                .unwrap_or_default()
                .as_bytes(),
        );
    k.finish()
}

/// The toolchain identity: `engine` (the digest of the worker or engine library named `name`)
/// and the stamp of the LLVM library in [`LLVM_LIBDIR`].
pub fn toolchain(engine: &[u8; 32], name: &str) -> [u8; 32] {
    let llvm = find_llvm_library(Path::new(LLVM_LIBDIR))
        .map(|p| file_stamp(&p))
        .unwrap_or_else(|| format!("no libLLVM in '{LLVM_LIBDIR}'"));
    let mut k = KeyBuilder::new();
    k.field("engine", engine)
        .field("isolation", name.as_bytes())
        .field("llvm-library", llvm.as_bytes());
    k.finish().0
}

/// The disk key of a request whose memory key is `key`, compiled by `toolchain` and
/// post-processed by `post`.
pub fn disk_key(key: &CacheKey, toolchain: &[u8; 32], post: &PostProcess) -> CacheKey {
    let tool = match post {
        PostProcess::Unchanged => String::new(),
        PostProcess::LinkHostSharedObject | PostProcess::LinkAmdgpuCodeObject { .. } => {
            offload_core::jit::locate_lld()
                .map(|p| file_stamp(&p))
                .unwrap_or_default()
        }
        PostProcess::Ptxas { path, .. } => file_stamp(Path::new(path)),
    };
    let mut k = KeyBuilder::new();
    k.field("schema", &crate::disk::SCHEMA.to_le_bytes())
        .field("key", &key.0)
        .field("toolchain", toolchain)
        .field("tool", tool.as_bytes());
    k.finish()
}

/// Identity of a file by its metadata: `path size mtime` (for files too large to hash, whose
/// package installs them with the package's times, so nodes with one package agree).
pub fn file_stamp(path: &Path) -> String {
    let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    match std::fs::metadata(&canonical) {
        Ok(m) => format!(
            "{} {} {}.{}",
            canonical.display(),
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(e) => format!("{} ({e})", canonical.display()),
    }
}

/// The LLVM shared library in `libdir` (`libLLVM.so.19.1`, `libLLVM-19.so`).
pub fn find_llvm_library(libdir: &Path) -> Option<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(libdir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM") && n.contains(".so"))
        })
        .collect();
    names.sort();
    names.into_iter().next()
}

/// BLAKE3 of a file's contents, remembered in `memo_dir` under the file's metadata (device,
/// inode, size, modification and change times: a changed file gets a new memo), so a process
/// hashes a given executable once per machine.
pub fn file_digest(path: &Path, memo_dir: Option<&Path>) -> std::io::Result<[u8; 32]> {
    let m = std::fs::metadata(path)?;
    let meta = format!(
        "{} {} {} {} {}.{} {}.{}",
        path.display(),
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    );
    let memo = memo_dir.map(|d| {
        d.join(format!(
            "toolchain-{}.id",
            &blake3::hash(meta.as_bytes()).to_hex()[..32]
        ))
    });
    if let Some(memo) = &memo
        && let Ok(bytes) = std::fs::read(memo)
        && bytes.len() == 64
        && bytes[32..] == *blake3::hash(&bytes[..32]).as_bytes()
    {
        return Ok(bytes[..32].try_into().expect("32 bytes"));
    }
    let mut hasher = blake3::Hasher::new();
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest = *hasher.finalize().as_bytes();
    if let Some(memo) = &memo {
        let mut bytes = digest.to_vec();
        bytes.extend_from_slice(blake3::hash(&digest).as_bytes());
        // Best effort: a memo that cannot be written is computed again next time.
        let _ = crate::disk::write_atomically(memo, &bytes);
    }
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_length_prefixed() {
        let a = KeyBuilder::new()
            .field("x", b"ab")
            .field("y", b"c")
            .finish();
        let b = KeyBuilder::new()
            .field("x", b"a")
            .field("y", b"bc")
            .finish();
        assert_ne!(a, b);
        assert_eq!(
            a,
            KeyBuilder::new()
                .field("x", b"ab")
                .field("y", b"c")
                .finish()
        );
    }
}
