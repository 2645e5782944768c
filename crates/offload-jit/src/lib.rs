//! # offload-jit
//!
//! The shared JIT engine: LLVM bitcode (or textual IR) becomes a native image for a device's
//! exact compute-unit kind, cached by content so that many devices of one kind compile once.
//!
//! One [`JitEngine`] per plugin, tied to one target triple and shared by the plugin's devices.
//! A request names the image, the device's compute-unit kind and target features, and the
//! device's [`PostProcess`] step; the engine returns an `Arc` of the compiled image from its
//! [`cache`], compiling it at most once per key however many threads ask at the same time.
//!
//! Where it departs from upstream's engine, and why:
//! - the cache key is a BLAKE3 hash of the image *contents* and every input that changes the
//!   output, never the image's address (seed `001_...`: an address-keyed cache handed out the
//!   wrong program when a freed image's address was reused);
//! - compiles of different keys run in parallel; only compiles of the same key are shared;
//! - no LLVM context or module outlives its compile;
//! - inputs that would make LLVM abort (IR for another target, an unknown CPU) are refused
//!   before code generation, and LLVM's error diagnostics are captured instead of exiting.

pub mod cache;
pub mod compile;
pub mod config;
pub mod postprocess;
mod target_info;

pub use cache::{
    CacheKey, CompileOutput, CompiledImage, JitStats, KernelSignature, ParamType, Served,
};
pub use config::JitConfig;
pub use postprocess::{LinkSharedObject, PostProcess, Unchanged};

use cache::{Cache, KeyBuilder};
use compile::CodegenTarget;
use offload_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Version of this engine; part of every cache key, so a new engine never reuses old output.
pub const ENGINE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The device a compile is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitTarget {
    /// Exact CPU (`sm_90`, `gfx90a`, `znver3`, `x86-64`).
    pub compute_unit_kind: String,
    /// LLVM target features (may be empty).
    pub features: String,
}

/// An event of the compile path, for observers (tests and tracing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompileEvent {
    /// A compile of this key started (on the calling thread).
    Started(CacheKey),
    /// The compile of this key ended.
    Finished(CacheKey),
}

type Observer = Arc<dyn Fn(CompileEvent) + Send + Sync>;

/// LLVM's version, `major.minor.patch`.
pub fn llvm_version() -> String {
    let (mut major, mut minor, mut patch) = (0u32, 0u32, 0u32);
    // SAFETY: writes three integers.
    unsafe { inkwell::llvm_sys::core::LLVMGetVersion(&mut major, &mut minor, &mut patch) };
    format!("{major}.{minor}.{patch}")
}

/// The host CPU as LLVM names it, and its features.
pub fn host_cpu() -> (String, String) {
    compile::initialize_targets();
    let name = inkwell::targets::TargetMachine::get_host_cpu_name();
    let features = inkwell::targets::TargetMachine::get_host_cpu_features();
    (
        name.to_string_lossy().into_owned(),
        features.to_string_lossy().into_owned(),
    )
}

/// See the crate docs.
pub struct JitEngine {
    triple: String,
    config: JitConfig,
    cache: Cache,
    triples: Mutex<HashMap<[u8; 32], std::result::Result<String, Error>>>,
    observer: Mutex<Option<Observer>>,
}

impl std::fmt::Debug for JitEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JitEngine")
            .field("triple", &self.triple)
            .field("config", &self.config)
            .finish()
    }
}

/// The result of [`JitEngine::compile`].
#[derive(Debug, Clone)]
pub struct JitOutput {
    /// The image to load; keep the `Arc` as long as the program is loaded.
    pub image: Arc<CompiledImage>,
    /// How the request was served.
    pub served: Served,
}

impl JitEngine {
    /// An engine for `triple`, configured from the environment (`OFFLOAD_JIT_*`).
    pub fn new(triple: &str) -> Result<Self> {
        Self::with_config(triple, JitConfig::from_env()?)
    }

    /// An engine with an explicit configuration.
    pub fn with_config(triple: &str, config: JitConfig) -> Result<Self> {
        compile::initialize_targets();
        let normalized = compile::normalize_triple(triple);
        inkwell::targets::Target::from_triple(&inkwell::targets::TargetTriple::create(&normalized))
            .map_err(|e| {
                Error::Unsupported(format!(
                    "no LLVM target for '{triple}': {}",
                    e.to_string_lossy()
                ))
            })?;
        Ok(JitEngine {
            triple: normalized,
            cache: Cache::new(config.cache_capacity),
            config,
            triples: Mutex::default(),
            observer: Mutex::default(),
        })
    }

