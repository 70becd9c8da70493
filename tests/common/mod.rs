//! Helpers shared by the integration tests.
#![allow(dead_code)]
use gpu_leak_test::probe::cuda;

/// Returns the CUDA device to test on, or `None` after printing why the test
/// is skipped. With GPU_LEAK_TEST_REQUIRE_CUDA=1 a missing device panics.
pub fn cuda_device_or_skip(test: &str) -> Option<usize> {
    if cuda::is_available() {
        return Some(0);
    }
    let required = gpu_leak_test::config::cuda_required().unwrap_or_else(|e| panic!("{e}"));
    let reason = cuda::check_device(0).unwrap_err();
    if required {
        panic!("{test}: {reason} (GPU_LEAK_TEST_REQUIRE_CUDA is set, so this fails instead of skipping)");
    }
    // Straight to the process's stderr: libtest's capture would hide it.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "skipped {test}: no CUDA device; set GPU_LEAK_TEST_REQUIRE_CUDA=1 to fail instead");
    None
}
