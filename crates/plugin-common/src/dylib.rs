//! Driver libraries loaded at run time (decision 3): the CUDA driver, the HSA runtime, and
//! every backend after them.
//!
//! A machine without the driver builds every crate and reports no device for that backend,
//! with the reason. So a backend never links its driver: it opens it at first need from a
//! list of candidates ([`candidates`]: the file a variable names, else the names drivers
//! install), keeps it open for the life of the process, and resolves each entry point on its
//! first call. A missing entry point (a driver older than the backend needs) is an error of
//! that one call, naming it, never a failure to load and never a panic.
//!
//! [`driver_entry_points!`](crate::driver_entry_points) writes the typed methods: one per entry
//! point, `unsafe` with the driver's contract, returning `Result` (a status through the
//! backend's one `check` function, or a plain value).

use offload_core::{Error, Result};
use std::ffi::{CStr, c_char, c_int};
use std::sync::OnceLock;

/// The candidates to open: the file `variable` names (an error naming the variable if it names
/// no file: a wrong setting must not fall back silently), else `names`, in order.
pub fn candidates(variable: &str, names: &[String]) -> Result<Vec<String>> {
    match offload_core::env::raw(&[variable])? {
        Some((name, value)) => {
            if !std::path::Path::new(&value).is_file() {
                return Err(Error::InvalidArgument(format!(
                    "environment variable {name}='{value}': no such file"
                )));
            }
            Ok(vec![value])
        }
        None => Ok(names.to_vec()),
    }
}

/// What starting one candidate library came to, as the backend's start function tells it.
#[derive(Debug)]
pub enum Start<T> {
    /// The driver, started.
    Ready(T),
    /// Not the driver (the toolkit's stub, a library without the entry point): the next
    /// candidate is tried; why, for the reason given if none is usable.
    PassOver(String),
    /// The driver, which found no device or failed to start: no device, and why. No later
    /// candidate is tried.
    Absent(String),
}

/// Opens a driver: each candidate of `variable`/`names` ([`candidates`]) in order, started by
/// `start`, until one is [`Start::Ready`] (returned) or [`Start::Absent`] (no device). A
/// candidate that does not open or is passed over leads to the next; when none is left the
/// error says what was tried, what was passed over and why, the dynamic loader's last message,
/// and `install` (how to get the driver). Every "no driver" outcome is [`Error::NoDevice`] with
/// the reason in plain words; a bad `variable` is an error naming it.
///
/// # Safety
/// As [`DriverLibrary::open`], for each of `names` and the file `variable` names: the caller
/// trusts them as the driver it names (a backend passes its driver's own library names; the
/// variable is the user's, trusted as the dynamic loader's search path is).
pub unsafe fn open_driver<T>(
    variable: &str,
    names: &[String],
    what: &'static str,
    install: &str,
    mut start: impl FnMut(&str, DriverLibrary) -> Start<T>,
) -> Result<T> {
    let candidates = candidates(variable, names)?;
    let mut passed_over: Vec<String> = Vec::new();
    let mut loader_error = String::new();
    for c in &candidates {
        // SAFETY: this function's contract, for each candidate.
        let lib = match unsafe { DriverLibrary::open(c, what) } {
            Ok(lib) => lib,
            Err(e) => {
                loader_error = e;
                continue;
            }
        };
        match start(c, lib) {
            Start::Ready(t) => return Ok(t),
            Start::PassOver(why) => passed_over.push(why),
            Start::Absent(why) if passed_over.is_empty() => return Err(Error::NoDevice(why)),
            Start::Absent(why) => {
                return Err(Error::NoDevice(format!(
                    "{why} (passed over before it: {})",
                    passed_over.join("; ")
                )));
            }
        }
    }
    let mut why = format!("{what} was not found (tried {}", candidates.join(", "));
    if !passed_over.is_empty() {
        why += &format!("; passed over: {}", passed_over.join("; "));
    }
    if !loader_error.is_empty() {
        why += &format!("; last loader error: {loader_error}");
    }
    why += &format!("): {install}, or set {variable}");
    Err(Error::NoDevice(why))
}

/// An opened driver library. Never closed (unloading a driver with threads and thread-local
/// destructors of its own crashes).
pub struct DriverLibrary {
    /// Never dropped: dropping would `dlclose` it (and a loader would unload its drivers).
    lib: std::mem::ManuallyDrop<libloading::Library>,
    path: String,
    /// What it is, for messages (`the CUDA driver`).
    what: &'static str,
}

impl std::fmt::Debug for DriverLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} '{}'", self.what, self.path)
    }
}

