//! The one reader of environment variables for every offload crate.
//!
//! Unlike upstream's silent fallbacks, a variable that is set to a bad value is an error that
//! names the variable, its value and what was expected. Variables may have aliases (the
//! `LIBOMPTARGET_*` names); the first one set wins.

use crate::error::{Error, Result};
use std::str::FromStr;

/// Reads the first of `names` that is set. `None` when none is set (or set to the empty
/// string); an error when the value is not Unicode.
pub fn raw(names: &[&str]) -> Result<Option<(String, String)>> {
    for &name in names {
        match std::env::var(name) {
            Ok(v) if v.is_empty() => continue,
            Ok(v) => return Ok(Some((name.to_string(), v))),
            Err(std::env::VarError::NotPresent) => continue,
            Err(std::env::VarError::NotUnicode(v)) => {
                return Err(Error::InvalidArgument(format!(
                    "environment variable {name}={v:?} is not valid Unicode"
                )));
            }
        }
    }
    Ok(None)
}

/// Reads a variable that holds a path or a path list, which need not be Unicode (`PATH`,
/// `CUDA_HOME`, cargo's `OUT_DIR`): its bytes as they are, `None` when unset or empty.
pub fn os(name: &str) -> Option<std::ffi::OsString> {
    std::env::var_os(name).filter(|v| !v.is_empty())
}

/// Reads and parses an integer-like variable that must satisfy `valid`; `expected` describes
/// the accepted values for the error message.
pub fn parsed<T: FromStr>(
    names: &[&str],
    valid: impl Fn(&T) -> bool,
    expected: &str,
) -> Result<Option<T>> {
    let Some((name, value)) = raw(names)? else {
        return Ok(None);
    };
    match value.trim().parse::<T>() {
        Ok(v) if valid(&v) => Ok(Some(v)),
        _ => Err(Error::InvalidArgument(format!(
            "environment variable {name}='{value}' is not valid: expected {expected}"
        ))),
    }
}

/// A `u32` in `min..=max`, or `default` when unset.
pub fn u32_in_range(names: &[&str], min: u32, max: u32, default: u32) -> Result<u32> {
    Ok(parsed::<u32>(
        names,
        |v| (min..=max).contains(v),
        &format!("an integer from {min} to {max}"),
    )?
    .unwrap_or(default))
}

/// Parses a size: an integer number of bytes with an optional binary suffix `K`, `M`, `G` or
/// `T` (`KiB`/`KB` spellings too, any case). `None` when the text is not a size.
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = t[..digits].parse().ok()?;
    let unit = t[digits..].trim().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// A size variable (see [`parse_size`]) in `min..=max`; `Ok(None)` when unset.
pub fn size_in_range(names: &[&str], min: u64, max: u64) -> Result<Option<u64>> {
    let Some((name, value)) = raw(names)? else {
        return Ok(None);
    };
    match parse_size(&value) {
        Some(v) if (min..=max).contains(&v) => Ok(Some(v)),
        _ => Err(Error::InvalidArgument(format!(
            "environment variable {name}='{value}' is not valid: expected a size from {min} to {max} bytes \
             (a number with an optional K, M, G or T suffix)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size(" 2 GiB "), Some(2 << 30));
        assert_eq!(parse_size("1t"), Some(1 << 40));
        for bad in ["", "G", "1.5G", "-1", "12Q", "99999999999999999999"] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(parse_size("17179869184T"), None);
    }

    use super::*;

    #[test]
    fn bad_values_name_the_variable() {
        // A unique name per test, so parallel tests do not interfere.
        let name = "OFFLOAD_CORE_ENV_TEST_BAD";
        // SAFETY: the variable is unique to this test; no other thread reads it.
        unsafe { std::env::set_var(name, "many") };
        let e = u32_in_range(&[name], 1, 8, 2).unwrap_err().to_string();
        assert!(e.contains("OFFLOAD_CORE_ENV_TEST_BAD='many'"), "{e}");
        assert!(e.contains("from 1 to 8"), "{e}");
        // SAFETY: as above.
        unsafe { std::env::set_var(name, "9") };
        assert!(u32_in_range(&[name], 1, 8, 2).is_err());
        // SAFETY: as above.
        unsafe { std::env::set_var(name, " 3 ") };
        assert_eq!(u32_in_range(&[name], 1, 8, 2).unwrap(), 3);
        // SAFETY: as above.
        unsafe { std::env::remove_var(name) };
        assert_eq!(u32_in_range(&[name], 1, 8, 2).unwrap(), 2);
    }

    #[test]
    fn first_set_alias_wins() {
        let (a, b) = ("OFFLOAD_CORE_ENV_TEST_A", "OFFLOAD_CORE_ENV_TEST_B");
        // SAFETY: unique variables for this test.
        unsafe { std::env::set_var(b, "5") };
        assert_eq!(
            raw(&[a, b]).unwrap(),
            Some((b.to_string(), "5".to_string()))
        );
        // SAFETY: as above.
        unsafe { std::env::set_var(a, "4") };
        assert_eq!(raw(&[a, b]).unwrap().unwrap().1, "4");
    }
}
