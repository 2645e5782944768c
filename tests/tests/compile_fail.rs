//! What the borrow checker and the typed kernels refuse at compile time (trybuild): a buffer
//! dropped while a queued launch borrows it, host memory dropped inside the queue scope that
//! borrows it, a buffer where a typed kernel takes an integer, a shared borrow where it
//! writes, a view that outlives its buffer, two mutable views of one buffer in one launch, the
//! raw device's launch (which trusts any pointer) called from safe code.
//! Each `tests/ui/*.rs` has the compiler's message in the `.stderr` beside it.

#[test]
fn misuses_of_the_api_do_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/*.rs");
}
