//! Which image a device loads: the image itself, or the best entry of a container.
//!
//! For a container (offload binary, offload bundle, or either in ELF sections) the order is:
//! a native image labelled with the device's exact compute-unit kind, then one the device calls
//! compatible, then bitcode or IR for the JIT. Every entry passed over is named in the error,
//! with the reason, when nothing fits.

use crate::{DeviceBackend, Fit};
use offload_core::image::ImageKind;
use offload_core::image::container;
use offload_core::image::triple::triples_match;
use offload_core::{Error, ImageClaim, Result, classify};
use std::sync::Arc;

/// The plugin-level check of a native image ([`crate::Backend::check_native`]).
pub type NativeCheck = Arc<dyn Fn(&[u8], &ImageKind) -> Result<()> + Send + Sync>;

/// What a plugin serves (its name, triple and image claims), for the checks.
#[derive(Clone)]
pub struct PluginClaims {
    /// The plugin's name.
    pub plugin: &'static str,
    /// The plugin's (JIT) triple.
    pub triple: &'static str,
    /// Its claims.
    pub claims: Vec<ImageClaim>,
    /// The plugin's own check of a native image's structure, which every native image passes
    /// before a device's check sees it, whichever door it came in by.
    pub native: NativeCheck,
}

impl std::fmt::Debug for PluginClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginClaims")
            .field("plugin", &self.plugin)
            .field("triple", &self.triple)
            .field("claims", &self.claims)
            .finish_non_exhaustive()
    }
}

impl PluginClaims {
    /// Why the plugin does not load a native image of this kind, if it does not.
    pub fn refuses_native(&self, kind: &ImageKind) -> Option<String> {
        if let ImageKind::Elf(info) = kind
            && let Err(e) = info.require_layout(self.plugin)
        {
            return Some(e.message().to_string());
        }
        let claimed = match kind {
            ImageKind::Elf(info) => self
                .claims
                .iter()
                .any(|c| matches!(c, ImageClaim::Elf { machine } if *machine == info.machine)),
            ImageKind::Ptx => self.claims.contains(&ImageClaim::Ptx),
            ImageKind::CudaFatbin => self.claims.contains(&ImageClaim::CudaFatbin),
            ImageKind::SpirV => self.claims.contains(&ImageClaim::SpirV),
            _ => false,
        };
        if claimed {
            return None;
        }
        let serves: Vec<String> = self.claims.iter().map(ImageClaim::describe).collect();
        let what = match kind {
            ImageKind::Elf(info) => format!(
                "ELF machine {} (e_machine, offset 18)",
                offload_core::image::machine::describe(info.machine)
            ),
            other => format!("a {}", other.describe()),
        };
        Some(format!(
            "the image is {what}; the {} plugin serves {}",
            self.plugin,
            serves.join(", ")
        ))
    }

    /// Whether the plugin compiles bitcode for this module triple (empty: the module has none
    /// and is compiled for the device's).
    pub fn refuses_bitcode(&self, module_triple: &str) -> Option<String> {
        let jit = self.claims.iter().find_map(|c| match c {
            ImageClaim::Bitcode { triple } => Some(triple.as_str()),
            _ => None,
        });
        match jit {
            None => Some(format!(
                "image is LLVM bitcode/IR; the {} plugin has no JIT engine",
                self.plugin
            )),
            Some(_) if module_triple.is_empty() => None,
            Some(t) if triples_match(module_triple, t) => None,
            Some(t) => Some(format!(
                "bitcode is for '{module_triple}', the {} plugin compiles for '{t}'",
                self.plugin
            )),
        }
    }

    fn entry_for_me(&self, triple: &str) -> bool {
        triple.is_empty() || triples_match(triple, self.triple)
    }
}

/// The image a device should load.
#[derive(Debug, Clone)]
pub struct Choice<'a> {
    /// Its bytes.
    pub bytes: &'a [u8],
    /// Its kind.
    pub kind: ImageKind,
    /// The container entry it came from, if any (`x86_64-unknown-linux-gnu/znver3`).
    pub entry: Option<String>,
}

