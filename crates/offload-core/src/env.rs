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

#[cfg(test)]
mod tests {
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
