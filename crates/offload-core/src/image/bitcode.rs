//! Reading the target triple of an LLVM module without LLVM.
//!
//! Routing needs the triple of every bitcode image, in processes that must not map libLLVM
//! (`docs/decisions.md`, decision 2) and must survive any input: LLVM's own lazy reader
//! crashes on some malformed files. This is a small, bounded reader of LLVM's bitstream
//! container, just enough to find the first `MODULE_CODE_TRIPLE` record: blocks are entered or
//! skipped by their length, abbreviations (local and from the `BLOCKINFO` block) are honoured,
//! and every read is checked against the end of the data, so malformed input is an error that
//! says where, never a panic or a loop. Textual IR is scanned for its `target triple` line.

use crate::error::{Error, Result};
use crate::image::{BITCODE_MAGIC, BITCODE_WRAPPER_MAGIC};
use std::collections::HashMap;

const BLOCKINFO_BLOCK: u64 = 0;
const MODULE_BLOCK: u64 = 8;
const MODULE_CODE_TRIPLE: u64 = 2;
const BLOCKINFO_CODE_SETBID: u64 = 1;
/// Longest triple accepted (LLVM's are under 64 characters).
const MAX_TRIPLE: usize = 4096;
/// Most zero-width array elements a record may claim (each costs no bits to read).
const MAX_FREE_ELEMENTS: u64 = 1 << 20;

fn malformed(what: impl std::fmt::Display) -> Error {
    Error::InvalidImage(format!("malformed LLVM bitcode: {what}"))
}

/// An operand of an abbreviation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Literal(u64),
    Fixed(u32),
    Vbr(u32),
    Array,
    Char6,
    Blob,
}

type Abbrev = Vec<Op>;

/// A cursor over the bits of a bitstream (least significant bit of each byte first).
struct Bits<'a> {
    data: &'a [u8],
    pos: u64,
}

impl<'a> Bits<'a> {
    fn len(&self) -> u64 {
        self.data.len() as u64 * 8
    }

    fn remaining(&self) -> u64 {
        self.len().saturating_sub(self.pos)
    }

    fn fixed(&mut self, width: u32) -> Result<u64> {
        if width > 64 {
            return Err(malformed(format!(
                "field width {width} at bit {} (at most 64)",
                self.pos
            )));
        }
        if u64::from(width) > self.remaining() {
            return Err(malformed(format!(
                "truncated: {width} bits needed at bit {}, {} left",
                self.pos,
                self.remaining()
            )));
        }
        let mut value = 0u64;
        for i in 0..width {
            let bit = self.pos + u64::from(i);
            let byte = self.data[(bit / 8) as usize];
            value |= u64::from((byte >> (bit % 8)) & 1) << i;
        }
        self.pos += u64::from(width);
        Ok(value)
    }

    fn vbr(&mut self, width: u32) -> Result<u64> {
        if !(2..=32).contains(&width) {
            return Err(malformed(format!(
                "VBR width {width} at bit {} (must be 2..32)",
                self.pos
            )));
        }
        let start = self.pos;
        let payload = width - 1;
        let high = 1u64 << payload;
        let mut value = 0u64;
        let mut shift = 0u32;
        loop {
            let chunk = self.fixed(width)?;
            let bits = chunk & (high - 1);
            if shift >= 64 || (shift > 0 && bits >> (64 - shift) != 0) {
                return Err(malformed(format!(
                    "VBR value at bit {start} does not fit 64 bits"
                )));
            }
            value |= bits << shift;
            if chunk & high == 0 {
                return Ok(value);
            }
            shift += payload;
        }
    }

    fn align32(&mut self) -> Result<()> {
        let aligned = self.pos.div_ceil(32) * 32;
        if aligned > self.len() {
            return Err(malformed(format!(
                "truncated: alignment past the end at bit {}",
                self.pos
            )));
        }
        self.pos = aligned;
        Ok(())
    }
}

