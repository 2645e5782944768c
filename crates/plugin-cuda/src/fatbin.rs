//! CUDA fat binaries: several cubins and PTX modules for different architectures in one file.
//!
//! The format (reverse-engineered by the community; NVIDIA does not publish it) is a 16-byte
//! header (`0xBA55ED50`, version 1, header size 16, size of what follows), then entries: each a
//! header (kind at 0: 1 PTX, 2 or 0x10 cubin; header size at 4; payload size at 8; SM number
//! at 28)
//! followed by its payload. A payload that is neither an ELF nor PTX text is compressed (the
//! flag bits for that changed across toolkits, the payloads' first bytes did not). Several fat binaries may be concatenated. Reading is
//! bounded and every malformed field is an error that names it.
//!
//! For a device the best entry is a cubin for exactly its SM, then a cubin it can run (same
//! major architecture, older minor), then the newest PTX it can run, which the driver compiles.
//! Compressed payloads are left to the driver (`cuModuleLoadFatBinary`), which knows how to
//! unpack them; the selection still decides whether the fat binary fits at all.

use crate::sm::Sm;
use offload_core::{Error, Result};

/// Magic of a fat binary (little-endian `0xBA55ED50`).
pub const MAGIC: u32 = 0xBA55_ED50;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// PTX text.
    Ptx,
    /// A cubin (ELF).
    Cubin,
    /// Something else (kind number).
    Other(u16),
}

/// One entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// What it holds.
    pub kind: EntryKind,
    /// The SM it is for.
    pub sm: Sm,
    /// The payload (compressed if `compressed`).
    pub payload: &'a [u8],
    /// Whether the payload is compressed (only the driver unpacks it).
    pub compressed: bool,
    /// Byte offset of the entry, for messages.
    pub offset: usize,
    /// The bytes of the fat binary holding it (`cuModuleLoadFatBinary` reads the first fat
    /// binary it is given, so a compressed entry goes to the driver in its own).
    pub container: std::ops::Range<usize>,
}

impl Entry<'_> {
    /// `cubin sm_90` / `PTX sm_80`, for messages.
    pub fn label(&self) -> String {
        let kind = match self.kind {
            EntryKind::Ptx => "PTX".to_string(),
            EntryKind::Cubin => "cubin".to_string(),
            EntryKind::Other(k) => format!("entry kind {k}"),
        };
        format!(
            "{kind} {}{}",
            self.sm,
            if self.compressed { " (compressed)" } else { "" }
        )
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::InvalidImage(format!("malformed CUDA fatbin: {what}"))
}

/// Every entry of every fat binary in `bytes`.
pub fn entries(bytes: &[u8]) -> Result<Vec<Entry<'_>>> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.iter().all(|&b| b == 0) {
            break;
        }
        if rest.len() < 16 || u32_at(rest, 0) != MAGIC {
            return Err(bad(format!(
                "no fatbin header (magic 50 ed 55 ba) at byte {at}"
            )));
        }
        let header = u16_at(rest, 6) as usize;
        if header < 16 || header > rest.len() {
            return Err(bad(format!(
                "header size {header} (offset {}) is impossible",
                at + 6
            )));
        }
        let size = u64_at(rest, 8);
        let end = (header as u64)
            .checked_add(size)
            .filter(|e| *e <= rest.len() as u64)
            .ok_or_else(|| bad(format!("size {size} (offset {}) runs past the end", at + 8)))?
            as usize;
        let mut e = header;
        while e < end {
            let here = at + e;
            if end - e < 48 {
                return Err(bad(format!("truncated entry header at byte {here}")));
            }
            let entry = &rest[e..end];
            // Kind 0x10 is a second ELF kind: cuobjdump lists and extracts such entries as
            // cubins (seen in CUDA 11-13 libraries). Its payload is checked as any cubin's is
            // (an ELF, or compressed and left to the driver); other kinds are not loadable.
            let kind = match u16_at(entry, 0) {
                1 => EntryKind::Ptx,
                2 | 0x10 => EntryKind::Cubin,
                k => EntryKind::Other(k),
            };
            let head = u32_at(entry, 4) as usize;
            let payload = u64_at(entry, 8);
            if head < 48 || head > entry.len() {
                return Err(bad(format!(
                    "entry header size {head} at byte {}",
                    here + 4
                )));
            }
            let payload_end = (head as u64)
                .checked_add(payload)
                .filter(|p| *p <= entry.len() as u64)
                .ok_or_else(|| {
                    bad(format!(
                        "entry payload of {payload} bytes at byte {} runs past the end",
                        here + 8
                    ))
                })? as usize;
            let sm_number = u32_at(entry, 28);
            let data = &entry[head..payload_end];
            // Uncompressed payloads start with the ELF magic or are PTX text; anything else is
            // compressed (the flag bits for it changed across toolkits).
            let plain = data.starts_with(b"\x7fELF")
                || (kind == EntryKind::Ptx && offload_core::image::looks_like_ptx(data));
            out.push(Entry {
                kind,
                sm: Sm::from_number(sm_number, false),
                payload: data,
                compressed: !plain,
                offset: here,
                container: at..at + end,
            });
            if out.len() > 4096 {
                return Err(bad("more than 4096 entries"));
            }
            e += payload_end;
        }
        at += end;
    }
    if out.is_empty() {
        return Err(bad("no entries"));
    }
    Ok(out)
}

