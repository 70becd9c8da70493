//! What a GitHub Actions job shows of a failing leak test: an `::error`
//! annotation on the line that keeps the memory, and a row of the job
//! summary. The leaking test below is `#[ignore]`d: it fails on purpose,
//! and only the run below starts it, as `cargo test` would in a job.
mod common;

use std::process::Command;

mod shapes {
    use gpu_leak_test::gpu_leak_test;
    use tch::{Kind, Tensor};

    pub const KEEPING_LINE: u32 = line!() + 7;

    #[gpu_leak_test(device = "cpu", scope = "process")]
    #[ignore = "fails on purpose; run by a_failing_leak_test_annotates_its_line_and_adds_a_summary_row"]
    fn keeps_a_tensor_for_the_job(device: tch::Device) -> impl FnMut() {
        let mut kept = Vec::new();
        move || {
            kept.push(Tensor::zeros([256], (Kind::Float, device)));
        }
    }
}

#[test]
fn a_failing_leak_test_annotates_its_line_and_adds_a_summary_row() {
    let scratch = std::env::temp_dir().join(format!("glt-ci-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let summary = scratch.join("summary.md");
    let reports = scratch.join("reports");
    let workspace = common::manifest_dir();
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "shapes::keeps_a_tensor_for_the_job"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_WORKSPACE", &workspace)
        .env("GITHUB_STEP_SUMMARY", &summary)
        .env("GPU_LEAK_TEST_REPORT_DIR", &reports)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "the leak must fail:\n{stdout}");
    let expected = format!(
        "::error file=tests/ci.rs,line={},title=shapes%3A%3Akeeps_a_tensor_for_the_job::leak: 1.00 KiB (1,024 B) per iteration on cpu",
        shapes::KEEPING_LINE
    );
    // At the start of a line, as GitHub reads workflow commands.
    assert!(stdout.lines().any(|line| line == expected), "no `{expected}` line in:\n{stdout}");
    let rows = std::fs::read_to_string(&summary).unwrap();
    assert!(rows.contains("| test | verdict | where | site | page |"), "{rows}");
    let row = format!("| `shapes::keeps_a_tensor_for_the_job` | leak, 1.00 KiB (1,024 B) per iteration | cpu | `tests/ci.rs:{}` |", shapes::KEEPING_LINE);
    assert!(rows.contains(&row), "no `{row}` in:\n{rows}");

    // Under nextest, which indents what tests print, the step after the run
    // prints the same annotation from the reports.
    let annotate = Command::new(env!("CARGO_BIN_EXE_gpu-leak-test-annotate"))
        .arg(&reports)
        .env("GITHUB_WORKSPACE", &workspace)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&annotate.stdout);
    assert!(annotate.status.success(), "{printed}");
    assert_eq!(printed.trim_end(), expected);
    let _ = std::fs::remove_dir_all(&scratch);
}
