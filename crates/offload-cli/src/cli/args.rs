//! Parsing of the `offload run` argument grammar: devices, dimensions and `--arg` specs.

use offload::{KernelArg, ScalarType};
use std::path::PathBuf;

/// `PLUGIN:INDEX`, or a remote device's address `mpi:RANK/PLUGIN:INDEX`; the spec as it is,
/// for `Runtime::device_by_spec`.
pub fn parse_device(s: &str) -> Result<String, String> {
    let (name, rest) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not PLUGIN:INDEX (e.g. host:0)"))?;
    if name.is_empty() {
        return Err(format!("'{s}' has an empty plugin name"));
    }
    let index = |i: &str| i.parse::<usize>().is_ok();
    let address = rest.split_once('/').is_some_and(|(rank, device)| {
        index(rank)
            && device
                .rsplit_once(':')
                .is_some_and(|(plugin, i)| !plugin.is_empty() && index(i))
    });
    if !index(rest) && !address {
        return Err(format!(
            "'{s}': device index '{rest}' is not a non-negative integer (or a remote device's \
             address, RANK/PLUGIN:INDEX as in mpi:1/host:0)"
        ));
    }
    Ok(s.to_string())
}

/// `X[,Y[,Z]]`, each at least 1.
pub fn parse_dims(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(format!("'{s}' is not X[,Y[,Z]]"));
    }
    let mut dims = [1u32; 3];
    for (i, p) in parts.iter().enumerate() {
        dims[i] = p
            .trim()
            .parse()
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("'{s}': '{p}' is not an integer from 1 to {}", u32::MAX))?;
    }
    Ok(dims)
}

/// How a buffer argument is initialised.
#[derive(Debug, Clone, PartialEq)]
pub enum BufferInit {
    /// All zero bytes.
    Zero,
    /// Every element equal to this (already encoded) element.
    Fill(Vec<u8>),
    /// 0, 1, 2, ... converted to the element type.
    Iota,
    /// Raw little-endian elements read from a file of exactly LEN elements.
    File(PathBuf),
}

/// One `--arg`.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgSpec {
    /// A scalar passed by value.
    Scalar(KernelArg),
    /// A device buffer passed by pointer and copied back after the launch.
    Buffer {
        /// Element type.
        ty: ScalarType,
        /// Number of elements.
        len: usize,
        /// Initial contents.
        init: BufferInit,
    },
}

/// Encodes one value of `ty` from text, little-endian.
pub fn encode_value(ty: ScalarType, v: &str) -> Result<Vec<u8>, String> {
    let bad = || format!("'{v}' is not a valid {} value", ty.name());
    let v = v.trim();
    Ok(match ty {
        ScalarType::I32 => v.parse::<i32>().map_err(|_| bad())?.to_le_bytes().to_vec(),
        ScalarType::U32 => v.parse::<u32>().map_err(|_| bad())?.to_le_bytes().to_vec(),
        ScalarType::I64 => v.parse::<i64>().map_err(|_| bad())?.to_le_bytes().to_vec(),
        ScalarType::U64 => v.parse::<u64>().map_err(|_| bad())?.to_le_bytes().to_vec(),
        ScalarType::F32 => v.parse::<f32>().map_err(|_| bad())?.to_le_bytes().to_vec(),
        ScalarType::F64 => v.parse::<f64>().map_err(|_| bad())?.to_le_bytes().to_vec(),
    })
}

fn scalar(ty: ScalarType, v: &str) -> Result<KernelArg, String> {
    let b = encode_value(ty, v)?;
    Ok(match ty {
        ScalarType::I32 => KernelArg::I32(i32::from_le_bytes(b[..4].try_into().unwrap())),
        ScalarType::U32 => KernelArg::U32(u32::from_le_bytes(b[..4].try_into().unwrap())),
        ScalarType::I64 => KernelArg::I64(i64::from_le_bytes(b[..8].try_into().unwrap())),
        ScalarType::U64 => KernelArg::U64(u64::from_le_bytes(b[..8].try_into().unwrap())),
        ScalarType::F32 => KernelArg::F32(f32::from_le_bytes(b[..4].try_into().unwrap())),
        ScalarType::F64 => KernelArg::F64(f64::from_le_bytes(b[..8].try_into().unwrap())),
    })
}

const TYPES: &str = "i32, u32, i64, u64, f32, f64";