/// Plugin-level check: some device of the plugin could load this (without asking a device).
pub fn check_plugin(served: &PluginClaims, bytes: &[u8]) -> Result<()> {
    let native_ok = |b: &[u8], k: &ImageKind| (served.native)(b, k);
    if let Some(c) = container::parse(bytes)? {
        let mut reasons = Vec::new();
        for e in &c.entries {
            if !served.entry_for_me(&e.triple) {
                reasons.push(format!("{}: for another target", e.label()));
                continue;
            }
            match single(served, &native_ok, e.bytes) {
                Ok(_) => return Ok(()),
                Err(err) => reasons.push(format!("{}: {}", e.label(), err.message())),
            }
        }
        return Err(Error::InvalidImage(format!(
            "{}: nothing in it for the {} plugin{}{}",
            c.describe(),
            served.plugin,
            if reasons.is_empty() { "" } else { ": " },
            reasons.join("; ")
        )));
    }
    single(served, &native_ok, bytes).map(drop)
}

/// Checks one image (not a container) for this plugin; its kind, classified once here.
fn single(
    served: &PluginClaims,
    native_ok: &impl Fn(&[u8], &ImageKind) -> Result<()>,
    bytes: &[u8],
) -> Result<ImageKind> {
    let kind = classify(bytes)?;
    if kind.is_jit_input() {
        let triple = offload_core::image::bitcode::module_triple(bytes)?;
        return match served.refuses_bitcode(&triple) {
            Some(why) => Err(Error::InvalidImage(why)),
            None => Ok(kind),
        };
    }
    if matches!(kind, ImageKind::OffloadBinary | ImageKind::OffloadBundle) {
        return Err(Error::InvalidImage(format!(
            "a {} inside a container entry is not supported",
            kind.describe()
        )));
    }
    if let Some(why) = served.refuses_native(&kind) {
        return Err(Error::InvalidImage(why));
    }
    native_ok(bytes, &kind)?;
    Ok(kind)
}

/// Picks what `device` (named `name`, of compute-unit kind `cu`) loads for `bytes`.
pub fn for_device<'a, D: DeviceBackend>(
    served: &PluginClaims,
    device: &D,
    name: &str,
    cu: &str,
    bytes: &'a [u8],
) -> Result<Choice<'a>> {
    let Some(c) = container::parse(bytes)? else {
        let kind = single(
            served,
            &|b: &[u8], k: &ImageKind| {
                (served.native)(b, k)?;
                device.check_native(b, k)
            },
            bytes,
        )?;
        return Ok(Choice {
            bytes,
            kind,
            entry: None,
        });
    };
    let mut reasons = Vec::new();
    let mut native: Vec<(u8, Choice<'a>)> = Vec::new();
    let mut jit: Vec<(u8, Choice<'a>)> = Vec::new();
    for e in &c.entries {
        let label = e.label();
        if !served.entry_for_me(&e.triple) {
            reasons.push(format!("{label}: for another target"));
            continue;
        }
        let kind = match classify(e.bytes) {
            Ok(k) => k,
            Err(err) => {
                reasons.push(format!("{label}: {}", err.message()));
                continue;
            }
        };
        let choice = Choice {
            bytes: e.bytes,
            kind,
            entry: Some(format!("{label} ({})", e.origin)),
        };
        if kind.is_jit_input() {
            let triple = match offload_core::image::bitcode::module_triple(e.bytes) {
                Ok(t) => t,
                Err(err) => {
                    reasons.push(format!("{label}: {}", err.message()));
                    continue;
                }
            };
            if let Some(why) = served.refuses_bitcode(&triple) {
                reasons.push(format!("{label}: {why}"));
                continue;
            }
            // Bitcode labelled for this exact device first, then any.
            jit.push((u8::from(e.arch != cu), choice));
            continue;
        }
        if let Some(why) = served.refuses_native(&kind) {
            reasons.push(format!("{label}: {why}"));
            continue;
        }
        let rank = if e.arch == cu {
            0
        } else {
            match device.fits(&e.arch) {
                Fit::Exact => 0,
                Fit::Compatible => 1,
                Fit::No(why) => {
                    reasons.push(format!("{label}: {why}"));
                    continue;
                }
            }
        };
        if let Err(err) =
            (served.native)(e.bytes, &kind).and_then(|()| device.check_native(e.bytes, &kind))
        {
            reasons.push(format!("{label}: {}", err.message()));
            continue;
        }
        native.push((rank, choice));
    }
    native.sort_by_key(|(rank, _)| *rank);
    jit.sort_by_key(|(rank, _)| *rank);
    if let Some((_, choice)) = native.into_iter().next() {
        return Ok(choice);
    }
    if let Some((_, choice)) = jit.into_iter().next() {
        return Ok(choice);
    }
    Err(Error::InvalidImage(format!(
        "{}: none fits {name} (compute unit {cu}){}{}",
        c.describe(),
        if reasons.is_empty() { "" } else { ": " },
        reasons.join("; ")
    )))
}
