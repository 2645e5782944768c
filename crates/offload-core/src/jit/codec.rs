//! The byte encodings of the vocabulary ([`super`]): targets, steps, options, outputs, errors,
//! the request head the plugin ABI carries. Decoding is bounded: a corrupt message is an error
//! naming what was being read.

use super::*;
use crate::error::{Error, Result};
use wire::{Reader, Writer};

fn bad(r: &Reader<'_>, what: impl std::fmt::Display) -> Error {
    Error::System(format!("corrupt {}: {what}", r.what()))
}

impl JitTarget {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        w.str(&self.triple).str(&self.cpu).str(&self.features);
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        Ok(JitTarget {
            triple: r.str()?,
            cpu: r.str()?,
            features: r.str()?,
        })
    }
}

impl PostProcess {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        match self {
            PostProcess::Unchanged => {
                w.u8(0);
            }
            PostProcess::LinkHostSharedObject => {
                w.u8(1);
            }
            PostProcess::LinkAmdgpuCodeObject { gfx } => {
                w.u8(2).str(gfx);
            }
            PostProcess::Ptxas {
                path,
                version,
                arch,
            } => {
                w.u8(3).str(path).str(version).str(arch);
            }
        }
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        Ok(match r.u8()? {
            0 => PostProcess::Unchanged,
            1 => PostProcess::LinkHostSharedObject,
            2 => PostProcess::LinkAmdgpuCodeObject { gfx: r.str()? },
            3 => PostProcess::Ptxas {
                path: r.str()?,
                version: r.str()?,
                arch: r.str()?,
            },
            v => return Err(bad(r, format!("post-processing step {v}"))),
        })
    }
}

fn encode_named_file(w: &mut Writer, f: &Option<NamedFile>) {
    match f {
        None => {
            w.u8(0);
        }
        Some(f) => {
            w.u8(1).str(&f.variable).path(&f.path).bytes(&f.bytes);
        }
    }
}

fn decode_named_file(r: &mut Reader<'_>) -> Result<Option<NamedFile>> {
    Ok(if r.bool()? {
        Some(NamedFile {
            variable: r.str()?,
            path: r.path()?,
            bytes: r.bytes()?.to_vec(),
        })
    } else {
        None
    })
}

fn encode_output_path(w: &mut Writer, p: &Option<OutputPath>) {
    match p {
        None => {
            w.u8(0);
        }
        Some(p) => {
            w.u8(1).str(&p.variable).path(&p.path);
        }
    }
}

fn decode_output_path(r: &mut Reader<'_>) -> Result<Option<OutputPath>> {
    Ok(if r.bool()? {
        Some(OutputPath {
            variable: r.str()?,
            path: r.path()?,
        })
    } else {
        None
    })
}

impl JitOptions {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        w.u8(self.opt_level).u8(u8::from(self.skip_opt));
        encode_named_file(w, &self.replacement_module);
        encode_named_file(w, &self.replacement_object);
        encode_output_path(w, &self.pre_opt_ir);
        encode_output_path(w, &self.post_opt_ir);
        match &self.device_runtime_dir {
            None => {
                w.u8(0);
            }
            Some(d) => {
                w.u8(1).path(d);
            }
        }
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let opt_level = r.u8()?;
        if opt_level > 3 {
            return Err(bad(r, format!("optimisation level {opt_level}")));
        }
        Ok(JitOptions {
            opt_level,
            skip_opt: r.bool()?,
            replacement_module: decode_named_file(r)?,
            replacement_object: decode_named_file(r)?,
            pre_opt_ir: decode_output_path(r)?,
            post_opt_ir: decode_output_path(r)?,
            device_runtime_dir: if r.bool()? { Some(r.path()?) } else { None },
        })
    }
}

fn encode_param(w: &mut Writer, p: &ParamType) {
    match p {
        ParamType::I32 => {
            w.u8(0);
        }
        ParamType::I64 => {
            w.u8(1);
        }
        ParamType::F32 => {
            w.u8(2);
        }
        ParamType::F64 => {
            w.u8(3);
        }
        ParamType::Ptr => {
            w.u8(4);
        }
        ParamType::Other(t) => {
            w.u8(5).str(t);
        }
    }
}

fn decode_param(r: &mut Reader<'_>) -> Result<ParamType> {
    Ok(match r.u8()? {
        0 => ParamType::I32,
        1 => ParamType::I64,
        2 => ParamType::F32,
        3 => ParamType::F64,
        4 => ParamType::Ptr,
        5 => ParamType::Other(r.str()?),
        v => return Err(bad(r, format!("parameter type {v}"))),
    })
}

impl CompileOutput {
    /// Appends the encoding.
    pub fn encode(&self, w: &mut Writer) {
        encode_signatures(w, &self.signatures);
        w.bytes(&self.bytes);
    }
    /// Reads the encoding.
    pub fn decode(r: &mut Reader<'_>) -> Result<Self> {
        let signatures = decode_signatures(r)?;
        Ok(CompileOutput {
            signatures,
            bytes: r.bytes()?.to_vec(),
        })
    }
}

/// Appends kernel signatures.
pub fn encode_signatures(w: &mut Writer, sigs: &[KernelSignature]) {
    w.u64(sigs.len() as u64);
    for s in sigs {
        w.str(&s.name).u64(s.params.len() as u64);
        for p in &s.params {
            encode_param(w, p);
        }
    }
}