fn char6(v: u64) -> u8 {
    match v {
        0..=25 => b'a' + v as u8,
        26..=51 => b'A' + (v - 26) as u8,
        52..=61 => b'0' + (v - 52) as u8,
        62 => b'.',
        _ => b'_',
    }
}

fn read_abbrev_definition(bits: &mut Bits<'_>) -> Result<Abbrev> {
    let at = bits.pos;
    let count = bits.vbr(5)?;
    // Each operand takes at least one bit; a larger count cannot be real.
    if count == 0 || count > bits.remaining() {
        return Err(malformed(format!(
            "abbreviation at bit {at} has {count} operands"
        )));
    }
    let mut ops = Vec::new();
    for _ in 0..count {
        if bits.fixed(1)? == 1 {
            ops.push(Op::Literal(bits.vbr(8)?));
            continue;
        }
        let op = match bits.fixed(3)? {
            1 => match bits.vbr(5)? {
                // LLVM reads a zero-width field as the literal 0.
                0 => Op::Literal(0),
                w if w <= 64 => Op::Fixed(w as u32),
                w => {
                    return Err(malformed(format!(
                        "fixed width {w} in abbreviation at bit {at}"
                    )));
                }
            },
            2 => match bits.vbr(5)? {
                0 => Op::Literal(0),
                w if (2..=32).contains(&w) => Op::Vbr(w as u32),
                w => {
                    return Err(malformed(format!(
                        "VBR width {w} in abbreviation at bit {at}"
                    )));
                }
            },
            3 => Op::Array,
            4 => Op::Char6,
            5 => Op::Blob,
            e => {
                return Err(malformed(format!(
                    "operand encoding {e} in abbreviation at bit {at}"
                )));
            }
        };
        ops.push(op);
    }
    // Arrays are followed by exactly one element operand; arrays and blobs come last.
    for (i, op) in ops.iter().enumerate() {
        let ok = match op {
            Op::Array => i + 2 == ops.len() && !matches!(ops[i + 1], Op::Array | Op::Blob),
            Op::Blob => i + 1 == ops.len(),
            _ => true,
        };
        if !ok || (i == 0 && matches!(op, Op::Array | Op::Blob)) {
            return Err(malformed(format!(
                "abbreviation at bit {at} places an array or blob operand where none may be"
            )));
        }
    }
    Ok(ops)
}

fn scalar(bits: &mut Bits<'_>, op: Op) -> Result<u64> {
    match op {
        Op::Literal(v) => Ok(v),
        Op::Fixed(w) => bits.fixed(w),
        Op::Vbr(w) => bits.vbr(w),
        Op::Char6 => bits.fixed(6).map(|v| u64::from(char6(v))),
        Op::Array | Op::Blob => Err(malformed("nested array or blob operand")),
    }
}

/// A record: its code and (when `keep`) its operands, at most `MAX_TRIPLE` of them.
struct Record {
    code: u64,
    ops: Vec<u64>,
}

fn keep_op(ops: &mut Vec<u64>, keep: bool, v: u64) -> Result<()> {
    if keep {
        if ops.len() >= MAX_TRIPLE {
            return Err(malformed(format!(
                "target triple record longer than {MAX_TRIPLE} characters"
            )));
        }
        ops.push(v);
    }
    Ok(())
}

fn read_unabbreviated(bits: &mut Bits<'_>, keep: impl Fn(u64) -> bool) -> Result<Record> {
    let code = bits.vbr(6)?;
    let count = bits.vbr(6)?;
    let keep = keep(code);
    let mut ops = Vec::new();
    for _ in 0..count {
        // Each operand needs at least 6 bits; `vbr` fails at the end of the data.
        let v = bits.vbr(6)?;
        keep_op(&mut ops, keep, v)?;
    }
    Ok(Record { code, ops })
}

