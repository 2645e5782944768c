//! A bounded MessagePack reader, for the AMDGPU metadata note. Every length is checked against
//! the bytes that remain, nesting is limited, and every malformed byte is an error naming its
//! offset: the note comes from the image, which may be anything.

/// A MessagePack value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// nil
    Nil,
    /// true / false
    Bool(bool),
    /// Any integer that fits (positive or negative).
    Int(i128),
    /// float32 / float64
    Float(f64),
    /// str (lossily decoded UTF-8)
    Str(String),
    /// bin / ext payload
    Bytes(Vec<u8>),
    /// array
    Array(Vec<Value>),
    /// map, in order
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// The value under string key `key` of a map.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries
                .iter()
                .find(|(k, _)| matches!(k, Value::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// As a non-negative integer that fits in `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            _ => None,
        }
    }

    /// As a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// As an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// Deepest nesting accepted.
const MAX_DEPTH: usize = 32;

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Values still allowed (bounds the work for hostile counts).
    budget: usize,
}

fn err(at: usize, what: impl std::fmt::Display) -> String {
    format!("MessagePack byte {at}: {what}")
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.bytes.len())
            .ok_or_else(|| {
                err(
                    self.at,
                    format!("{n} bytes wanted, {} remain", self.bytes.len() - self.at),
                )
            })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn uint(&mut self, n: usize) -> Result<u64, String> {
        let b = self.take(n)?;
        Ok(b.iter().fold(0u64, |acc, x| acc << 8 | u64::from(*x)))
    }

    fn len(&mut self, n: usize, start: usize) -> Result<usize, String> {
        let len = self.uint(n)?;
        // Every element takes at least one byte: a longer count cannot be honest.
        if len > (self.bytes.len() - self.at) as u64 {
            return Err(err(
                start,
                format!(
                    "length {len} is more than the {} bytes that remain",
                    self.bytes.len() - self.at
                ),
            ));
        }
        Ok(len as usize)
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(err(self.at, format!("nested deeper than {MAX_DEPTH}")));
        }
        self.budget = self
            .budget
            .checked_sub(1)
            .ok_or_else(|| err(self.at, "too many values"))?;
        let start = self.at;
        let tag = self.take(1)?[0];
        Ok(match tag {
            0x00..=0x7f => Value::Int(i128::from(tag)),
            0x80..=0x8f => self.map(usize::from(tag & 0x0f), depth)?,
            0x90..=0x9f => self.array(usize::from(tag & 0x0f), depth)?,
            0xa0..=0xbf => self.str(usize::from(tag & 0x1f))?,
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let n = self.len(1 << (tag - 0xc4), start)?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            0xc7..=0xc9 => {
                let n = self.len(1 << (tag - 0xc7), start)?;
                self.take(1)?;
                Value::Bytes(self.take(n)?.to_vec())
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.uint(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.uint(8)?)),
            0xcc..=0xcf => Value::Int(i128::from(self.uint(1 << (tag - 0xcc))?)),
            0xd0..=0xd3 => {
                let n = 1usize << (tag - 0xd0);
                let raw = self.uint(n)?;
                let shift = 64 - 8 * n as u32;
                Value::Int(i128::from(((raw << shift) as i64) >> shift))
            }
            0xd4..=0xd8 => {
                self.take(1)?;
                Value::Bytes(self.take(1 << (tag - 0xd4))?.to_vec())
            }
            0xd9..=0xdb => {
                let n = self.len(1 << (tag - 0xd9), start)?;
                self.str(n)?
            }
            0xdc | 0xdd => {
                let n = self.len(2 << (tag - 0xdc), start)?;
                self.array(n, depth)?
            }
            0xde | 0xdf => {
                let n = self.len(2 << (tag - 0xde), start)?;
                self.map(n, depth)?
            }
            0xe0..=0xff => Value::Int(i128::from(tag as i8)),
            0xc1 => return Err(err(start, "0xc1 is not a MessagePack type")),
        })
    }

    fn str(&mut self, n: usize) -> Result<Value, String> {
        Ok(Value::Str(
            String::from_utf8_lossy(self.take(n)?).into_owned(),
        ))
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<Value, String> {
        let mut out = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            out.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(out))
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<Value, String> {
        let mut out = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let k = self.value(depth + 1)?;
            let v = self.value(depth + 1)?;
            out.push((k, v));
        }
        Ok(Value::Map(out))
    }
}

/// Reads one value from the start of `bytes` (trailing bytes are allowed: notes are padded).
pub fn parse(bytes: &[u8]) -> Result<Value, String> {
    let mut r = Reader {
        bytes,
        at: 0,
        budget: 1 << 20,
    };
    r.value(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_and_malformed_input_is_an_error_not_a_panic() {
        // {"a": [1, -2, "x", true, nil, 300, 1.5]}
        let bytes = [
            0x81, 0xa1, b'a', 0x97, 0x01, 0xfe, 0xa1, b'x', 0xc3, 0xc0, 0xcd, 0x01, 0x2c, 0xcb,
            0x3f, 0xf8, 0, 0, 0, 0, 0, 0,
        ];
        let v = parse(&bytes).unwrap();
        let a = v.get("a").unwrap().as_array().unwrap();
        assert_eq!(a[0], Value::Int(1));
        assert_eq!(a[1], Value::Int(-2));
        assert_eq!(a[2].as_str(), Some("x"));
        assert_eq!(a[3], Value::Bool(true));
        assert_eq!(a[4], Value::Nil);
        assert_eq!(a[5].as_u64(), Some(300));
        assert_eq!(a[6], Value::Float(1.5));
        for len in 0..bytes.len() - 1 {
            assert!(parse(&bytes[..len]).is_err(), "truncated at {len}");
        }
        // A count far larger than the input, and deep nesting, are errors.
        assert!(
            parse(&[0xdd, 0xff, 0xff, 0xff, 0xff])
                .unwrap_err()
                .contains("length")
        );
        assert!(parse(&[0x91; 100]).unwrap_err().contains("nested"));
        assert!(parse(&[0xc1]).is_err());
        // Every byte flip: an answer, never a panic.
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut m = bytes;
                m[i] ^= 1 << bit;
                let _ = parse(&m);
            }
        }
    }
}
