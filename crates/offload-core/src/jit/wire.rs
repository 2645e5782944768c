//! Bounded binary encoding: little-endian integers, length-prefixed byte strings.
//!
//! What every JIT message is made of (the plugin ABI's JIT service, the worker's frames, the
//! disk cache's entries): reading never trusts a length and names what it was reading.

use super::*;

/// Appends values to a buffer.
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// A `u8`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// A `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// A `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u64(v.len() as u64);
        self.0.extend_from_slice(v);
        self
    }
    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self, v: &str) -> &mut Self {
        self.bytes(v.as_bytes())
    }
    /// A path (its bytes; paths need not be UTF-8).
    pub fn path(&mut self, p: &std::path::Path) -> &mut Self {
        use std::os::unix::ffi::OsStrExt;
        self.bytes(p.as_os_str().as_bytes())
    }
}

/// Reads values back, failing with a message that names `what` on any short or bad field.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    /// Reads `buf`, a `what` (for messages).
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }

    fn short(&self, need: u64) -> Error {
        Error::System(format!(
            "corrupt {}: {need} more bytes needed at offset {}, {} left",
            self.what,
            self.pos,
            self.buf.len() - self.pos
        ))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8]> {
        let left = (self.buf.len() - self.pos) as u64;
        if n > left {
            return Err(self.short(n));
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    /// A `u8`.
    pub fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    /// A `u32`.
    pub fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    /// A `u64`.
    pub fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// Length-prefixed bytes (borrowed).
    pub fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u64()?;
        self.take(n)
    }
    /// A length-prefixed UTF-8 string.
    pub fn str(&mut self) -> Result<String> {
        let what = self.what;
        let b = self.bytes()?;
        String::from_utf8(b.to_vec())
            .map_err(|_| Error::System(format!("corrupt {what}: a string is not UTF-8")))
    }
    /// A path.
    pub fn path(&mut self) -> Result<PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(self.bytes()?)))
    }
    /// A boolean (0 or 1).
    pub fn bool(&mut self) -> Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(Error::System(format!(
                "corrupt {}: boolean byte {v}",
                self.what
            ))),
        }
    }
    /// Fails unless everything was read.
    pub fn finish(self) -> Result<()> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(Error::System(format!(
                "corrupt {}: {} unread bytes at the end",
                self.what,
                self.buf.len() - self.pos
            )))
        }
    }
    /// What is being read (for messages of callers).
    pub fn what(&self) -> &'static str {
        self.what
    }
}
