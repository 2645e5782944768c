//! The messages between a program's client and a proxy rank: one request, one reply, each
//! a header and a payload, little-endian.
//!
//! ```text
//! header   magic u32 "OFMP" | version u16 | kind u16 | id u64 | payload length u64
//! request  Hello | Alloc { device u32, bytes u64 } | Free { handle u64 }
//!          | Write { handle u64, offset u64, bytes } | Read { handle u64, offset u64, len u64 }
//!          | Shutdown
//! reply    Hello { version u16, devices } | Handle { handle u64 } | Done | Bytes { bytes }
//!          | Failed { kind u16, message }
//! ```
//!
//! Byte strings and texts are a u64 length and the bytes. Decoding checks every length
//! against what is left, and names the field and the byte offset it stopped at: a message
//! from a peer of another version, or corrupted bytes, is an error, never a panic.

use offload_core::{Error, Result};

/// "OFMP", little-endian.
pub const MAGIC: u32 = u32::from_le_bytes(*b"OFMP");
/// The message format's version: client and proxy must agree.
pub const VERSION: u16 = 1;
/// Bytes before the payload.
pub const HEADER: usize = 4 + 2 + 2 + 8 + 8;
/// The largest text a message carries (a device name, an error message).
const MAX_TEXT: u64 = 1 << 16;
/// The most devices one proxy reports.
const MAX_DEVICES: u64 = 1 << 10;

/// A device of a proxy's node, as the proxy reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteDevice {
    /// The plugin serving it on the proxy's node ("host", "cuda", ...).
    pub plugin: String,
    /// Its index in that plugin.
    pub index: u32,
    /// The device's name.
    pub name: String,
    /// Its compute-unit kind (`sm_90`, `gfx90a`, a host CPU's).
    pub compute_unit_kind: String,
    /// Device memory, in bytes.
    pub total_memory: u64,
}

/// What the client asks of a proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Say the version and the devices.
    Hello,
    /// Allocate `bytes` of device memory on device `device` (an index into the hello's list).
    Alloc { device: u32, bytes: u64 },
    /// Free an allocation.
    Free { handle: u64 },
    /// Copy `bytes` into an allocation at `offset`.
    Write {
        handle: u64,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// Copy `len` bytes from an allocation at `offset` back.
    Read { handle: u64, offset: u64, len: u64 },
    /// End the proxy (after its reply).
    Shutdown,
}

/// What a proxy answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The proxy's message version and devices.
    Hello {
        version: u16,
        devices: Vec<RemoteDevice>,
    },
    /// A new allocation's handle (opaque to the client).
    Handle { handle: u64 },
    /// Done.
    Done,
    /// The bytes a read asked for.
    Bytes { bytes: Vec<u8> },
    /// The request failed: the error's kind (offload's ABI kind) and message.
    Failed { kind: u16, message: String },
}

impl Request {
    fn kind(&self) -> u16 {
        match self {
            Request::Hello => 1,
            Request::Alloc { .. } => 2,
            Request::Free { .. } => 3,
            Request::Write { .. } => 4,
            Request::Read { .. } => 5,
            Request::Shutdown => 6,
        }
    }

    /// What the request is, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello => "hello",
            Request::Alloc { .. } => "alloc",
            Request::Free { .. } => "free",
            Request::Write { .. } => "write",
            Request::Read { .. } => "read",
            Request::Shutdown => "shutdown",
        }
    }

    /// The message for request `id`.
    pub fn encode(&self, id: u64) -> Vec<u8> {
        let mut w = Writer::new(self.kind(), id);
        match self {
            Request::Hello | Request::Shutdown => {}
            Request::Alloc { device, bytes } => {
                w.u32(*device);
                w.u64(*bytes);
            }
            Request::Free { handle } => w.u64(*handle),
            Request::Write {
                handle,
                offset,
                bytes,
            } => {
                w.u64(*handle);
                w.u64(*offset);
                w.bytes(bytes);
            }
            Request::Read {
                handle,
                offset,
                len,
            } => {
                w.u64(*handle);
                w.u64(*offset);
                w.u64(*len);
            }
        }
        w.finish()
    }

    /// A request and its id, from a message.
    pub fn decode(message: &[u8]) -> Result<(u64, Request)> {
        let (kind, id, mut r) = Reader::header(message)?;
        let request = match kind {
            1 => Request::Hello,
            2 => Request::Alloc {
                device: r.u32("device")?,
                bytes: r.u64("bytes")?,
            },
            3 => Request::Free {
                handle: r.u64("handle")?,
            },
            4 => Request::Write {
                handle: r.u64("handle")?,
                offset: r.u64("offset")?,
                bytes: r.bytes("bytes", u64::MAX)?.to_vec(),
            },
            5 => Request::Read {
                handle: r.u64("handle")?,
                offset: r.u64("offset")?,
                len: r.u64("len")?,
            },
            6 => Request::Shutdown,
            k => return Err(r.error("kind", &format!("no request has kind {k}"))),
        };
        r.end()?;
        Ok((id, request))
    }
}