fn read_abbreviated(
    bits: &mut Bits<'_>,
    abbrev: &Abbrev,
    keep: impl Fn(u64) -> bool,
) -> Result<Record> {
    let code = scalar(bits, abbrev[0])?;
    let keep = keep(code);
    let mut ops = Vec::new();
    let mut i = 1;
    while i < abbrev.len() {
        match abbrev[i] {
            Op::Array => {
                let len = bits.vbr(6)?;
                let element = abbrev[i + 1];
                let free = matches!(element, Op::Literal(_));
                if (free && len > MAX_FREE_ELEMENTS) || (!free && len > bits.remaining()) {
                    return Err(malformed(format!(
                        "array of {len} elements at bit {} cannot fit the data",
                        bits.pos
                    )));
                }
                for _ in 0..len {
                    let v = scalar(bits, element)?;
                    keep_op(&mut ops, keep, v)?;
                }
                i += 2;
            }
            Op::Blob => {
                let len = bits.vbr(6)?;
                bits.align32()?;
                let bit_len = len
                    .checked_mul(8)
                    .filter(|b| *b <= bits.remaining())
                    .ok_or_else(|| {
                        malformed(format!(
                            "blob of {len} bytes at bit {} runs past the end",
                            bits.pos
                        ))
                    })?;
                if keep {
                    let start = (bits.pos / 8) as usize;
                    for &b in &bits.data[start..start + len as usize] {
                        keep_op(&mut ops, true, u64::from(b))?;
                    }
                }
                bits.pos += bit_len;
                bits.align32()?;
                i += 1;
            }
            op => {
                let v = scalar(bits, op)?;
                keep_op(&mut ops, keep, v)?;
                i += 1;
            }
        }
    }
    Ok(Record { code, ops })
}

/// Enters a sub-block whose `ENTER_SUBBLOCK` id was just read: `(block id, abbrev width,
/// end bit)`.
fn enter_block(bits: &mut Bits<'_>) -> Result<(u64, u32, u64)> {
    let at = bits.pos;
    let id = bits.vbr(8)?;
    let width = bits.vbr(4)?;
    if !(1..=32).contains(&width) {
        return Err(malformed(format!(
            "block {id} at bit {at} has abbreviation width {width} (must be 1..32)"
        )));
    }
    bits.align32()?;
    let words = bits.fixed(32)?;
    let end = bits.pos + words * 32;
    if end > bits.len() {
        return Err(malformed(format!(
            "block {id} at bit {at} is {words} words long, past the end of the data"
        )));
    }
    Ok((id, width as u32, end))
}

/// Reads a `BLOCKINFO` block's abbreviation definitions into `info`.
fn read_blockinfo(
    bits: &mut Bits<'_>,
    width: u32,
    end: u64,
    info: &mut HashMap<u64, Vec<Abbrev>>,
) -> Result<()> {
    let mut current: Option<u64> = None;
    loop {
        if bits.pos >= end {
            return Err(malformed(format!(
                "BLOCKINFO block ends at bit {end} without END_BLOCK"
            )));
        }
        match bits.fixed(width)? {
            0 => {
                bits.align32()?;
                return Ok(());
            }
            1 => {
                let (_, _, sub_end) = enter_block(bits)?;
                bits.pos = sub_end;
            }
            2 => {
                let abbrev = read_abbrev_definition(bits)?;
                let block = current.ok_or_else(|| {
                    malformed("BLOCKINFO defines an abbreviation before naming its block (SETBID)")
                })?;
                let list = info.entry(block).or_default();
                if list.len() >= 1 << 16 {
                    return Err(malformed("too many BLOCKINFO abbreviations"));
                }
                list.push(abbrev);
            }
            3 => {
                let r = read_unabbreviated(bits, |c| c == BLOCKINFO_CODE_SETBID)?;
                if r.code == BLOCKINFO_CODE_SETBID {
                    current = Some(
                        *r.ops
                            .first()
                            .ok_or_else(|| malformed("SETBID record without a block id"))?,
                    );
                }
            }
            id => {
                return Err(malformed(format!(
                    "abbreviation {id} used in BLOCKINFO at bit {}, which defines none",
                    bits.pos
                )));
            }
        }
    }
}