/// The entry a device of architecture `device` should load, or an error listing what the fat
/// binary holds and why nothing fits.
pub fn select<'a>(entries: &[Entry<'a>], device: Sm) -> Result<Entry<'a>> {
    let mut best: Option<((u8, u32), Entry<'a>)> = None;
    let mut reasons = Vec::new();
    for e in entries {
        // An uncompressed cubin's own header says whether it is the `a` variant.
        let sm = match (e.kind, e.compressed) {
            (EntryKind::Cubin, false) => crate::sm::cubin_sm(e.payload).unwrap_or(e.sm),
            (EntryKind::Ptx, false) => crate::sm::ptx_target(e.payload).unwrap_or(e.sm),
            _ => e.sm,
        };
        // Lower is better: (0, _) the exact cubin, (1, older minor) a compatible cubin,
        // (2, older architecture) PTX, newest first.
        let rank: (u8, u32) = match e.kind {
            EntryKind::Cubin => match sm.cubin_runs_on(device) {
                Ok(()) if sm.number() == device.number() => (0, 0),
                Ok(()) => (1, device.minor - sm.minor),
                Err(err) => {
                    reasons.push(format!("{}: {}", e.label(), err.message()));
                    continue;
                }
            },
            EntryKind::Ptx => match sm.ptx_runs_on(device) {
                Ok(()) => (2, device.number() - sm.number()),
                Err(err) => {
                    reasons.push(format!("{}: {}", e.label(), err.message()));
                    continue;
                }
            },
            EntryKind::Other(k) => {
                reasons.push(format!(
                    "entry kind {k} at byte {} is not loadable",
                    e.offset
                ));
                continue;
            }
        };
        if best.as_ref().is_none_or(|(r, _)| rank < *r) {
            best = Some((rank, e.clone()));
        }
    }
    best.map(|(_, e)| e).ok_or_else(|| {
        let list: Vec<String> = entries.iter().map(Entry::label).collect();
        Error::InvalidImage(format!(
            "CUDA fatbin with {} entr{} ({}): none runs on {device}: {}",
            entries.len(),
            if entries.len() == 1 { "y" } else { "ies" },
            list.join(", "),
            reasons.join("; ")
        ))
    })
}

/// Builds a fat binary from `(kind, sm, payload)` entries (uncompressed), as tools do: used by
/// the tests and handy for packaging.
pub fn build(entries: &[(EntryKind, u32, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (kind, sm, payload) in entries {
        let padded = payload.len().div_ceil(8) * 8;
        let mut head = vec![0u8; 64];
        let k: u16 = match kind {
            EntryKind::Ptx => 1,
            EntryKind::Cubin => 2,
            EntryKind::Other(k) => *k,
        };
        head[0..2].copy_from_slice(&k.to_le_bytes());
        head[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        head[4..8].copy_from_slice(&64u32.to_le_bytes());
        head[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
        head[28..32].copy_from_slice(&sm.to_le_bytes());
        body.extend_from_slice(&head);
        body.extend_from_slice(payload);
        body.resize(body.len() + (padded - payload.len()), 0);
    }
    let mut out = Vec::with_capacity(16 + body.len());
    out.extend_from_slice(&MAGIC.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_prefers_exact_cubin_then_compatible_then_newest_ptx() {
        let fake_cubin = |sm: u32| {
            let mut h = vec![0u8; 64];
            h[..4].copy_from_slice(b"\x7fELF");
            h[8] = 7;
            h[48..52].copy_from_slice(&(sm | (sm << 16) | 0x500).to_le_bytes());
            h
        };
        let (c80, c86, c90) = (fake_cubin(80), fake_cubin(86), fake_cubin(90));
        let ptx70 = b".version 7.0\n.target sm_70\n".to_vec();
        let ptx80 = b".version 7.0\n.target sm_80\n".to_vec();
        let fat = build(&[
            (EntryKind::Ptx, 70, &ptx70),
            (EntryKind::Cubin, 80, &c80),
            (EntryKind::Cubin, 86, &c86),
            (EntryKind::Ptx, 80, &ptx80),
            (EntryKind::Cubin, 90, &c90),
        ]);
        let all = entries(&fat).unwrap();
        assert_eq!(all.len(), 5);
        let pick = |cc: (u32, u32)| select(&all, Sm::device(cc.0, cc.1)).map(|e| e.label());
        assert_eq!(pick((9, 0)).unwrap(), "cubin sm_90");
        assert_eq!(pick((8, 6)).unwrap(), "cubin sm_86");
        assert_eq!(pick((8, 9)).unwrap(), "cubin sm_86");
        assert_eq!(pick((8, 0)).unwrap(), "cubin sm_80");
        assert_eq!(pick((12, 0)).unwrap(), "PTX sm_80");
        assert_eq!(pick((7, 5)).unwrap(), "PTX sm_70");
        let e = pick((6, 1)).unwrap_err().to_string();
        assert!(
            e.contains("5 entries") && e.contains("none runs on sm_61"),
            "{e}"
        );
        // Kind 0x10 is a cubin like kind 2; other kinds are listed and refused by number.
        let alt = build(&[(EntryKind::Other(0x10), 90, &c90)]);
        let alt = entries(&alt).unwrap();
        assert_eq!((alt[0].kind, alt[0].compressed), (EntryKind::Cubin, false));
        assert_eq!(
            select(&alt, Sm::device(9, 0)).unwrap().label(),
            "cubin sm_90"
        );
        let odd = build(&[(EntryKind::Other(0x40), 90, &c90)]);
        let e = select(&entries(&odd).unwrap(), Sm::device(9, 0))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("entry kind 64 at byte 16 is not loadable"),
            "{e}"
        );
        // Every truncation and byte flip is an error or a list, never a panic.
        for len in 0..fat.len() {
            let _ = entries(&fat[..len]);
        }
        for i in 0..fat.len() {
            let mut m = fat.clone();
            m[i] ^= 0xff;
            if let Ok(list) = entries(&m) {
                let _ = select(&list, Sm::device(9, 0));
            }
        }
    }
}