impl Reply {
    fn kind(&self) -> u16 {
        match self {
            Reply::Hello { .. } => 101,
            Reply::Handle { .. } => 102,
            Reply::Done => 103,
            Reply::Bytes { .. } => 104,
            Reply::Failed { .. } => 105,
        }
    }

    /// The error a [`Reply::Failed`] carries, as the proxy had it (kind and message), or
    /// `None` for any other reply.
    pub fn error(&self) -> Option<Error> {
        match self {
            Reply::Failed { kind, message } => {
                Some(Error::from_parts(u32::from(*kind), 0, message.clone()))
            }
            _ => None,
        }
    }

    /// The reply to an error.
    pub fn failed(e: &Error) -> Reply {
        Reply::Failed {
            kind: e.kind() as u16,
            message: e.message().to_string(),
        }
    }

    /// The message answering request `id`.
    pub fn encode(&self, id: u64) -> Vec<u8> {
        let mut w = Writer::new(self.kind(), id);
        match self {
            Reply::Hello { version, devices } => {
                w.u16(*version);
                w.u64(devices.len() as u64);
                for d in devices {
                    w.text(&d.plugin);
                    w.u32(d.index);
                    w.text(&d.name);
                    w.text(&d.compute_unit_kind);
                    w.u64(d.total_memory);
                }
            }
            Reply::Handle { handle } => w.u64(*handle),
            Reply::Done => {}
            Reply::Bytes { bytes } => w.bytes(bytes),
            Reply::Failed { kind, message } => {
                w.u16(*kind);
                w.text(message);
            }
        }
        w.finish()
    }

    /// A reply and the id it answers, from a message.
    pub fn decode(message: &[u8]) -> Result<(u64, Reply)> {
        let (kind, id, mut r) = Reader::header(message)?;
        let reply = match kind {
            101 => {
                let version = r.u16("version")?;
                let n = r.u64("device count")?;
                if n > MAX_DEVICES {
                    return Err(r.error(
                        "device count",
                        &format!("{n} devices (at most {MAX_DEVICES})"),
                    ));
                }
                let mut devices = Vec::new();
                for _ in 0..n {
                    devices.push(RemoteDevice {
                        plugin: r.text("plugin")?,
                        index: r.u32("index")?,
                        name: r.text("name")?,
                        compute_unit_kind: r.text("compute unit kind")?,
                        total_memory: r.u64("total memory")?,
                    });
                }
                Reply::Hello { version, devices }
            }
            102 => Reply::Handle {
                handle: r.u64("handle")?,
            },
            103 => Reply::Done,
            104 => Reply::Bytes {
                bytes: r.bytes("bytes", u64::MAX)?.to_vec(),
            },
            105 => Reply::Failed {
                kind: r.u16("error kind")?,
                message: r.text("message")?,
            },
            k => return Err(r.error("kind", &format!("no reply has kind {k}"))),
        };
        r.end()?;
        Ok((id, reply))
    }
}

/// Builds one message.
struct Writer(Vec<u8>);