/// Scans a block's records for the triple. `Ok(Some)` when found, `Ok(None)` at `END_BLOCK`.
fn scan_module(
    bits: &mut Bits<'_>,
    width: u32,
    end: u64,
    info: &mut HashMap<u64, Vec<Abbrev>>,
) -> Result<Option<String>> {
    let mut abbrevs: Vec<Abbrev> = info.get(&MODULE_BLOCK).cloned().unwrap_or_default();
    let is_triple = |c: u64| c == MODULE_CODE_TRIPLE;
    loop {
        if bits.pos >= end {
            return Err(malformed(format!(
                "module block ends at bit {end} without END_BLOCK"
            )));
        }
        let record = match bits.fixed(width)? {
            0 => return Ok(None),
            1 => {
                let (id, sub_width, sub_end) = enter_block(bits)?;
                if id == BLOCKINFO_BLOCK {
                    read_blockinfo(bits, sub_width, sub_end, info)?;
                    // Abbreviations for the module block defined in a nested BLOCKINFO apply
                    // to blocks entered afterwards, not to this one: nothing to refresh.
                }
                bits.pos = sub_end;
                continue;
            }
            2 => {
                if abbrevs.len() >= 1 << 16 {
                    return Err(malformed("too many abbreviations in the module block"));
                }
                abbrevs.push(read_abbrev_definition(bits)?);
                continue;
            }
            3 => read_unabbreviated(bits, is_triple)?,
            id => {
                let abbrev = abbrevs.get((id - 4) as usize).ok_or_else(|| {
                    malformed(format!(
                        "abbreviation {id} used at bit {} but only {} are defined",
                        bits.pos,
                        abbrevs.len() + 4
                    ))
                })?;
                read_abbreviated(bits, abbrev, is_triple)?
            }
        };
        if record.code == MODULE_CODE_TRIPLE {
            let bytes: Vec<u8> = record
                .ops
                .iter()
                .map(|&v| {
                    u8::try_from(v).map_err(|_| {
                        malformed(format!("target triple character {v} is not a byte"))
                    })
                })
                .collect::<Result<_>>()?;
            return String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| malformed("target triple is not valid UTF-8"));
        }
    }
}

/// The raw bitcode inside `bytes` (after a wrapper header, if any), starting with `BC C0DE`.
fn unwrap(bytes: &[u8]) -> Result<&[u8]> {
    if bytes.len() >= 4 && bytes[..4] == BITCODE_WRAPPER_MAGIC {
        if bytes.len() < 20 {
            return Err(malformed(format!(
                "truncated wrapper header: {} bytes, 20 needed",
                bytes.len()
            )));
        }
        let word = |at: usize| {
            u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]) as usize
        };
        let (offset, size) = (word(8), word(12));
        let inner = offset
            .checked_add(size)
            .and_then(|end| bytes.get(offset..end))
            .ok_or_else(|| {
                malformed(format!(
                    "wrapper points at bytes {offset}..+{size} of {}",
                    bytes.len()
                ))
            })?;
        if inner.len() < 4 || inner[..4] != BITCODE_MAGIC {
            return Err(malformed(format!(
                "wrapper offset {offset} does not hold 'BC' c0 de"
            )));
        }
        return Ok(inner);
    }
    if bytes.len() < 4 || bytes[..4] != BITCODE_MAGIC {
        return Err(malformed("missing magic 'BC' c0 de"));
    }
    Ok(bytes)
}

