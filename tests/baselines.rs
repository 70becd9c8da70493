//! Memory baselines reviewed like snapshots: a step that needs more memory
//! than its committed baseline fails with both numbers and the site where
//! the peak is reached; `update` rewrites the file and the next run passes;
//! `require` fails a test without one; the same figures write the same bytes.
mod common;

use common::LineMark;
use gpu_leak_test::{settings::BaselineMode, report::BaselineStatus, LeakTest, Options, Report, Verdict};
use std::path::{Path, PathBuf};
use tch::{nn, nn::Module, nn::OptimizerConfig, Kind, Tensor};

/// A fresh folder for one scenario: its baselines land in it.
fn scratch(name: &str, device: &str) -> PathBuf {
    let dir = common::manifest_dir().join("target/test-scratch/baselines").join(format!("{name}-{device}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A leak test that keeps a baseline in `root`, run in `mode`.
fn harness(name: &str, device: &str, root: &Path, mode: BaselineMode, tolerance_pct: f64) -> LeakTest {
    common::located(name).options(Options {
        device: Some(common::device(device)),
        baseline: Some(true),
        baselines: Some(mode),
        baseline_tolerance_pct: Some(tolerance_pct),
        baseline_dir: Some(root.join("memory-baselines").display().to_string()),
        ..Default::default()
    })
}

/// One step whose activations are `floats` f32 values, freed at its end.
fn step(test: LeakTest, floats: i64, line: &LineMark) -> Report {
    test.run(|device| {
        line.set(line!()); let activations = Tensor::ones([floats], (Kind::Float, device));
        let _ = activations.sum(Kind::Float);
    })
    .unwrap()
}

fn a_step_needing_a_tenth_more_fails_naming_both_figures_and_the_site_until_update_accepts_it(device: &str) {
    let root = scratch("tenth_more", device);
    let line = LineMark::default();
    let name = "baselines::tenth_more";
    let written = step(harness(name, device, &root, BaselineMode::Update, 5.0), 100_000, &line);
    let outcome = written.findings.baseline.as_ref().expect("a baseline outcome");
    assert_eq!(outcome.status, BaselineStatus::Written, "{written}");
    let file = common::manifest_dir().join(&outcome.file);
    assert!(file.starts_with(&root), "{}", file.display());
    let before = std::fs::read_to_string(&file).unwrap();
    assert!(before.contains("iteration_peak_bytes:"), "{before}");

    // 110,000 floats: the iteration's peak rises by a tenth.
    let grown = step(harness(name, device, &root, BaselineMode::Check, 5.0), 110_000, &line);
    let Verdict::PeakOverBaseline { figure, baseline_bytes, measured_bytes, tolerance_pct } = &grown.verdict else {
        panic!("expected a peak over its baseline:\n{grown}")
    };
    assert!(figure == "iteration_peak_bytes" || figure == "test_peak_bytes", "{figure}");
    assert!(*measured_bytes as f64 >= *baseline_bytes as f64 * 1.09, "{grown}");
    assert_eq!(*tolerance_pct, 5.0);
    let text = grown.to_string();
    println!("{text}");
    let shown = |bytes: i64| gpu_leak_test::report::bytes(bytes as u64);
    assert!(text.contains("PEAK OVER BASELINE") && text.contains(&shown(*baseline_bytes)) && text.contains(&shown(*measured_bytes)), "{text}");
    assert!(text.contains("GPU_LEAK_TEST_BASELINES=update cargo test -- baselines::tenth_more"), "{text}");
    // The site where the new peak is reached, in the text and the hint.
    let site = grown.top_site().and_then(|s| s.location.clone()).unwrap_or_default();
    assert!(site.ends_with(&line.location("tests/baselines.rs")), "{site}\n{text}");
    assert!(grown.findings.hints.iter().any(|h| h.contains(&site)), "{:?}", grown.findings.hints);
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "a check never writes");
    // The page shows the baseline beside the run, and the bytes alive at
    // each peak stacked by site.
    let files = gpu_leak_test::report::files::write_report(&grown, &root.join("reports"), gpu_leak_test::settings::Plots::All).unwrap();
    let page = std::fs::read_to_string(&files.page).unwrap();
    assert!(page.contains("<table id=\"baseline\">") && page.contains("<td class=\"fail\">"), "{page}");
    assert!(page.contains("id=\"peak-by-site\"") && page.contains(&format!("data-site=\"{site}\"")), "{page}");

    // Accepted: the file is rewritten, and the next run passes.
    let accepted = step(harness(name, device, &root, BaselineMode::Update, 5.0), 110_000, &line);
    assert_eq!(accepted.findings.baseline.as_ref().unwrap().status, BaselineStatus::Written);
    assert_ne!(std::fs::read_to_string(&file).unwrap(), before);
    let next = step(harness(name, device, &root, BaselineMode::Check, 5.0), 110_000, &line);
    assert!(next.passed(), "{next}");
    assert_eq!(next.findings.baseline.as_ref().unwrap().status, BaselineStatus::Within);

    // Back to the smaller step: it passes, and says the baseline can be lowered.
    let smaller = step(harness(name, device, &root, BaselineMode::Check, 5.0), 100_000, &line);
    assert!(smaller.passed(), "{smaller}");
    assert!(smaller.to_string().contains("the baseline can be lowered"), "{smaller}");
}

fn require_fails_a_test_without_a_baseline_and_says_the_one_command_that_writes_it(device: &str) {
    let root = scratch("require", device);
    let line = LineMark::default();
    let report = step(harness("baselines::required", device, &root, BaselineMode::Require, 5.0), 1_000, &line);
    let Verdict::NoBaseline { file, reason } = &report.verdict else { panic!("{report}") };
    assert!(file.contains("/memory-baselines/baselines.baselines.required."), "{file}");
    assert!(reason.contains("`GPU_LEAK_TEST_BASELINES=update cargo test -- baselines::required`"), "{reason}");
    assert!(!report.passed());
    assert!(!common::manifest_dir().join(file).exists());
}

fn without_a_baseline_a_test_passes_and_its_baseline_is_pending_in_the_index(device: &str) {
    let root = scratch("pending", device);
    let line = LineMark::default();
    let report = step(harness("baselines::pending", device, &root, BaselineMode::Check, 5.0), 1_000, &line);
    assert!(report.passed(), "{report}");
    assert_eq!(report.findings.baseline.as_ref().unwrap().status, BaselineStatus::Pending);
    let reports = root.join("reports");
    gpu_leak_test::report::files::write_report(&report, &reports, gpu_leak_test::settings::Plots::None).unwrap();
    let rows = std::fs::read_to_string(reports.join("index.rows")).unwrap();
    assert!(rows.contains("\"baseline\":\"pending\""), "{rows}");
    let page = std::fs::read_to_string(reports.join("index.html")).unwrap();
    assert!(page.contains("<th>baseline</th>") && page.contains("<td>pending</td>"), "{page}");
}

fn a_training_step_writes_the_same_bytes_twice_with_a_tolerance_of_zero(device: &str) {
    let root = scratch("stable", device);
    let train = |mode| {
        harness("baselines::training_step", device, &root, mode, 0.0)
            .run_with_setup(|device| {
                let vs = nn::VarStore::new(device);
                let net = nn::seq().add(nn::linear(vs.root(), 64, 256, Default::default())).add_fn(|x| x.relu()).add(
                    nn::linear(vs.root(), 256, 10, Default::default()),
                );
                let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
                let (x, y) = (Tensor::ones([32, 64], (Kind::Float, device)), Tensor::zeros([32], (Kind::Int64, device)));
                move || {
                    let loss = net.forward(&x).cross_entropy_for_logits(&y);
                    opt.backward_step(&loss);
                }
            })
            .unwrap()
    };
    let first = train(BaselineMode::Update);
    let file = common::manifest_dir().join(&first.findings.baseline.as_ref().unwrap().file);
    let written = std::fs::read(&file).unwrap();
    let second = train(BaselineMode::Update);
    assert_eq!(String::from_utf8(std::fs::read(&file).unwrap()).unwrap(), String::from_utf8(written).unwrap());
    let checked = train(BaselineMode::Check);
    assert!(checked.passed(), "{checked}\n{second}");
    assert_eq!(checked.findings.baseline.as_ref().unwrap().status, BaselineStatus::Within);
}

fn a_model_that_grew_fails_on_the_level_after_warm_up_and_says_what_raises_it(device: &str) {
    let root = scratch("model_grew", device);
    let model = |floats: i64, mode| {
        harness("baselines::model_grew", device, &root, mode, 5.0)
            .run_with_setup(move |device| {
                let weights = Tensor::ones([floats], (Kind::Float, device));
                move || {
                    let _ = weights.sum(Kind::Float);
                }
            })
            .unwrap()
    };
    assert!(model(100_000, BaselineMode::Update).passed());
    let grown = model(120_000, BaselineMode::Check);
    let Verdict::PeakOverBaseline { figure, .. } = &grown.verdict else { panic!("{grown}") };
    // The weights rose the level after warm-up and, by as much, the whole
    // test's peak; a tie goes to the figure first in the file.
    assert_eq!(figure, "after_warmup_bytes", "{grown}");
    let outcome = grown.findings.baseline.as_ref().unwrap();
    assert!(outcome.over.iter().any(|c| c.figure == "test_peak_bytes"), "{grown}");
    assert!(!outcome.over.iter().any(|c| c.figure == "iteration_peak_bytes"), "{grown}");
    // Setup's state is not allocated again by the iterations: no peak sites,
    // and the hint says what raises that level.
    assert!(grown.findings.peak_sites.is_none(), "{grown}");
    assert!(grown.findings.hints.iter().any(|h| h.starts_with("the level after warm-up is the model")), "{:?}", grown.findings.hints);
}

/// `бл_α` and `бл_β` (and `naïve` and `na_ve`) once shared one file and
/// passed or failed against each other's figures. Each keeps its own, and a
/// file that names another test fails the run naming the file.
fn tests_whose_names_clean_alike_keep_their_own_baselines_and_a_file_of_another_test_is_refused(device: &str) {
    let root = scratch("alike", device);
    let line = LineMark::default();
    let pairs = [("baselines::бл_α", 100_000), ("baselines::бл_β", 10_000), ("baselines::bl_naïve", 50_000), ("baselines::bl_na_ve", 5_000)];
    let mut files = Vec::new();
    for (name, floats) in pairs {
        let written = step(harness(name, device, &root, BaselineMode::Update, 0.0), floats, &line);
        files.push(written.findings.baseline.as_ref().unwrap().file.clone());
    }
    files.dedup();
    assert_eq!(files.len(), pairs.len(), "{files:?}");
    for (name, floats) in pairs {
        let checked = step(harness(name, device, &root, BaselineMode::Check, 5.0), floats, &line);
        assert!(checked.passed(), "{checked}");
        assert_eq!(checked.findings.baseline.as_ref().unwrap().status, BaselineStatus::Within, "{checked}");
    }
    // Another test's file copied over this one's: refused, not compared.
    let path = |i: usize| common::manifest_dir().join(&files[i]);
    std::fs::copy(path(1), path(0)).unwrap();
    let refused = step(harness(pairs[0].0, device, &root, BaselineMode::Check, 5.0), pairs[0].1, &line);
    let Verdict::NoBaseline { file, reason } = &refused.verdict else { panic!("{refused}") };
    assert_eq!(file, &files[0]);
    assert!(reason.contains("`test` is \"baselines::бл_β\"") && reason.contains("another test"), "{reason}");
}

on_each_device!(
    tests_whose_names_clean_alike_keep_their_own_baselines_and_a_file_of_another_test_is_refused,
    a_model_that_grew_fails_on_the_level_after_warm_up_and_says_what_raises_it,
    a_step_needing_a_tenth_more_fails_naming_both_figures_and_the_site_until_update_accepts_it,
    require_fails_a_test_without_a_baseline_and_says_the_one_command_that_writes_it,
    without_a_baseline_a_test_passes_and_its_baseline_is_pending_in_the_index,
    a_training_step_writes_the_same_bytes_twice_with_a_tolerance_of_zero,
);

// The attribute's keys are the table's: a typo is a compile error
// (tests/ui), and these compile. Without a baseline, and not told to
// require one, it passes with its baseline pending and writes nothing.
#[gpu_leak_test::gpu_leak_test(device = "cpu", baseline = true, baseline_tolerance_pct = 0)]
fn the_attribute_opts_in() {}

#[test]
fn the_options_struct_and_the_environment_opt_in_through_the_one_option_table() {
    let mut options = Options { baseline: Some(true), baseline_tolerance_pct: Some(0.0), ..Default::default() };
    options.baselines = Some(BaselineMode::Require);
    assert_eq!(options.keys(), ["baseline", "baseline_tolerance_pct", "baselines"]);
    assert!(Options::ENVIRONMENT.contains(&("baselines", "GPU_LEAK_TEST_BASELINES")));
}