    /// The engine's (normalised) target triple.
    pub fn triple(&self) -> &str {
        &self.triple
    }

    /// The configuration in force.
    pub fn config(&self) -> &JitConfig {
        &self.config
    }

    /// Counters of the cache and compiles.
    pub fn stats(&self) -> JitStats {
        self.cache.stats()
    }

    /// Re-applies the cache capacity; call after a program that held an image is unloaded.
    pub fn release_unused(&self) {
        self.cache.trim();
    }

    /// Installs an observer of compile events (called on the compiling thread, outside locks).
    pub fn set_observer(&self, observer: impl Fn(CompileEvent) + Send + Sync + 'static) {
        *self.observer.lock().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(observer));
    }

    /// Whether the bytes are something this engine's kind of input (bitcode or IR).
    pub fn is_jit_input(bytes: &[u8]) -> bool {
        compile::is_bitcode(bytes) || compile::is_textual_ir(bytes)
    }

    /// Checks that `image` is bitcode/IR whose triple this engine compiles, reading the triple
    /// lazily and remembering the answer per image content.
    pub fn check_image(&self, image: &[u8]) -> Result<()> {
        let digest = *blake3::hash(image).as_bytes();
        let known = self
            .triples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&digest)
            .cloned();
        let triple = match known {
            Some(t) => t,
            None => {
                let t = compile::module_triple(image);
                let mut memo = self.triples.lock().unwrap_or_else(|p| p.into_inner());
                if memo.len() >= 4096 {
                    memo.clear();
                }
                memo.insert(digest, t.clone());
                t
            }
        }?;
        if compile::triples_match(&triple, &self.triple) {
            Ok(())
        } else {
            Err(Error::InvalidImage(format!(
                "bitcode is for '{triple}', this engine compiles for '{}'",
                self.triple
            )))
        }
    }

    /// The cache key of a request.
    pub fn key(&self, image: &[u8], target: &JitTarget, post: &dyn PostProcess) -> CacheKey {
        let c = &self.config;
        let mut k = KeyBuilder::new();
        k.field("image", image)
            .field("triple", self.triple.as_bytes())
            .field("cpu", target.compute_unit_kind.as_bytes())
            .field("features", target.features.as_bytes())
            .field("opt", &[c.opt_level, u8::from(c.skip_opt)])
            .field("llvm", llvm_version().as_bytes())
            .field("engine", ENGINE_VERSION.as_bytes())
            .field(
                "replacement-module",
                c.replacement_module.as_ref().map_or(&[][..], |r| &r.bytes),
            )
            .field(
                "replacement-object",
                c.replacement_object.as_ref().map_or(&[][..], |r| &r.bytes),
            )
            .field("post-process", post.id().as_bytes());
        k.finish()
    }

    /// Compiles `image` for `target` (or returns the cached result), then post-processes it.
    pub fn compile(
        &self,
        image: &[u8],
        target: &JitTarget,
        post: &dyn PostProcess,
    ) -> Result<JitOutput> {
        let key = self.key(image, target, post);
        let observer = self
            .observer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (image, served) = self.cache.get_or_compile(key, || {
            if let Some(o) = &observer {
                o(CompileEvent::Started(key));
            }
            let t = CodegenTarget {
                triple: &self.triple,
                cpu: &target.compute_unit_kind,
                features: &target.features,
            };
            let result = compile::compile(image, &t, &self.config).and_then(|generated| {
                Ok(CompileOutput {
                    bytes: post.run(generated.bytes)?,
                    signatures: generated.signatures,
                })
            });
            if let Some(o) = &observer {
                o(CompileEvent::Finished(key));
            }
            let output = result?;
            if let Some(dir) = &self.config.save_image_dir {
                let ext = if compile::emits_assembly(&self.triple) {
                    "ptx"
                } else {
                    "img"
                };
                config::OutputPath {
                    variable: dir.variable.clone(),
                    path: dir.path.join(format!("{}.{ext}", key.hex())),
                }
                .write(&output.bytes)?;
            }
            Ok(output)
        })?;
        Ok(JitOutput { image, served })
    }
}
