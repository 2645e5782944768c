//! Catching panics at the plugin boundary without printing them: a panic inside a plugin
//! becomes an error that carries its message and location, instead of a message and backtrace
//! on the process's standard error ahead of the one-line error.
//!
//! The panic hook is installed once per copy of the standard library (a plugin library has its
//! own); it stays silent only for panics inside [`catch`] on the same thread and hands every
//! other panic to the hook that was there before, so a program's own panics still print.

use std::cell::{Cell, RefCell};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// How many [`catch`] calls are active on this thread.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    /// The message and location of the last panic caught on this thread.
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DEPTH.with(Cell::get) == 0 {
                return previous(info);
            }
            let at = info
                .location()
                .map(|l| format!(" (at {}:{})", l.file(), l.line()))
                .unwrap_or_default();
            let text = format!("{}{at}", payload_text(info.payload()));
            LAST.with(|l| *l.borrow_mut() = Some(text));
        }));
    });
}

/// The text of a panic payload.
pub fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".into()
    }
}

/// Runs `f`; a panic inside it is returned as its message (with its location), and nothing is
/// printed.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    DEPTH.with(|d| d.set(d.get() + 1));
    let out = catch_unwind(AssertUnwindSafe(f));
    DEPTH.with(|d| d.set(d.get() - 1));
    out.map_err(|payload| {
        LAST.with(|l| l.borrow_mut().take())
            .unwrap_or_else(|| payload_text(payload.as_ref()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caught_panics_carry_their_message_and_location() {
        let e = catch(|| -> u32 { panic!("boom {}", 7) }).unwrap_err();
        assert!(
            e.starts_with("boom 7 (at ") && e.contains("panic.rs"),
            "{e}"
        );
        assert_eq!(catch(|| 5).unwrap(), 5);
        // Nested: the inner one is caught, the outer goes on.
        let r = catch(|| catch(|| panic!("inner")).unwrap_err());
        assert!(r.unwrap().starts_with("inner"));
    }
}
