//! Compile-error tests for #[gpu_leak_test]; the expected messages are the
//! committed .stderr files beside each case (TRYBUILD=overwrite regenerates).
#[test]
fn macro_errors() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