impl DriverLibrary {
    /// Opens `path` (a file name the dynamic loader searches for, or a path); the loader's
    /// message when it cannot.
    ///
    /// # Safety
    /// Opening the library runs its initialisers in this process, and the entry points it
    /// resolves are called with the driver's C signatures: the caller trusts the file as the
    /// driver it names (`what`), as the dynamic loader trusts what `LD_LIBRARY_PATH` finds.
    pub unsafe fn open(path: &str, what: &'static str) -> std::result::Result<Self, String> {
        // SAFETY: opening a driver runs its initialisers, which is what using the driver
        // means (this function's contract); it is never closed.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
        Ok(DriverLibrary {
            lib: std::mem::ManuallyDrop::new(lib),
            path: path.to_string(),
            what,
        })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// What it is (`the CUDA driver`).
    pub fn what(&self) -> &'static str {
        self.what
    }

    /// The address of the entry point `name`, if the library has it.
    pub fn address(&self, name: &CStr) -> Option<usize> {
        // SAFETY: looking a symbol up has no preconditions; the address is not called here.
        unsafe {
            self.lib
                .get::<*const std::ffi::c_void>(name.to_bytes_with_nul())
                .ok()
                .map(|s| *s as usize)
        }
    }

    /// The text a "status → static string" entry point (`cuGetErrorName`,
    /// `hsa_status_string`: `int f(int status, const char **out)`, 0 on success) gives for
    /// `status`, resolved once into `cell`; `None` if the library lacks it or knows no text.
    pub fn status_text(&self, cell: &EntryPoint, name: &CStr, status: c_int) -> Option<String> {
        let addr = cell.resolve(self, name).ok()?;
        // SAFETY: the entry points this is used for have this C signature.
        let f: unsafe extern "C" fn(c_int, *mut *const c_char) -> c_int =
            unsafe { std::mem::transmute(addr) };
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: writes a pointer to a static string, or fails for an unknown status.
        if unsafe { f(status, &mut text) } != 0 || text.is_null() {
            return None;
        }
        // SAFETY: the driver returns a NUL-terminated static string.
        Some(
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// One entry point, resolved on first use and remembered (found or not).
#[derive(Debug, Default)]
pub struct EntryPoint(OnceLock<Option<usize>>);

impl EntryPoint {
    /// Its address in `lib`, or the error of a call to it: the library is older than the
    /// backend needs.
    pub fn resolve(&self, lib: &DriverLibrary, name: &CStr) -> Result<usize> {
        self.0.get_or_init(|| lib.address(name)).ok_or_else(|| {
            Error::Unsupported(format!(
                "{} '{}' has no {} (it is older than this plugin needs)",
                lib.what,
                lib.path,
                name.to_string_lossy()
            ))
        })
    }
}

/// Typed methods for a driver's entry points, on a type `$ty` with a field `lib:
/// DriverLibrary`, a field `symbols: Symbols` (the struct this defines) and a method
/// `check(&self, status: c_int, call: &str) -> Result<()>`. Each line is
/// `name(arg: Type, ...) -> status;` (the call returns a status, turned into `Result<()>` by
/// `check`) or `-> T;` (a plain value, `Result<T>`). Every method is `unsafe`: its arguments
/// must satisfy the driver's contract for that call. A missing entry point is an
/// `Unsupported` error of that call.
#[macro_export]
macro_rules! driver_entry_points {
    ($ty:ident { $( $(#[$doc:meta])* $name:ident ( $($arg:ident : $aty:ty),* ) -> $ret:tt; )* }) => {
        /// The entry points used, each resolved on its first call.
        #[allow(non_snake_case, reason = "fields are named as the driver's entry points")]
        #[derive(Debug, Default)]
        struct Symbols {
            $( $name: $crate::dylib::EntryPoint, )*
        }

        impl $ty {
            $(
                $(#[$doc])*
                ///
                /// # Safety
                /// The arguments must satisfy the driver API's contract for this call.
                #[allow(
                    non_snake_case,
                    clippy::too_many_arguments,
                    clippy::unused_unit,
                    reason = "each method is named and typed as its entry point, `()` for those without a status"
                )]
                pub unsafe fn $name(&self, $($arg: $aty),*) -> $crate::driver_entry_points!(@ret $ret) {
                    let addr = self.symbols.$name.resolve(
                        &self.lib,
                        // SAFETY: a literal with one NUL, at its end.
                        unsafe {
                            ::std::ffi::CStr::from_bytes_with_nul_unchecked(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        },
                    )?;
                    let f: unsafe extern "C" fn($($aty),*) -> $crate::driver_entry_points!(@cret $ret) =
                        // SAFETY: the entry point has this C signature in every driver version
                        // this backend supports.
                        unsafe { ::std::mem::transmute(addr) };
                    // SAFETY: forwarded contract.
                    let out = unsafe { f($($arg),*) };
                    $crate::driver_entry_points!(@out self, $name, out, $ret)
                }
            )*
        }
    };
    (@ret status) => { $crate::offload_core::Result<()> };
    (@ret $ret:tt) => { $crate::offload_core::Result<$ret> };
    (@cret status) => { ::std::ffi::c_int };
    (@cret $ret:tt) => { $ret };
    (@out $self:ident, $name:ident, $out:ident, status) => { $self.check($out, stringify!($name)) };
    (@out $self:ident, $name:ident, $out:ident, $ret:tt) => { Ok($out) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_or_entry_point_is_an_error_naming_it() {
        // SAFETY: no such file: nothing is opened.
        let e = unsafe { DriverLibrary::open("libno-such-driver.so.7", "the test driver") }
            .unwrap_err();
        assert!(e.contains("libno-such-driver.so.7"), "{e}");
        // SAFETY: the C library, already loaded in this process.
        let lib = unsafe { DriverLibrary::open("libc.so.6", "the test driver") }.unwrap();
        assert!(lib.address(c"strlen").is_some());
        assert!(lib.address(c"no_such_entry_point").is_none());
        let entry = EntryPoint::default();
        let e = entry.resolve(&lib, c"no_such_entry_point").unwrap_err();
        assert!(matches!(e, Error::Unsupported(_)), "{e:?}");
        let m = e.message();
        assert!(
            m.contains("the test driver 'libc.so.6' has no no_such_entry_point"),
            "{m}"
        );
        // Remembered: the second call gives the same answer without looking again.
        assert!(entry.resolve(&lib, c"no_such_entry_point").is_err());
        let found = EntryPoint::default();
        assert_eq!(found.resolve(&lib, c"strlen").ok(), lib.address(c"strlen"));
    }

    #[test]
    fn open_driver_tries_each_candidate_and_says_why_none_would_do() {
        let names: Vec<String> = ["libno-such-driver.so.7", "libc.so.6", "libm.so.6"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let var = "OFFLOAD_TEST_UNSET_DRIVER_VARIABLE";
        // libc is passed over, libm is the driver.
        let mut seen = Vec::new();
        // SAFETY: libc and libm, already loaded in this process; the first name opens nothing.
        let got = unsafe {
            open_driver(var, &names, "the test driver", "install it", |c, lib| {
                seen.push(c.to_string());
                match c {
                    "libc.so.6" => Start::PassOver(format!("'{c}' is not it")),
                    _ => Start::Ready(lib.path().to_string()),
                }
            })
        }
        .unwrap();
        assert_eq!(got, "libm.so.6");
        assert_eq!(seen, ["libc.so.6", "libm.so.6"]);
        // The driver without devices: no device, naming what was passed over; no later try.
        // SAFETY: as above.
        let e = unsafe {
            open_driver::<()>(
                var,
                &names,
                "the test driver",
                "install it",
                |c, _| match c {
                    "libc.so.6" => Start::PassOver(format!("'{c}' is not it")),
                    "libm.so.6" => Start::Absent("no GPU".into()),
                    _ => unreachable!("{c}"),
                },
            )
        }
        .unwrap_err();
        assert!(matches!(e, Error::NoDevice(_)), "{e:?}");
        assert_eq!(
            e.message(),
            "no GPU (passed over before it: 'libc.so.6' is not it)"
        );
        // None will do: every name tried, the passed-over ones and the loader's message.
        // SAFETY: as above.
        let e = unsafe {
            open_driver::<()>(var, &names, "the test driver", "install it", |c, _| {
                Start::PassOver(format!("'{c}' is not it"))
            })
        }
        .unwrap_err();
        let m = e.message();
        assert!(matches!(e, Error::NoDevice(_)), "{e:?}");
        assert!(
            m.contains("the test driver was not found (tried libno-such-driver.so.7, libc.so.6, libm.so.6; passed over: 'libc.so.6' is not it; 'libm.so.6' is not it; last loader error: ")
                && m.contains("libno-such-driver.so.7")
                && m.ends_with("): install it, or set OFFLOAD_TEST_UNSET_DRIVER_VARIABLE"),
            "{m}"
        );
    }

    #[test]
    fn candidates_are_the_named_file_or_the_default_names() {
        let names = vec!["liba.so.1".to_string(), "liba.so".to_string()];
        // A variable nobody sets: the default names, in order.
        assert_eq!(
            candidates("OFFLOAD_TEST_UNSET_DRIVER_VARIABLE", &names).unwrap(),
            names
        );
    }
}
