//! The entry file format: magic, schema, key, payload length, payload (the label, the
//! compiled bytes, the kernel signatures), and a BLAKE3 trailer over all of it. Decoding
//! checks every field against the key it was looked up by.

use super::*;

/// The digest that ends an entry (BLAKE3 of everything before it).
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    *blake3::hash(bytes).as_bytes()
}

/// Encodes an entry.
pub fn encode_entry(key: &CacheKey, label: &str, out: &CompileOutput) -> Vec<u8> {
    let mut payload = Writer::default();
    payload.str(label).bytes(&out.bytes);
    encode_signatures(&mut payload, &out.signatures);
    let payload = payload.0;
    let mut e = Vec::with_capacity(HEADER + payload.len() + TRAILER);
    e.extend_from_slice(MAGIC);
    e.extend_from_slice(&SCHEMA.to_le_bytes());
    e.extend_from_slice(&key.0);
    e.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    e.extend_from_slice(&payload);
    let d = digest(&e);
    e.extend_from_slice(&d);
    e
}

/// Decodes an entry that must hold `key`; the error says what is wrong with it.
pub fn decode_entry(
    key: &CacheKey,
    bytes: &[u8],
) -> std::result::Result<(String, CompileOutput), String> {
    let len = bytes.len();
    if len < HEADER + TRAILER {
        return Err(format!(
            "truncated: {len} bytes, an entry has at least {}",
            HEADER + TRAILER
        ));
    }
    if bytes[..8] != *MAGIC {
        return Err(format!(
            "not an offload JIT cache entry (first bytes {:02x?})",
            &bytes[..8]
        ));
    }
    let schema = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if schema != SCHEMA {
        return Err(format!(
            "written with entry schema {schema}; this build reads schema {SCHEMA}"
        ));
    }
    if bytes[12..44] != key.0 {
        let other = CacheKey(bytes[12..44].try_into().expect("32 bytes"));
        return Err(format!(
            "holds key {} instead of {} (a renamed or misplaced file)",
            other.short(),
            key.short()
        ));
    }
    let payload_len = u64::from_le_bytes(bytes[44..52].try_into().expect("8 bytes"));
    let expected = (HEADER as u64)
        .checked_add(payload_len)
        .and_then(|n| n.checked_add(TRAILER as u64));
    if expected != Some(len as u64) {
        return Err(format!(
            "its length field says {payload_len} payload bytes but the file has {} \
             (truncated or extended)",
            len - HEADER - TRAILER
        ));
    }
    let body = &bytes[..len - TRAILER];
    if digest(body)[..] != bytes[len - TRAILER..] {
        return Err("its digest does not match its contents (corrupted)".into());
    }
    let mut r = Reader::new(&body[HEADER..], "JIT cache entry");
    let decoded = (|| {
        let label = r.str()?;
        let image = r.bytes()?.to_vec();
        let signatures = decode_signatures(&mut r)?;
        Ok::<_, offload_core::Error>((label, image, signatures))
    })();
    let (label, image, signatures) = decoded.map_err(|e| e.to_string())?;
    r.finish().map_err(|e| e.to_string())?;
    Ok((
        label,
        CompileOutput {
            bytes: image,
            signatures,
        },
    ))
}
