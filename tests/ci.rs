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
    // Run from a nextest archive, the build's path is gone: nextest says
    // where the binary is now.
    let annotate_exe = ["NEXTEST_BIN_EXE_gpu-leak-test-annotate", "NEXTEST_BIN_EXE_gpu_leak_test_annotate"]
        .into_iter()
        .find_map(std::env::var_os)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_gpu-leak-test-annotate").into());
    let annotate = Command::new(&annotate_exe)
        .arg(&reports)
        .env("GITHUB_WORKSPACE", &workspace)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&annotate.stdout);
    assert!(annotate.status.success(), "{printed}");
    assert_eq!(printed.trim_end(), expected);

    // The failing report cut short (a runner killed mid-write, a disk
    // full): named, and the step fails rather than say "0 annotated".
    let report = std::fs::read_dir(&reports)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .unwrap();
    let text = std::fs::read(&report).unwrap();
    std::fs::write(&report, &text[..text.len() / 2]).unwrap();
    let cut = Command::new(&annotate_exe).arg(&reports).env("GITHUB_WORKSPACE", &workspace).output().unwrap();
    let said = String::from_utf8_lossy(&cut.stderr);
    assert_eq!(cut.status.code(), Some(1), "{said}");
    assert!(said.contains(&format!("cannot read the report {}", report.display())) && said.contains("the index says this test failed"), "{said}");
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The guide's GitHub Actions recipe (docs/ci.md) parses, and has the steps the gate
/// needs: the CPU job's `cargo test`, the archive, the partitioned GPU run
/// with its annotations and reports, and the merge.
#[test]
fn the_guides_github_actions_recipe_is_valid_yaml_with_every_step() {
    let readme = std::fs::read_to_string(common::manifest_dir().join("docs/ci.md")).unwrap();
    let blocks: Vec<&str> = readme.split("```yaml\n").skip(1).filter_map(|rest| rest.split("\n```").next()).collect();
    assert!(!blocks.is_empty(), "no yaml block in docs/ci.md");
    let workflow = blocks.iter().find(|b| b.contains("jobs:")).expect("a workflow block");
    let parsed: serde_yaml::Value = serde_yaml::from_str(workflow).unwrap_or_else(|e| panic!("{e}\n{workflow}"));
    let jobs = parsed.get("jobs").and_then(|j| j.as_mapping()).expect("jobs");
    let runs = |job: &str| -> String {
        let steps = jobs.get(job).and_then(|j| j.get("steps")).and_then(|s| s.as_sequence()).unwrap_or_else(|| panic!("job {job}"));
        steps.iter().filter_map(|s| s.get("run").and_then(|r| r.as_str())).collect::<Vec<_>>().join("\n")
    };
    assert!(runs("cpu").contains("cargo test"));
    assert!(runs("gpu-archive").contains("cargo nextest archive"));
    let gpu = runs("gpu");
    assert!(gpu.contains("--partition hash:${{ matrix.partition }}/3") && gpu.contains("GPU_LEAK_TEST_REQUIRE_CUDA=1"), "{gpu}");
    assert!(gpu.contains("gpu-leak-test-annotate target/gpu-leak-test"), "{gpu}");
    assert!(runs("reports").contains("gpu-leak-test-merge merged"));
    assert!(workflow.contains("target/nextest/ci/junit.xml"));
}