/// Reads kernel signatures; counts are bounded by what is left to read.
pub fn decode_signatures(r: &mut Reader<'_>) -> Result<Vec<KernelSignature>> {
    let n = r.u64()?;
    let mut sigs = Vec::new();
    for _ in 0..n {
        let name = r.str()?;
        let count = r.u64()?;
        let mut params = Vec::new();
        for _ in 0..count {
            params.push(decode_param(r)?);
        }
        sigs.push(KernelSignature { name, params });
    }
    Ok(sigs)
}

/// Appends an error as `(kind, native code, message)`.
pub fn encode_error(w: &mut Writer, e: &Error) {
    w.u32(e.kind() as u32)
        .u64(e.native_code() as u64)
        .str(e.message());
}

/// Reads an error written by [`encode_error`].
pub fn decode_error(r: &mut Reader<'_>) -> Result<Error> {
    let kind = r.u32()?;
    let code = r.u64()? as i64;
    Ok(Error::from_parts(kind, code, r.str()?))
}

impl Served {
    /// Wire code.
    pub fn to_u8(self) -> u8 {
        match self {
            Served::MemoryHit => 0,
            Served::SharedCompile => 1,
            Served::Compiled => 2,
            Served::DiskHit => 3,
            Served::RemoteHit => 4,
        }
    }
    /// From the wire code.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Served::MemoryHit,
            1 => Served::SharedCompile,
            2 => Served::Compiled,
            3 => Served::DiskHit,
            4 => Served::RemoteHit,
            _ => return None,
        })
    }
}

/// The part of a [`CompileRequest`] besides the image, as the plugin ABI carries it.
pub fn encode_request_head(target: &JitTarget, post: &PostProcess) -> Vec<u8> {
    let mut w = Writer::default();
    target.encode(&mut w);
    post.encode(&mut w);
    w.0
}

/// Inverse of [`encode_request_head`].
pub fn decode_request_head(bytes: &[u8]) -> Result<(JitTarget, PostProcess)> {
    let mut r = Reader::new(bytes, "JIT request");
    let target = JitTarget::decode(&mut r)?;
    let post = PostProcess::decode(&mut r)?;
    r.finish()?;
    Ok((target, post))
}

/// A [`JitOutput`] as the plugin ABI carries it back.
pub fn encode_output(out: &JitOutput) -> Vec<u8> {
    let mut w = Writer::default();
    w.u8(out.served.to_u8())
        .bytes(&out.image.key.0)
        .u64(out.image.compile_time.as_nanos() as u64);
    encode_signatures(&mut w, &out.image.signatures);
    w.bytes(&out.image.bytes);
    w.0
}

/// Inverse of [`encode_output`].
pub fn decode_output(bytes: &[u8]) -> Result<JitOutput> {
    let mut r = Reader::new(bytes, "JIT result");
    let served = r.u8()?;
    let served = Served::from_u8(served).ok_or_else(|| bad(&r, format!("served code {served}")))?;
    let key: [u8; 32] = r
        .bytes()?
        .try_into()
        .map_err(|_| Error::System("corrupt JIT result: key is not 32 bytes".into()))?;
    let compile_time = Duration::from_nanos(r.u64()?);
    let signatures = decode_signatures(&mut r)?;
    let image = r.bytes()?.to_vec();
    r.finish()?;
    Ok(JitOutput {
        image: Arc::new(CompiledImage {
            key: CacheKey(key),
            bytes: image,
            signatures,
            compile_time,
        }),
        served,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_round_trip_and_every_truncation_is_an_error() {
        let out = JitOutput {
            image: Arc::new(CompiledImage {
                key: CacheKey([7; 32]),
                bytes: b"image".to_vec(),
                signatures: vec![KernelSignature {
                    name: "k".into(),
                    params: vec![
                        ParamType::I32,
                        ParamType::Other("i16".into()),
                        ParamType::Ptr,
                    ],
                }],
                compile_time: Duration::from_micros(5),
            }),
            served: Served::SharedCompile,
        };
        let bytes = encode_output(&out);
        let back = decode_output(&bytes).unwrap();
        assert_eq!(back.served, Served::SharedCompile);
        assert_eq!(back.image.bytes, b"image");
        assert_eq!(back.image.signatures, out.image.signatures);
        assert_eq!(back.image.key, CacheKey([7; 32]));
        for len in 0..bytes.len() {
            let e = decode_output(&bytes[..len]).unwrap_err();
            assert!(e.to_string().contains("corrupt JIT result"), "{e}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_output(&longer).is_err());
    }

    #[test]
    fn options_and_requests_round_trip() {
        let options = JitOptions {
            opt_level: 1,
            skip_opt: true,
            replacement_module: Some(NamedFile {
                variable: "V".into(),
                path: "/a b/m.bc".into(),
                bytes: vec![1, 2],
            }),
            replacement_object: None,
            pre_opt_ir: Some(OutputPath {
                variable: "P".into(),
                path: "x.ll".into(),
            }),
            post_opt_ir: None,
            device_runtime_dir: Some("/usr/lib/llvm-19/lib".into()),
        };
        let mut w = Writer::default();
        options.encode(&mut w);
        let mut r = Reader::new(&w.0, "options");
        assert_eq!(JitOptions::decode(&mut r).unwrap(), options);
        r.finish().unwrap();
        let target = JitTarget {
            triple: "amdgcn-amd-amdhsa".into(),
            cpu: "gfx90a".into(),
            features: "+xnack".into(),
        };
        let post = PostProcess::LinkAmdgpuCodeObject {
            gfx: "gfx90a".into(),
        };
        let head = encode_request_head(&target, &post);
        assert_eq!(decode_request_head(&head).unwrap(), (target, post));
    }
}