/// `TYPE:V` or `buf:TYPE:LEN[:INIT]`.
/// `--timeout SECONDS`: a positive number of seconds (decimals allowed), at most a week.
pub fn parse_timeout(s: &str) -> Result<std::time::Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 7.0 * 86400.0 => Ok(std::time::Duration::from_secs_f64(v)),
        _ => Err(format!(
            "'{s}' is not a number of seconds greater than 0 (and at most 604800)"
        )),
    }
}

pub fn parse_arg_spec(s: &str) -> Result<ArgSpec, String> {
    let (head, rest) = s
        .split_once(':')
        .ok_or_else(|| format!("'{s}' is not TYPE:VALUE or buf:TYPE:LEN[:INIT]"))?;
    if head != "buf" {
        let ty = ScalarType::parse(head)
            .ok_or_else(|| format!("'{s}': unknown type '{head}' (expected {TYPES} or buf)"))?;
        return scalar(ty, rest)
            .map(ArgSpec::Scalar)
            .map_err(|e| format!("'{s}': {e}"));
    }
    let mut parts = rest.splitn(3, ':');
    let ty_text = parts.next().unwrap_or("");
    let ty = ScalarType::parse(ty_text).ok_or_else(|| {
        format!("'{s}': unknown buffer element type '{ty_text}' (expected {TYPES})")
    })?;
    let len_text = parts
        .next()
        .ok_or_else(|| format!("'{s}': missing buffer length (buf:TYPE:LEN[:INIT])"))?;
    let len: usize =
        len_text.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            format!("'{s}': buffer length '{len_text}' is not a positive integer")
        })?;
    len.checked_mul(ty.size())
        .ok_or_else(|| format!("'{s}': buffer of {len} elements is too large"))?;
    let init = match parts.next() {
        None | Some("zero") => BufferInit::Zero,
        Some("iota") => BufferInit::Iota,
        Some(i) if i.starts_with("fill=") => BufferInit::Fill(
            encode_value(ty, &i["fill=".len()..]).map_err(|e| format!("'{s}': fill {e}"))?,
        ),
        Some(i) if i.starts_with("file=") && i.len() > "file=".len() => {
            BufferInit::File(PathBuf::from(&i["file=".len()..]))
        }
        Some(i) => {
            return Err(format!(
                "'{s}': unknown buffer initialiser '{i}' (expected zero, fill=V, iota or file=PATH)"
            ));
        }
    };
    Ok(ArgSpec::Buffer { ty, len, init })
}

/// The initial bytes of a buffer argument; `index` names the argument in errors.
pub fn initial_bytes(
    ty: ScalarType,
    len: usize,
    init: &BufferInit,
    index: usize,
) -> Result<Vec<u8>, String> {
    let size = ty.size();
    let bytes = len.checked_mul(size).ok_or_else(|| {
        format!(
            "--arg {index}: a buffer of {len} {} elements is too large",
            ty.name()
        )
    })?;
    let what = format!("--arg {index} ({len} x {})", ty.name());
    let zeroed = || offload_core::fs::try_zeroed(bytes, &what).map_err(|e| e.to_string());
    Ok(match init {
        BufferInit::Zero => zeroed()?,
        BufferInit::Fill(e) => {
            let mut out = zeroed()?;
            for chunk in out.chunks_exact_mut(size) {
                chunk.copy_from_slice(e);
            }
            out
        }
        BufferInit::Iota => {
            let mut out = zeroed()?;
            out.clear();
            for i in 0..len {
                match ty {
                    ScalarType::I32 => out.extend_from_slice(&(i as i32).to_le_bytes()),
                    ScalarType::U32 => out.extend_from_slice(&(i as u32).to_le_bytes()),
                    ScalarType::I64 => out.extend_from_slice(&(i as i64).to_le_bytes()),
                    ScalarType::U64 => out.extend_from_slice(&(i as u64).to_le_bytes()),
                    ScalarType::F32 => out.extend_from_slice(&(i as f32).to_le_bytes()),
                    ScalarType::F64 => out.extend_from_slice(&(i as f64).to_le_bytes()),
                }
            }
            out
        }
        BufferInit::File(path) => {
            let bytes = offload_core::fs::read_regular(path, &format!("--arg {index} file="))
                .map_err(|e| match e {
                    offload::Error::InvalidArgument(m) => m,
                    other => other.to_string(),
                })?;
            if bytes.len() != len * size {
                return Err(format!(
                    "--arg {index}: '{}' has {} bytes, expected exactly {} ({len} x {})",
                    path.display(),
                    bytes.len(),
                    len * size,
                    ty.name()
                ));
            }
            bytes
        }
    })
}