/// The target triple of a bitcode module (empty when the module has none).
pub fn bitcode_triple(bytes: &[u8]) -> Result<String> {
    let raw = unwrap(bytes)?;
    let mut bits = Bits {
        data: &raw[4..],
        pos: 0,
    };
    let mut info: HashMap<u64, Vec<Abbrev>> = HashMap::new();
    loop {
        // Files are padded to whole words; fewer than 32 bits left is the end.
        if bits.remaining() < 32 {
            return Err(malformed("no module block found"));
        }
        match bits.fixed(2)? {
            1 => {
                let (id, width, end) = enter_block(&mut bits)?;
                match id {
                    BLOCKINFO_BLOCK => read_blockinfo(&mut bits, width, end, &mut info)?,
                    MODULE_BLOCK => {
                        return Ok(
                            scan_module(&mut bits, width, end, &mut info)?.unwrap_or_default()
                        );
                    }
                    _ => {}
                }
                bits.pos = end;
            }
            2 => {
                read_abbrev_definition(&mut bits)?;
            }
            3 => {
                read_unabbreviated(&mut bits, |_| false)?;
            }
            0 => {
                return Err(malformed(format!(
                    "END_BLOCK at top level (bit {})",
                    bits.pos - 2
                )));
            }
            _ => unreachable!("a 2-bit field"),
        }
    }
}

/// The `target triple` of textual IR (empty when there is none).
pub fn ir_triple(text: &[u8]) -> Result<String> {
    for line in text.split(|&b| b == b'\n') {
        let line = line.trim_ascii_start();
        let Some(rest) = line.strip_prefix(b"target") else {
            continue;
        };
        let rest = rest.trim_ascii_start();
        let Some(rest) = rest.strip_prefix(b"triple") else {
            continue;
        };
        let rest = rest.trim_ascii_start();
        let rest = rest
            .strip_prefix(b"=")
            .map(<[u8]>::trim_ascii_start)
            .and_then(|r| r.strip_prefix(b"\""))
            .ok_or_else(|| {
                Error::InvalidImage(
                    "invalid LLVM IR: 'target triple' is not followed by = \"...\"".into(),
                )
            })?;
        let end = rest.iter().position(|&b| b == b'"').ok_or_else(|| {
            Error::InvalidImage("invalid LLVM IR: unterminated target triple string".into())
        })?;
        return decode_ir_string(&rest[..end]);
    }
    Ok(String::new())
}

