//! Every figure of a report is the verdict layer's, wherever it is shown.
//! Run after a suite, over the folder its reports went to:
//!
//!   GPU_LEAK_TEST_REPORT_DIR=target/gpu-leak-test cargo test --test report_consistency -- --ignored
//!
//! (CI runs it over the whole suite's reports, on the CPU and from the GPU
//! archive.) For each JSON report, its index row, its top-level figures and
//! the header of its text must name the verdict's layer and show that
//! layer's growth, rate and peak.
use gpu_leak_test::report::json;
use gpu_leak_test::Verdict;
use std::collections::HashMap;
use std::path::PathBuf;

mod common;

fn report_dir() -> PathBuf {
    std::env::var_os("GPU_LEAK_TEST_REPORT_DIR").map(PathBuf::from).unwrap_or_else(|| common::manifest_dir().join("target/gpu-leak-test"))
}

#[test]
#[ignore = "runs over a finished suite's reports: see the file's comment"]
fn every_report_shows_the_verdict_layers_figures_in_its_index_row_json_and_text() {
    let dir = report_dir();
    // The newest index row of each report.
    let rows: HashMap<String, serde_json::Value> = std::fs::read_to_string(dir.join("index.rows"))
        .unwrap_or_else(|e| panic!("{}: {e}; run the suite first", dir.join("index.rows").display()))
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|row| (row["stem"].as_str().unwrap_or_default().to_string(), row))
        .collect();
    let mut checked = 0;
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let file = json::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let report = &file.report;
        let mut problem = |what: String| problems.push(format!("{stem}: {what}"));
        let Some(layer) = report.judged(report.verdict_layer) else {
            if !report.devices.is_empty() {
                problem(format!("the verdict's layer {} is not among the judged layers", report.verdict_layer));
            }
            continue;
        };
        checked += 1;
        if file.retained_growth_bytes != layer.retained_growth_bytes {
            problem(format!("JSON growth {} but its layer's {}", file.retained_growth_bytes, layer.retained_growth_bytes));
        }
        if report.figures.peak_bytes != layer.peak_bytes {
            problem(format!("JSON peak {:?} but its layer's {:?}", report.figures.peak_bytes, layer.peak_bytes));
        }
        if report.verdict != layer.verdict {
            problem("the top-level verdict is not its layer's".into());
        }
        let rate = match &report.verdict {
            Verdict::Leak(leak) => Some(leak.bytes_per_iteration),
            Verdict::Suppressed { bytes_per_iteration, .. } | Verdict::WithinThreshold { bytes_per_iteration, .. } => Some(*bytes_per_iteration),
            _ => None,
        };
        match rows.get(&stem) {
            None => problem("no index row".into()),
            Some(row) => {
                if row["layer"].as_str() != Some(report.verdict_layer.name().as_str()) {
                    problem(format!("index row's layer {} is not the verdict's {}", row["layer"], report.verdict_layer.name()));
                }
                if row["retained_growth_bytes"].as_i64() != Some(layer.retained_growth_bytes) {
                    problem(format!("index growth {} but its layer's {}", row["retained_growth_bytes"], layer.retained_growth_bytes));
                }
                if row["bytes_per_iteration"].as_f64() != rate {
                    problem(format!("index rate {} but the verdict's {rate:?}", row["bytes_per_iteration"]));
                }
                if row["peak_bytes"].as_i64() != layer.peak_bytes {
                    problem(format!("index peak {} but its layer's {:?}", row["peak_bytes"], layer.peak_bytes));
                }
            }
        }
        // The text: the headline names the layer, and a leak's first line
        // shows its layer's retained bytes and rate.
        let text = report.to_string();
        let headline = text.lines().next().unwrap_or_default();
        let names_layer = match report.verdict_layer {
            gpu_leak_test::report::Layer::HostObjects => headline.contains("libtorch's host objects"),
            gpu_leak_test::report::Layer::RustHeap => headline.contains("(the Rust heap)"),
            gpu_leak_test::report::Layer::Tensors(_) => headline.contains(&format!(" on {}", report.verdict_layer.name())),
            _ => headline.contains("outside libtorch"),
        };
        if report.verdict.is_failure() && !names_layer {
            problem(format!("the headline does not name {}: {headline}", report.verdict_layer));
        }
        if let Verdict::Leak(leak) = &report.verdict {
            let line = text.lines().nth(1).unwrap_or_default();
            let retained = gpu_leak_test::report::bytes(leak.retained_bytes.max(0) as u64);
            let per = gpu_leak_test::report::bytes(leak.bytes_per_iteration.round().max(0.0) as u64);
            if !line.contains(&retained) || !line.contains(&format!("{per} per iteration")) {
                problem(format!("the leak's line does not show {retained} and {per} per iteration: {line}"));
            }
        }
    }
    assert!(checked > 0, "no report with judged layers in {}", dir.display());
    assert!(problems.is_empty(), "{} of {checked} reports mix layers:\n{}", problems.len(), problems.join("\n"));
    println!("{checked} reports: every figure from the verdict's layer");
}
