//! Environment variables at run time. One test in its own binary, since the
//! environment is shared by every thread of a process.
mod common;

use gpu_leak_test::{LeakTest, Options};
use std::panic::catch_unwind;
use tch::{Device, Kind, Tensor};

/// What `#[gpu_leak_test]` expands into, with the attribute's `options`.
fn run_body(options: Options, body: impl FnMut(Device)) {
    LeakTest::new("env_case").location(concat!(file!(), ":", line!()), env!("CARGO_MANIFEST_DIR")).options(options).check(body)
}

fn cpu() -> Options {
    Options { device: Some(gpu_leak_test::settings::DeviceChoice::Cpu), ..Default::default() }
}

fn panic_text(result: std::thread::Result<()>) -> String {
    let payload = result.expect_err("the leak test should have failed");
    payload.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn environment_overrides_and_malformed_values() {
    // A malformed value fails the test and names the variable.
    std::env::set_var("GPU_LEAK_TEST_ITERATIONS", "five");
    let text = panic_text(catch_unwind(|| run_body(cpu(), |_| {})));
    assert!(text.contains("environment variable GPU_LEAK_TEST_ITERATIONS: \"five\" is not a valid whole number (0 to 4294967295)"), "{text}");

    // A valid value changes the run; the attribute still wins over it.
    std::env::set_var("GPU_LEAK_TEST_ITERATIONS", "3");
    std::env::set_var("GPU_LEAK_TEST_WARMUP", "1");
    let mut kept = Vec::new();
    let text = panic_text(catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_body(cpu(), |device| kept.push(Tensor::zeros([10], (Kind::Float, device))))
    })));
    assert!(text.contains("over 3 measured iterations"), "{text}");
    // Confirmation iterations follow where a layer needs them.
    assert!(text.contains("Ran 1 warm-up + 3 measured"), "{text}");
    let attribute = Options { iterations: Some(4), ..cpu() };
    let text = panic_text(catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_body(attribute, |device| kept.push(Tensor::zeros([10], (Kind::Float, device))))
    })));
    assert!(text.contains("over 4 measured iterations"), "{text}");

    // A threshold from the environment lets small growth pass.
    std::env::set_var("GPU_LEAK_TEST_THRESHOLD_MB", "1");
    run_body(cpu(), |device| kept.push(Tensor::zeros([10], (Kind::Float, device))));

    // A malformed GPU_LEAK_TEST_REQUIRE_CUDA is an error too, where it is read.
    std::env::set_var("GPU_LEAK_TEST_REQUIRE_CUDA", "perhaps");
    let text = panic_text(catch_unwind(|| run_body(Options { device: Some(gpu_leak_test::settings::DeviceChoice::Auto), ..Default::default() }, |_| {})));
    assert!(text.contains("GPU_LEAK_TEST_REQUIRE_CUDA"), "{text}");
    std::env::remove_var("GPU_LEAK_TEST_REQUIRE_CUDA");
    std::env::remove_var("GPU_LEAK_TEST_THRESHOLD_MB");

    // Reports go where GPU_LEAK_TEST_REPORT_DIR says.
    let dir = common::manifest_dir().join("target/test-scratch/env_reports");
    let _ = std::fs::remove_dir_all(&dir);
    std::env::set_var("GPU_LEAK_TEST_REPORT_DIR", &dir);
    let text = panic_text(catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_body(cpu(), |device| kept.push(Tensor::zeros([10], (Kind::Float, device))))
    })));
    let json = written(&dir, "env_case.cpu.", ".json").unwrap_or_else(|| panic!("no report in {}:\n{text}", dir.display()));
    assert!(written(&dir, "env_case.cpu.", ".svg").is_some(), "{text}");
    assert!(text.contains(&format!("Report: {}", json.display())), "{text}");

    // A report that cannot be written is a warning: the verdict stands,
    // failing or passing.
    let not_a_folder = json;
    std::env::set_var("GPU_LEAK_TEST_REPORT_DIR", &not_a_folder);
    let text = panic_text(catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_body(cpu(), |device| kept.push(Tensor::zeros([10], (Kind::Float, device))))
    })));
    assert!(text.contains("LEAK in `env_case`") && !text.contains("Report: "), "{text}");
    run_body(cpu(), |_| {});
    for name in ["GPU_LEAK_TEST_ITERATIONS", "GPU_LEAK_TEST_WARMUP", "GPU_LEAK_TEST_REPORT_DIR"] {
        std::env::remove_var(name);
    }
}

/// The file in `dir` whose name starts with `prefix` and ends with `suffix`
/// (report names end with a hash that keeps them unique).
fn written(dir: &std::path::Path, prefix: &str, suffix: &str) -> Option<std::path::PathBuf> {
    std::fs::read_dir(dir).ok()?.filter_map(|e| e.ok().map(|e| e.path())).find(|p| {
        let name = p.file_name().unwrap().to_string_lossy();
        name.starts_with(prefix) && name.ends_with(suffix)
    })
}
