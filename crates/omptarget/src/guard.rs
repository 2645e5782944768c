//! Every C entry point runs under [`call`]: a panic in this library never unwinds into the
//! program's C frames (undefined behaviour); it becomes upstream's failure return of that entry
//! point (`OFFLOAD_FAIL`, NULL, 0 or nothing) and one message naming the entry point and the
//! panic. (The few entry points whose bodies are empty are left as they are.)
//!
//! Debug builds (the test suite's) take `OFFLOAD_OMP_PANIC_IN=<entry point>`: that entry point
//! panics before its body, so the tests can show what a panic becomes. Release builds ignore it.

use crate::messages;
use std::sync::OnceLock;

/// The entry point a debug build panics in (`OFFLOAD_OMP_PANIC_IN`).
fn injected() -> Option<&'static str> {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    AT.get_or_init(|| {
        offload_core::env::raw(&["OFFLOAD_OMP_PANIC_IN"])
            .ok()
            .flatten()
            .map(|(_, v)| v)
    })
    .as_deref()
}

/// Runs the body of entry point `entry`; a panic in it is `fail`, after a message.
pub fn call<T>(entry: &str, fail: T, body: impl FnOnce() -> T) -> T {
    call_or(entry, || fail, body)
}

/// [`call`] for a target or data construct: a panic is a failed construct, decided by the
/// offload policy as any failure is (under MANDATORY, upstream's fatal error; it never runs the
/// region a second time on the host after a panic late in the construct).
pub fn construct<T>(
    entry: &str,
    loc: *const crate::abi::Ident,
    fail: T,
    body: impl FnOnce() -> T,
) -> T {
    call_or(
        entry,
        || {
            if let Some(rtl) = crate::rtl::get() {
                crate::target::outcome(&rtl, false, loc);
            }
            fail
        },
        body,
    )
}

/// [`call`] with the failure made by `fail` (after the message).
pub fn call_or<T>(entry: &str, fail: impl FnOnce() -> T, body: impl FnOnce() -> T) -> T {
    let body = || {
        if cfg!(debug_assertions) && injected() == Some(entry) {
            panic!("injected by OFFLOAD_OMP_PANIC_IN");
        }
        body()
    };
    match offload_core::panic::catch(body) {
        Ok(v) => v,
        Err(panic) => {
            messages::error(&format!(
                "{entry}: internal error, the call failed (a panic in libomptarget: {panic})"
            ));
            fail()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_the_failure_value_and_the_next_call_works() {
        assert_eq!(call("t", -1, || -> i32 { panic!("boom") }), -1);
        assert!(call("t", std::ptr::null_mut::<u8>(), || panic!("x")).is_null());
        assert_eq!(call("t", -1, || 7), 7);
    }
}