impl Writer {
    fn new(kind: u16, id: u64) -> Writer {
        let mut w = Writer(Vec::with_capacity(HEADER));
        w.u32(MAGIC);
        w.u16(VERSION);
        w.u16(kind);
        w.u64(id);
        w.u64(0); // the payload's length, set by `finish`
        w
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    /// A text, cut to [`MAX_TEXT`] bytes at a character boundary.
    fn text(&mut self, t: &str) {
        let mut end = t.len().min(MAX_TEXT as usize);
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&t.as_bytes()[..end]);
    }
    fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - HEADER) as u64;
        self.0[HEADER - 8..HEADER].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

/// Reads one message, every length checked.
struct Reader<'m> {
    message: &'m [u8],
    at: usize,
}

impl<'m> Reader<'m> {
    /// The kind, the id and a reader of the payload; the magic, the version and the payload's
    /// length checked.
    fn header(message: &'m [u8]) -> Result<(u16, u64, Reader<'m>)> {
        let mut r = Reader { message, at: 0 };
        let magic = r.u32("magic")?;
        if magic != MAGIC {
            return Err(r.error(
                "magic",
                &format!("{magic:#010x} is not an offload MPI message"),
            ));
        }
        let version = r.u16("version")?;
        if version != VERSION {
            return Err(r.error(
                "version",
                &format!("message version {version}; this side speaks version {VERSION}"),
            ));
        }
        let kind = r.u16("kind")?;
        let id = r.u64("id")?;
        let len = r.u64("payload length")?;
        let left = (message.len() - HEADER) as u64;
        if len != left {
            return Err(r.error(
                "payload length",
                &format!("the header says {len} bytes, the message has {left}"),
            ));
        }
        Ok((kind, id, r))
    }

    fn error(&self, field: &str, what: &str) -> Error {
        Error::InvalidArgument(format!(
            "offload MPI message ({} bytes), byte {}: field '{field}': {what}",
            self.message.len(),
            self.at
        ))
    }

