//! AMD GPU targets: the gfx processor and its target-id features (`gfx90a:sramecc+:xnack-`),
//! read from a code object's ELF header or from the HSA agent's ISA name, and which code
//! object runs on which device.

use offload_core::image::ElfInfo;
use offload_core::{Error, Result};
use std::fmt;

/// `EI_OSABI` of HSA code objects.
pub const ELFOSABI_AMDGPU_HSA: u8 = 64;

/// `e_flags & 0xff`: the processor, as LLVM numbers them (`EF_AMDGPU_MACH_*`). Checked against
/// clang-19's output for every entry by the tests.
const MACHINES: [(u32, &str); 45] = [
    (0x020, "gfx600"),
    (0x021, "gfx601"),
    (0x022, "gfx700"),
    (0x023, "gfx701"),
    (0x024, "gfx702"),
    (0x025, "gfx703"),
    (0x026, "gfx704"),
    (0x028, "gfx801"),
    (0x029, "gfx802"),
    (0x02a, "gfx803"),
    (0x02b, "gfx810"),
    (0x02c, "gfx900"),
    (0x02d, "gfx902"),
    (0x02e, "gfx904"),
    (0x02f, "gfx906"),
    (0x030, "gfx908"),
    (0x031, "gfx909"),
    (0x032, "gfx90c"),
    (0x033, "gfx1010"),
    (0x034, "gfx1011"),
    (0x035, "gfx1012"),
    (0x036, "gfx1030"),
    (0x037, "gfx1031"),
    (0x038, "gfx1032"),
    (0x039, "gfx1033"),
    (0x03a, "gfx602"),
    (0x03b, "gfx705"),
    (0x03c, "gfx805"),
    (0x03d, "gfx1035"),
    (0x03e, "gfx1034"),
    (0x03f, "gfx90a"),
    (0x040, "gfx940"),
    (0x041, "gfx1100"),
    (0x042, "gfx1013"),
    (0x043, "gfx1150"),
    (0x044, "gfx1103"),
    (0x045, "gfx1036"),
    (0x046, "gfx1101"),
    (0x047, "gfx1102"),
    (0x048, "gfx1200"),
    (0x04a, "gfx1151"),
    (0x04b, "gfx941"),
    (0x04c, "gfx942"),
    (0x04e, "gfx1201"),
    (0x055, "gfx1152"),
];

/// The processor named by `e_flags`, if this plugin knows it.
pub fn gfx_of_mach(mach: u32) -> Option<&'static str> {
    MACHINES.iter().find(|(m, _)| *m == mach).map(|(_, n)| *n)
}

/// Every processor this plugin knows (for the tests).
pub fn known_processors() -> impl Iterator<Item = &'static str> {
    MACHINES.iter().map(|(_, n)| *n)
}

/// A target-id feature's setting (`xnack`, `sramecc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// The processor does not have the feature.
    Unsupported,
    /// Code that works either way (code objects only).
    Any,
    /// On (`xnack+`).
    On,
    /// Off (`xnack-`).
    Off,
}

impl Setting {
    fn suffix(self) -> &'static str {
        match self {
            Setting::On => "+",
            Setting::Off => "-",
            Setting::Any | Setting::Unsupported => "",
        }
    }
}

/// A processor with its feature settings: what a code object was built for, or what a device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetId {
    /// `gfx90a`
    pub processor: String,
    /// XNACK (page-fault retry).
    pub xnack: Setting,
    /// SRAM ECC.
    pub sramecc: Setting,
}

impl fmt::Display for TargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.processor)?;
        // LLVM's order: sramecc before xnack.
        for (name, s) in [("sramecc", self.sramecc), ("xnack", self.xnack)] {
            if matches!(s, Setting::On | Setting::Off) {
                write!(f, ":{name}{}", s.suffix())?;
            }
        }
        Ok(())
    }
}

impl TargetId {
    /// From the agent's ISA name (`amdgcn-amd-amdhsa--gfx90a:sramecc+:xnack-`); a feature it
    /// does not mention is one the processor does not have.
    pub fn from_isa_name(name: &str) -> Result<TargetId> {
        let target = name.rsplit("--").next().unwrap_or(name);
        let mut parts = target.split(':');
        let processor = parts.next().unwrap_or("").to_string();
        if !processor.starts_with("gfx") || processor.len() < 4 {
            return Err(Error::InvalidArgument(format!(
                "ISA name '{name}' names no gfx processor"
            )));
        }
        let mut id = TargetId {
            processor,
            xnack: Setting::Unsupported,
            sramecc: Setting::Unsupported,
        };
        for p in parts {
            let (feature, setting) = match p.strip_suffix('+') {
                Some(f) => (f, Setting::On),
                None => match p.strip_suffix('-') {
                    Some(f) => (f, Setting::Off),
                    None => (p, Setting::Any),
                },
            };
            match feature {
                "xnack" => id.xnack = setting,
                "sramecc" => id.sramecc = setting,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "ISA name '{name}': unknown target feature '{p}'"
                    )));
                }
            }
        }
        Ok(id)
    }

    /// LLVM target features for compiling for this device (`+xnack,-sramecc`).
    pub fn llvm_features(&self) -> String {
        let mut out = Vec::new();
        for (name, s) in [("sramecc", self.sramecc), ("xnack", self.xnack)] {
            match s {
                Setting::On => out.push(format!("+{name}")),
                Setting::Off => out.push(format!("-{name}")),
                Setting::Any | Setting::Unsupported => {}
            }
        }
        out.join(",")
    }

    /// Whether code for `self` (a code object's target id) runs on `device`; the error names
    /// both.
    pub fn runs_on(&self, device: &TargetId) -> Result<()> {
        let mismatch = |what: String| {
            Err(Error::InvalidImage(format!(
                "the code object is for {self}, this device is {device}: {what}"
            )))
        };
        if self.processor != device.processor {
            return mismatch(format!(
                "a code object runs only on its own processor ({} is not {})",
                self.processor, device.processor
            ));
        }
        for (name, image, dev) in [
            ("xnack", self.xnack, device.xnack),
            ("sramecc", self.sramecc, device.sramecc),
        ] {
            match (image, dev) {
                (Setting::Any | Setting::Unsupported, _) => {}
                (Setting::On, Setting::On) | (Setting::Off, Setting::Off) => {}
                (want, have) => {
                    return mismatch(format!(
                        "it needs {name} {}, the device has {name} {}",
                        describe(want),
                        describe(have)
                    ));
                }
            }
        }
        Ok(())
    }
}

