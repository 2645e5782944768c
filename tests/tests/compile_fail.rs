//! What the borrow checker, the typed kernels and `unsafe` refuse at compile time (trybuild),
//! one file per door: a buffer dropped while a queued launch borrows it, read on the host
//! while a queued launch writes it, or freed twice; host memory dropped inside the queue scope
//! that borrows it; a buffer where a typed kernel takes an integer, a shared borrow where it
//! writes, a view that outlives its buffer, two mutable views of one buffer in one launch; and,
//! from safe code, the raw device's launch and free (which trust any pointer), the raw device
//! itself, and the trust points (loading an image, a raw launch, opening a plugin library,
//! wrapping a plugin or a backend).
//! Each `tests/ui/*.rs` has the compiler's message in the `.stderr` beside it.

#[test]
fn misuses_of_the_api_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
}