/// Element `i` of a little-endian buffer as JSON.
pub fn element_json(ty: ScalarType, bytes: &[u8], i: usize) -> serde_json::Value {
    let s = ty.size();
    let b = &bytes[i * s..(i + 1) * s];
    match ty {
        ScalarType::I32 => i32::from_le_bytes(b.try_into().unwrap()).into(),
        ScalarType::U32 => u32::from_le_bytes(b.try_into().unwrap()).into(),
        ScalarType::I64 => i64::from_le_bytes(b.try_into().unwrap()).into(),
        ScalarType::U64 => u64::from_le_bytes(b.try_into().unwrap()).into(),
        ScalarType::F32 => f64::from(f32::from_le_bytes(b.try_into().unwrap())).into(),
        ScalarType::F64 => f64::from_le_bytes(b.try_into().unwrap()).into(),
    }
}

/// Element `i` as text (floats in their shortest exact form).
pub fn element_text(ty: ScalarType, bytes: &[u8], i: usize) -> String {
    let s = ty.size();
    let b = &bytes[i * s..(i + 1) * s];
    match ty {
        ScalarType::F32 => format!("{}", f32::from_le_bytes(b.try_into().unwrap())),
        ScalarType::F64 => format!("{}", f64::from_le_bytes(b.try_into().unwrap())),
        _ => element_json(ty, bytes, i).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse() {
        assert_eq!(
            parse_arg_spec("i32:-5").unwrap(),
            ArgSpec::Scalar(KernelArg::I32(-5))
        );
        assert_eq!(
            parse_arg_spec("f64:2.5").unwrap(),
            ArgSpec::Scalar(KernelArg::F64(2.5))
        );
        assert_eq!(
            parse_arg_spec("buf:f32:10").unwrap(),
            ArgSpec::Buffer {
                ty: ScalarType::F32,
                len: 10,
                init: BufferInit::Zero
            }
        );
        assert_eq!(
            parse_arg_spec("buf:u32:3:fill=7").unwrap(),
            ArgSpec::Buffer {
                ty: ScalarType::U32,
                len: 3,
                init: BufferInit::Fill(7u32.to_le_bytes().to_vec())
            }
        );
        assert_eq!(
            parse_arg_spec("buf:f64:2:file=/tmp/a:b c").unwrap(),
            ArgSpec::Buffer {
                ty: ScalarType::F64,
                len: 2,
                init: BufferInit::File("/tmp/a:b c".into())
            }
        );
        for bad in [
            "i32",
            "i8:1",
            "i32:x",
            "u32:-1",
            "buf:f16:3",
            "buf:f32",
            "buf:f32:0",
            "buf:f32:3:ones",
            "buf:i32:2:fill=1.5",
        ] {
            assert!(parse_arg_spec(bad).is_err(), "{bad} should be rejected");
        }
    }

    #[test]
    fn dims_and_devices_parse() {
        assert_eq!(parse_dims("4").unwrap(), [4, 1, 1]);
        assert_eq!(parse_dims("4,5,6").unwrap(), [4, 5, 6]);
        assert!(parse_dims("0").is_err());
        assert!(parse_dims("1,2,3,4").is_err());
        assert_eq!(parse_device("host:2").unwrap(), "host:2");
        assert_eq!(parse_device("mpi:1/host:0").unwrap(), "mpi:1/host:0");
        for bad in [
            "host",
            "host:-1",
            ":1",
            "mpi:1/host",
            "mpi:x/host:0",
            "mpi:1/:0",
        ] {
            assert!(parse_device(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn iota_and_files_initialise() {
        let b = initial_bytes(ScalarType::F32, 3, &BufferInit::Iota, 0).unwrap();
        assert_eq!(
            b,
            [0f32, 1.0, 2.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>()
        );
        let path = std::env::temp_dir().join(format!("offload-args-{}.bin", std::process::id()));
        std::fs::write(&path, [1u8; 12]).unwrap();
        let e = initial_bytes(ScalarType::U32, 4, &BufferInit::File(path.clone()), 3).unwrap_err();
        assert!(e.contains("12 bytes, expected exactly 16"), "{e}");
        assert_eq!(
            initial_bytes(ScalarType::U32, 3, &BufferInit::File(path.clone()), 3)
                .unwrap()
                .len(),
            12
        );
        std::fs::remove_file(path).unwrap();
    }
}