fn describe(s: Setting) -> &'static str {
    match s {
        Setting::On => "on",
        Setting::Off => "off",
        Setting::Any => "either way",
        Setting::Unsupported => "unsupported",
    }
}

/// The code object version an ELF header declares (`EI_ABIVERSION` for OS/ABI HSA).
pub fn code_object_version(abi_version: u8) -> Option<u32> {
    match abi_version {
        2 => Some(4),
        3 => Some(5),
        4 => Some(6),
        _ => None,
    }
}

/// The target id a code object was built for, from its header: OS/ABI HSA, code object v4 to
/// v6, a processor this plugin knows, and the v4+ xnack/sramecc bits of `e_flags`. Each
/// problem is an error naming the field.
pub fn code_object_target(info: &ElfInfo, abi_version: u8) -> Result<TargetId> {
    if info.os_abi != ELFOSABI_AMDGPU_HSA {
        return Err(Error::InvalidImage(format!(
            "EI_OSABI (offset 7) is {}, not {ELFOSABI_AMDGPU_HSA} (AMDGPU HSA): not a code object for the HSA runtime",
            info.os_abi
        )));
    }
    if code_object_version(abi_version).is_none() {
        let what = match abi_version {
            0 => "code object v2".to_string(),
            1 => "code object v3".to_string(),
            v => format!("an unknown code object version (EI_ABIVERSION {v})"),
        };
        return Err(Error::InvalidImage(format!(
            "EI_ABIVERSION (offset 8) is {abi_version}: {what}; this plugin loads code objects v4 to v6 \
             (clang -mcode-object-version=5)"
        )));
    }
    let mach = info.flags & 0xff;
    let processor = gfx_of_mach(mach).ok_or_else(|| {
        Error::InvalidImage(format!(
            "e_flags (offset 48) = {:#x} names processor {mach:#x} (EF_AMDGPU_MACH), which this plugin does not know",
            info.flags
        ))
    })?;
    let xnack = match info.flags & 0x300 {
        0x000 => Setting::Unsupported,
        0x100 => Setting::Any,
        0x200 => Setting::Off,
        _ => Setting::On,
    };
    let sramecc = match info.flags & 0xc00 {
        0x000 => Setting::Unsupported,
        0x400 => Setting::Any,
        0x800 => Setting::Off,
        _ => Setting::On,
    };
    Ok(TargetId {
        processor: processor.to_string(),
        xnack,
        sramecc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> TargetId {
        TargetId::from_isa_name(&format!("amdgcn-amd-amdhsa--{s}")).unwrap()
    }

    #[test]
    fn target_ids_parse_print_and_match() {
        let mi250 = id("gfx90a:sramecc+:xnack-");
        assert_eq!(mi250.to_string(), "gfx90a:sramecc+:xnack-");
        assert_eq!(mi250.llvm_features(), "+sramecc,-xnack");
        let any = TargetId {
            processor: "gfx90a".into(),
            xnack: Setting::Any,
            sramecc: Setting::Any,
        };
        any.runs_on(&mi250).unwrap();
        let xnack_on = TargetId {
            xnack: Setting::On,
            ..any.clone()
        };
        let e = xnack_on.runs_on(&mi250).unwrap_err().to_string();
        assert!(
            e.contains("needs xnack on, the device has xnack off") && e.contains("gfx90a:xnack+"),
            "{e}"
        );
        let other = TargetId {
            processor: "gfx908".into(),
            ..any
        };
        let e = other.runs_on(&mi250).unwrap_err().to_string();
        assert!(
            e.contains("gfx908") && e.contains("gfx90a:sramecc+:xnack-"),
            "{e}"
        );
        let navi = id("gfx1100");
        assert_eq!(navi.xnack, Setting::Unsupported);
        assert_eq!(navi.llvm_features(), "");
        for bad in [
            "",
            "amdgcn-amd-amdhsa--",
            "amdgcn-amd-amdhsa--sm_90",
            "amdgcn-amd-amdhsa--gfx90a:foo+",
        ] {
            assert!(TargetId::from_isa_name(bad).is_err(), "{bad}");
        }
    }
}
