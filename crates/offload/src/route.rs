//! Routing: which plugin and device run an image (ELF machine, bitcode triple, containers).

use crate::{Device, PluginSlot, Runtime};
use offload_core::image::{ElfEndian, machine};
use offload_core::{Error, ImageKind, Result, classify};

impl Runtime {
    /// Picks the plugin and device for an image. Native ELF goes by ELF machine, then the
    /// plugin's and each device's own compatibility check; LLVM bitcode and IR go to the first
    /// plugin that compiles the module's triple; PTX, CUDA fatbins and containers (offload
    /// binaries, offload bundles, and ELF files holding them) to the first plugin with a device
    /// that can run them (for a container: some entry of it). The first device that accepts
    /// the image wins.
    pub fn route(&self, image: &[u8]) -> Result<Device> {
        let _span =
            tracing::info_span!(target: "offload::image", "route", bytes = image.len()).entered();
        let routed = self.route_inner(image);
        match &routed {
            Ok(d) => {
                tracing::info!(target: "offload::image", "{}-byte image routed to {d}", image.len())
            }
            Err(e) => {
                tracing::info!(target: "offload::image", "{}-byte image not routed: {e}", image.len())
            }
        }
        routed
    }

    fn route_inner(&self, image: &[u8]) -> Result<Device> {
        if let Some(c) = offload_core::image::container::parse(image)? {
            tracing::info!(
                target: "offload::image",
                "a {} holding {} image(s): {}",
                c.format,
                c.entries.len(),
                c.entries.iter().map(|e| format!("{} ({} bytes)", e.label(), e.bytes.len())).collect::<Vec<_>>().join(", ")
            );
            let what = format!(
                "runs this {} ({} image{})",
                c.format,
                c.entries.len(),
                if c.entries.len() == 1 { "" } else { "s" }
            );
            return self.route_by_asking(image, &what);
        }
        let kind = classify(image)?;
        tracing::info!(target: "offload::image", "classified as {}", kind.describe());
        let info = match kind {
            ImageKind::Elf(info) => info,
            ImageKind::Bitcode { .. } | ImageKind::LlvmIr => return self.route_jit_input(image),
            other => {
                return self.route_by_asking(image, &format!("runs this {}", other.describe()));
            }
        };
        let serving: Vec<&PluginSlot> = self
            .slots
            .iter()
            .filter(|s| s.loaded().is_some_and(|p| p.elf_machine() == info.machine))
            .collect();
        if serving.is_empty() {
            let known: Vec<String> = self
                .slots
                .iter()
                .filter_map(|s| {
                    s.loaded().map(|p| {
                        format!("{} serves {}", s.name, machine::describe(p.elf_machine()))
                    })
                })
                .collect();
            let endian_hint = if info.endian != ElfEndian::host() {
                format!(
                    "; note: the image is {} (EI_DATA, offset 5); read the other way round its \
                     machine would be {}",
                    info.endian,
                    machine::describe(info.machine.swap_bytes())
                )
            } else {
                String::new()
            };
            return Err(Error::Unsupported(format!(
                "no loaded plugin serves ELF machine {} ({}){endian_hint}",
                machine::describe(info.machine),
                if known.is_empty() {
                    "no plugin loaded".to_string()
                } else {
                    known.join("; ")
                }
            )));
        }
        let mut first_error = None;
        for slot in serving {
            match slot.pick_device(image) {
                Ok(device) => return Ok(device),
                Err(e @ Error::NoDevice(_)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(e.context(format!("plugin '{}'", slot.name)));
                }
            }
        }
        Err(first_error.expect("at least one plugin was tried"))
    }

    /// Asks every loaded plugin in turn; the error (`no loaded plugin {what} (...)`) lists
    /// each one's reason.
    fn route_by_asking(&self, image: &[u8], what: &str) -> Result<Device> {
        let mut reasons = Vec::new();
        let mut no_device = None;
        for slot in self.slots.iter().filter(|s| s.loaded().is_some()) {
            match slot.pick_device(image) {
                Ok(device) => return Ok(device),
                Err(e @ Error::NoDevice(_)) => {
                    tracing::info!(target: "offload::plugin", "plugin '{}' has no device for it: {e}", slot.name);
                    no_device.get_or_insert(e);
                }
                Err(e) => {
                    tracing::info!(target: "offload::plugin", "plugin '{}' refuses it: {}", slot.name, e.message());
                    reasons.push(format!("{}: {}", slot.name, e.message()))
                }
            }
        }
        // A plugin that can run the image but has no device is the answer users need, with
        // why the others cannot run it.
        if let Some(Error::NoDevice(why)) = no_device {
            return Err(Error::NoDevice(if reasons.is_empty() {
                why
            } else {
                format!(
                    "{why}; and no other loaded plugin {what} ({})",
                    reasons.join("; ")
                )
            }));
        }
        Err(Error::Unsupported(format!(
            "no loaded plugin {what} ({})",
            if reasons.is_empty() {
                "no plugin loaded".to_string()
            } else {
                reasons.join("; ")
            }
        )))
    }

    fn route_jit_input(&self, image: &[u8]) -> Result<Device> {
        // Read without LLVM: routing never maps libLLVM, and a malformed module fails here.
        let triple = offload_core::image::bitcode::module_triple(image)?;
        if triple.is_empty() && offload_core::image::is_empty_llvm_module(image) {
            return Err(Error::Unsupported(
                "the LLVM module is empty (only comments, no top-level entities) and has no \
                 target triple, so it is not clear which device it is for; choose the device \
                 (--device PLUGIN:INDEX), whose triple it is then compiled for"
                    .into(),
            ));
        }
        if triple.is_empty() {
            return Err(Error::Unsupported(
                "the LLVM module has no target triple, so it is not clear which device it is \
                 for; add a `target triple` line (clang writes one), or choose the device \
                 (--device PLUGIN:INDEX), whose triple it is then compiled for"
                    .into(),
            ));
        }
        self.route_by_asking(image, "compiles this LLVM bitcode/IR")
    }
}

impl PluginSlot {
    /// The first device of this plugin that accepts `image`, after the plugin-level check. A
    /// plugin that can run the image but has no device says so (`NoDevice`, with its reason).
    fn pick_device(&self, image: &[u8]) -> Result<Device> {
        self.check_image(image)?;
        let count = match self.device_count() {
            Ok(n) => n,
            Err(Error::NoDevice(why)) => {
                return Err(Error::NoDevice(format!(
                    "plugin '{}' can run this image but has no device: {why}",
                    self.name
                )));
            }
            Err(e) => return Err(e),
        };
        if count == 0 {
            return Err(Error::NoDevice(format!(
                "plugin '{}' can run this image but reports 0 devices",
                self.name
            )));
        }
        let mut last = None;
        for i in 0..count {
            let device = self.device(i)?;
            match device.inner.check_image(image) {
                Ok(()) => return Ok(device),
                Err(e) => last = Some(e.context(format!("device {}:{i}", self.name))),
            }
        }
        Err(last.expect("count > 0"))
    }
}