    fn take(&mut self, field: &str, n: usize) -> Result<&'m [u8]> {
        let left = self.message.len() - self.at;
        if n > left {
            return Err(self.error(field, &format!("needs {n} bytes, {left} left")));
        }
        let b = &self.message[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }
    fn u16(&mut self, field: &str) -> Result<u16> {
        Ok(u16::from_le_bytes(
            self.take(field, 2)?.try_into().expect("2 bytes"),
        ))
    }
    fn u32(&mut self, field: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(field, 4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self, field: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(field, 8)?.try_into().expect("8 bytes"),
        ))
    }
    fn bytes(&mut self, field: &str, max: u64) -> Result<&'m [u8]> {
        let len = self.u64(field)?;
        if len > max {
            return Err(self.error(field, &format!("{len} bytes (at most {max})")));
        }
        let left = (self.message.len() - self.at) as u64;
        if len > left {
            return Err(self.error(field, &format!("{len} bytes, {left} left")));
        }
        self.take(field, len as usize)
    }
    fn text(&mut self, field: &str) -> Result<String> {
        let b = self.bytes(field, MAX_TEXT)?;
        String::from_utf8(b.to_vec()).map_err(|e| self.error(field, &format!("not UTF-8 ({e})")))
    }
    fn end(&self) -> Result<()> {
        let left = self.message.len() - self.at;
        if left > 0 {
            return Err(self.error("end", &format!("{left} bytes after the last field")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requests() -> Vec<Request> {
        vec![
            Request::Hello,
            Request::Alloc {
                device: 3,
                bytes: 1 << 40,
            },
            Request::Free { handle: 77 },
            Request::Write {
                handle: 5,
                offset: 9,
                bytes: (0..300u32).map(|i| i as u8).collect(),
            },
            Request::Write {
                handle: 5,
                offset: 0,
                bytes: Vec::new(),
            },
            Request::Read {
                handle: 1,
                offset: 2,
                len: 3,
            },
            Request::Shutdown,
        ]
    }

    fn replies() -> Vec<Reply> {
        vec![
            Reply::Hello {
                version: VERSION,
                devices: vec![RemoteDevice {
                    plugin: "host".into(),
                    index: 0,
                    name: "Host CPU (2 threads)".into(),
                    compute_unit_kind: "znver3".into(),
                    total_memory: 24 << 30,
                }],
            },
            Reply::Handle { handle: 42 },
            Reply::Done,
            Reply::Bytes {
                bytes: vec![1, 2, 3],
            },
            Reply::Failed {
                kind: 3,
                message: "handle 9 is not an allocation of this proxy".into(),
            },
        ]
    }

    #[test]
    fn every_message_comes_back_as_it_went() {
        for (i, r) in requests().into_iter().enumerate() {
            assert_eq!(Request::decode(&r.encode(i as u64)).unwrap(), (i as u64, r));
        }
        for (i, r) in replies().into_iter().enumerate() {
            assert_eq!(Reply::decode(&r.encode(i as u64)).unwrap(), (i as u64, r));
        }
    }

    #[test]
    fn a_text_too_long_is_cut_at_a_character_and_still_decodes() {
        let message = "é".repeat(MAX_TEXT as usize); // two bytes each
        let (_, back) = Reply::decode(
            &Reply::Failed {
                kind: 10,
                message: format!("x{message}"),
            }
            .encode(3),
        )
        .unwrap();
        let Reply::Failed { message: cut, .. } = back else {
            panic!("{back:?}")
        };
        assert!(cut.len() <= MAX_TEXT as usize && cut.len() >= MAX_TEXT as usize - 1);
        assert!(cut.starts_with("xé") && cut.ends_with('é'));
    }

    #[test]
    fn errors_name_the_field_and_the_byte() {
        let mut m = Request::Alloc {
            device: 1,
            bytes: 2,
        }
        .encode(7);
        m.truncate(m.len() - 3);
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(e.contains("payload length") && e.contains("byte 24"), "{e}");
        let mut m = Request::Hello.encode(1);
        m[4] = 9;
        let e = Request::decode(&m).unwrap_err().to_string();
        assert!(
            e.contains("message version 9; this side speaks version 1"),
            "{e}"
        );
        let e = Request::decode(b"OFM").unwrap_err().to_string();
        assert!(e.contains("field 'magic': needs 4 bytes, 3 left"), "{e}");
        let e = Reply::decode(&Request::Hello.encode(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no reply has kind 1"), "{e}");
    }

    #[test]
    fn mutated_messages_decode_to_an_error_or_a_message_never_a_panic() {
        // Seeded: flipped bytes, truncations, extensions and length fields set to huge
        // values, over every kind of message; each decode must return (a mutant that still
        // parses is a message like any other, and must encode back to the same bytes).
        let mut rng = offload_core::rand::XorShift(0x0ff1_0ad5_eed5);
        let mut next = || rng.next_u64();
        let messages: Vec<Vec<u8>> = requests()
            .iter()
            .map(|r| r.encode(11))
            .chain(replies().iter().map(|r| r.encode(12)))
            .collect();
        let (mut errors, mut parsed) = (0, 0);
        for round in 0..20_000 {
            let mut m = messages[round % messages.len()].clone();
            match next() % 4 {
                0 => {
                    for _ in 0..1 + next() % 4 {
                        let i = (next() % m.len() as u64) as usize;
                        m[i] ^= 1 << (next() % 8);
                    }
                }
                1 => m.truncate((next() % m.len() as u64) as usize),
                2 => m.extend((0..1 + next() % 16).map(|_| next() as u8)),
                _ => {
                    // A length field (the header's, or the first one in the payload) huge.
                    let at = if next() % 2 == 0 || m.len() < HEADER + 8 {
                        HEADER - 8
                    } else {
                        HEADER + (next() % (m.len() - HEADER - 7) as u64) as usize
                    };
                    m[at..at + 8].copy_from_slice(&(u64::MAX - next() % 3).to_le_bytes());
                }
            }
            let as_request = Request::decode(&m).map(|(id, r)| r.encode(id));
            let as_reply = Reply::decode(&m).map(|(id, r)| r.encode(id));
            for back in [as_request, as_reply] {
                match back {
                    Ok(b) => {
                        assert_eq!(b, m, "round {round}: a parsed mutant encodes back");
                        parsed += 1;
                    }
                    Err(_) => errors += 1,
                }
            }
        }
        assert!(errors > 30_000, "{errors} errors, {parsed} parsed");
    }
}