/// Decodes the `\XX` escapes of an IR string.
fn decode_ir_string(raw: &[u8]) -> Result<String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'\\' {
            let hex = raw
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            match (hex, raw.get(i + 1)) {
                (Some(b), _) => {
                    out.push(b);
                    i += 3;
                }
                (None, Some(b'\\')) => {
                    out.push(b'\\');
                    i += 2;
                }
                _ => {
                    out.push(b'\\');
                    i += 1;
                }
            }
        } else {
            out.push(raw[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| {
        Error::InvalidImage("invalid LLVM IR: target triple is not valid UTF-8".into())
    })
}

/// The target triple of a JIT input (bitcode or textual IR); empty when it has none.
pub fn module_triple(bytes: &[u8]) -> Result<String> {
    if bytes.len() >= 4 && (bytes[..4] == BITCODE_MAGIC || bytes[..4] == BITCODE_WRAPPER_MAGIC) {
        bitcode_triple(bytes)
    } else {
        ir_triple(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes bits least significant first, as LLVM's bitstream writer does.
    #[derive(Default)]
    struct Writer {
        bytes: Vec<u8>,
        bit: u64,
    }

    impl Writer {
        fn fixed(&mut self, v: u64, width: u32) {
            for i in 0..width {
                if self.bit % 8 == 0 {
                    self.bytes.push(0);
                }
                let b = ((v >> i) & 1) as u8;
                let last = self.bytes.len() - 1;
                self.bytes[last] |= b << (self.bit % 8);
                self.bit += 1;
            }
        }
        fn vbr(&mut self, mut v: u64, width: u32) {
            let hi = 1u64 << (width - 1);
            loop {
                if v < hi {
                    self.fixed(v, width);
                    return;
                }
                self.fixed((v & (hi - 1)) | hi, width);
                v >>= width - 1;
            }
        }
        fn align(&mut self) {
            while self.bit % 32 != 0 {
                self.fixed(0, 1);
            }
        }
    }

    /// A module block holding an abbreviated triple record (char6 array) after a skipped
    /// sub-block, wrapped in the bitcode magic.
    fn synthetic(triple: &str) -> Vec<u8> {
        let mut w = Writer::default();
        // ENTER_SUBBLOCK(module, width 3)
        w.fixed(1, 2);
        w.vbr(MODULE_BLOCK, 8);
        w.vbr(3, 4);
        w.align();
        let len_at = w.bytes.len();
        w.fixed(0, 32);
        let body_start = w.bit;
        // A sub-block of 1 word that must be skipped.
        w.fixed(1, 3);
        w.vbr(17, 8);
        w.vbr(2, 4);
        w.align();
        w.fixed(1, 32);
        w.fixed(0xdead_beef, 32);
        // DEFINE_ABBREV [literal 2, array of char6]
        w.fixed(2, 3);
        w.vbr(3, 5);
        w.fixed(1, 1);
        w.vbr(MODULE_CODE_TRIPLE, 8);
        w.fixed(0, 1);
        w.fixed(3, 3);
        w.fixed(0, 1);
        w.fixed(4, 3);
        // An unabbreviated unrelated record: code 1, ops [2].
        w.fixed(3, 3);
        w.vbr(1, 6);
        w.vbr(1, 6);
        w.vbr(2, 6);
        // The triple with abbreviation 4.
        w.fixed(4, 3);
        w.vbr(triple.len() as u64, 6);
        for c in triple.bytes() {
            let v = match c {
                b'a'..=b'z' => c - b'a',
                b'A'..=b'Z' => c - b'A' + 26,
                b'0'..=b'9' => c - b'0' + 52,
                b'.' => 62,
                _ => 63,
            };
            w.fixed(u64::from(v), 6);
        }
        w.fixed(0, 3);
        w.align();
        let words = (w.bit - body_start) / 32;
        w.bytes[len_at..len_at + 4].copy_from_slice(&(words as u32).to_le_bytes());
        [BITCODE_MAGIC.to_vec(), w.bytes].concat()
    }

    #[test]
    fn abbreviated_triples_are_read() {
        // char6 has no '-': the record spells it '_' and the test triple avoids dashes.
        let bc = synthetic("nvptx64.cuda");
        assert_eq!(bitcode_triple(&bc).unwrap(), "nvptx64.cuda");
        let mut wrapped = BITCODE_WRAPPER_MAGIC.to_vec();
        wrapped.extend_from_slice(&0u32.to_le_bytes());
        wrapped.extend_from_slice(&20u32.to_le_bytes());
        wrapped.extend_from_slice(&(bc.len() as u32).to_le_bytes());
        wrapped.extend_from_slice(&0u32.to_le_bytes());
        wrapped.extend_from_slice(&bc);
        assert_eq!(bitcode_triple(&wrapped).unwrap(), "nvptx64.cuda");
    }

    #[test]
    fn every_truncation_and_bit_flip_is_an_error_or_a_triple() {
        let bc = synthetic("x86_64");
        for len in 0..bc.len() {
            let _ = bitcode_triple(&bc[..len]);
        }
        for i in 0..bc.len() * 8 {
            let mut m = bc.clone();
            m[i / 8] ^= 1 << (i % 8);
            if let Err(e) = bitcode_triple(&m) {
                assert!(e.to_string().contains("malformed LLVM bitcode"), "{e}");
            }
        }
    }

    #[test]
    fn ir_triples_are_read_from_their_line() {
        let ir = b"; comment with target triple = \"no\"\n\ntarget datalayout = \"e\"\n  target triple = \"x86_64-unknown-linux-gnu\"\n";
        assert_eq!(ir_triple(ir).unwrap(), "x86_64-unknown-linux-gnu");
        assert_eq!(
            ir_triple(b"define void @f() {\n ret void\n}\n").unwrap(),
            ""
        );
        assert_eq!(ir_triple(b"target triple = \"a\\62c\"").unwrap(), "abc");
        assert!(ir_triple(b"target triple = \"open").is_err());
    }
}
