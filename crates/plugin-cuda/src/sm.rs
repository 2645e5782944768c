//! Streaming-multiprocessor architectures (`sm_90`, `sm_90a`) and which code runs where.

use offload_core::{Error, Result};
use std::fmt;

/// An SM architecture: compute capability, and whether it is the architecture-specific variant
/// (`sm_90a`: features that only this exact architecture has).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Sm {
    /// Major compute capability.
    pub major: u32,
    /// Minor compute capability.
    pub minor: u32,
    /// The `a` variant.
    pub arch_specific: bool,
}

impl Sm {
    /// A device of compute capability `major.minor`; devices from 9.0 on have the
    /// architecture-specific features of their own architecture.
    pub fn device(major: u32, minor: u32) -> Self {
        Sm {
            major,
            minor,
            arch_specific: major >= 9,
        }
    }

    /// From an SM number (`90` → 9.0).
    pub fn from_number(n: u32, arch_specific: bool) -> Self {
        Sm {
            major: n / 10,
            minor: n % 10,
            arch_specific,
        }
    }

    /// `90` for 9.0.
    pub fn number(&self) -> u32 {
        self.major * 10 + self.minor
    }

    /// Parses `sm_90`, `sm_90a`, `compute_90` (and `sm_90f` as `sm_90`).
    pub fn parse(text: &str) -> Option<Sm> {
        let digits = text
            .strip_prefix("sm_")
            .or_else(|| text.strip_prefix("compute_"))?;
        let (n, suffix) = digits.split_at(
            digits
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(digits.len()),
        );
        let n: u32 = n.parse().ok()?;
        if n < 10 {
            return None;
        }
        match suffix {
            "" | "f" => Some(Sm::from_number(n, false)),
            "a" => Some(Sm::from_number(n, true)),
            _ => None,
        }
    }

    /// Whether a cubin built for `self` runs on `device`: same major version, minor at most
    /// the device's; an architecture-specific cubin only on exactly its architecture.
    pub fn cubin_runs_on(&self, device: Sm) -> Result<()> {
        let ok = self.major == device.major
            && self.minor <= device.minor
            && (!self.arch_specific || (self.minor == device.minor && device.arch_specific));
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidImage(format!(
                "the cubin is for {self}, this device is {device} (a cubin runs on the same major \
                 architecture with an equal or newer minor version{})",
                if self.arch_specific {
                    "; an 'a' cubin only on exactly its architecture"
                } else {
                    ""
                }
            )))
        }
    }

    /// Whether PTX for `self` can be compiled for `device` by the driver: the device is at least
    /// as new; architecture-specific PTX only for exactly its architecture.
    pub fn ptx_runs_on(&self, device: Sm) -> Result<()> {
        let ok = self.number() <= device.number()
            && (!self.arch_specific || (self.number() == device.number() && device.arch_specific));
        if ok {
            Ok(())
        } else {
            Err(Error::InvalidImage(format!(
                "the PTX targets {self}, this device is {device} (PTX runs on its target \
                 architecture or newer{})",
                if self.arch_specific {
                    "; 'a' PTX only on exactly its architecture"
                } else {
                    ""
                }
            )))
        }
    }
}

impl fmt::Display for Sm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sm_{}{}",
            self.number(),
            if self.arch_specific { "a" } else { "" }
        )
    }
}

/// The SM a cubin is built for, from its ELF header: `e_flags` holds it in the low byte for
/// ELF ABI version 7 (up to sm_90; bit 0x800 marks `a`), in bits 8..15 for ABI version 8
/// (sm_100 on; bit 0x8 marks `a`).
pub fn cubin_sm(bytes: &[u8]) -> Result<Sm> {
    if bytes.len() < 64 {
        return Err(Error::InvalidImage(format!(
            "truncated cubin: {} bytes, the ELF header needs 64",
            bytes.len()
        )));
    }
    let flags = u32::from_le_bytes(bytes[48..52].try_into().expect("4 bytes"));
    let abi = bytes[8];
    let (n, a) = if abi >= 8 {
        ((flags >> 8) & 0xff, flags & 0x8 != 0)
    } else {
        (flags & 0xff, flags & 0x800 != 0)
    };
    if n < 10 {
        return Err(Error::InvalidImage(format!(
            "cubin e_flags (offset 48) = {flags:#x} name no SM architecture (ELF ABI version {abi})"
        )));
    }
    Ok(Sm::from_number(n, a))
}

/// The `.target` of PTX text (`sm_90a`).
pub fn ptx_target(ptx: &[u8]) -> Result<Sm> {
    let text = String::from_utf8_lossy(&ptx[..ptx.len().min(64 << 10)]);
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix(".target") {
            let first = rest
                .split(|c: char| c == ',' || c.is_whitespace())
                .find(|t| !t.is_empty())
                .unwrap_or("");
            return Sm::parse(first).ok_or_else(|| {
                Error::InvalidImage(format!("PTX '.target {first}' names no SM architecture"))
            });
        }
    }
    Err(Error::InvalidImage(
        "PTX text has no .target directive".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compatibility_rules() {
        let h200 = Sm::device(9, 0);
        assert_eq!(h200.to_string(), "sm_90a");
        let a100 = Sm::device(8, 0);
        assert_eq!(a100.to_string(), "sm_80");
        let ga102 = Sm::device(8, 6);
        let sm80 = Sm::parse("sm_80").unwrap();
        sm80.cubin_runs_on(ga102).unwrap();
        sm80.cubin_runs_on(a100).unwrap();
        assert!(sm80.cubin_runs_on(h200).is_err());
        let sm86 = Sm::parse("sm_86").unwrap();
        assert!(sm86.cubin_runs_on(a100).is_err());
        let sm90 = Sm::parse("sm_90").unwrap();
        sm90.cubin_runs_on(h200).unwrap();
        let sm90a = Sm::parse("sm_90a").unwrap();
        sm90a.cubin_runs_on(h200).unwrap();
        assert!(sm90a.cubin_runs_on(Sm::device(10, 0)).is_err());
        sm80.ptx_runs_on(h200).unwrap();
        assert!(sm90.ptx_runs_on(a100).is_err());
        assert!(sm90a.ptx_runs_on(Sm::device(10, 0)).is_err());
        assert_eq!(Sm::parse("compute_75"), Some(Sm::from_number(75, false)));
        assert_eq!(Sm::parse("sm_100a"), Some(Sm::from_number(100, true)));
        for bad in ["sm_", "sm_9", "gfx90a", "sm_90x", "sm_ab"] {
            assert_eq!(Sm::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn ptx_targets_are_read() {
        assert_eq!(
            ptx_target(b"//\n.version 7.8\n.target sm_90a, texmode_independent\n").unwrap(),
            Sm::from_number(90, true)
        );
        assert!(ptx_target(b".version 7.8\n").is_err());
        assert!(ptx_target(b".version 7.8\n.target gfx90a\n").is_err());
    }
}
