//! Reports people act on: retained tensors matched to the test's state,
//! the JSON report, the SVG timeline, the config file and suppressions.
mod common;

use common::LineMark;
use gpu_leak_test::report::{files, json, svg};
use gpu_leak_test::{watch, LeakTest, Report, TensorRefs, Verdict};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

const FILE: &str = "tests/reports.rs";

#[track_caller]
fn harness(name: &str, device: &str) -> LeakTest {
    common::located(name).device(common::device(device))
}

/// A fresh folder under target/ for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = common::manifest_dir().join("target/test-scratch").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[derive(TensorRefs)]
struct TrainingState {
    cache: Vec<Tensor>,
    best: Option<Tensor>,
    steps: u64,
    #[tensor_refs(skip)]
    _label: std::cell::Cell<u8>,
}

/// A leaking report made on the CPU: a cache the test watches, and a second
/// leak no root holds.
fn leaking_report(device: &str, cache_line: &LineMark, unwatched_line: &LineMark) -> Report {
    harness("watched_cache", device)
        .run_with_setup(|device| {
            let mut state = TrainingState { cache: Vec::new(), best: None, steps: 0, _label: Default::default() };
            let mut hidden = Vec::new();
            move || {
                cache_line.set(line!()); state.cache.push(Tensor::zeros([32, 1000], (Kind::Float, device)));
                unwatched_line.set(line!()); hidden.push(Tensor::zeros([16], (Kind::Float, device)));
                state.steps += 1;
                watch("state", &state);
            }
        })
        .unwrap()
}

/// Iterations that ran before attribution: warm-up, measured, confirmation.
fn iterations_before_attribution(report: &gpu_leak_test::Report) -> usize {
    use gpu_leak_test::report::Phase;
    report.samples.iter().filter(|s| matches!(s.phase, Phase::WarmUp | Phase::Measure | Phase::Confirm)).count()
}

fn references_name_the_state_that_holds_retained_tensors(device: &str) {
    let (cache_line, unwatched_line) = (LineMark::default(), LineMark::default());
    let report = leaking_report(device, &cache_line, &unwatched_line);
    println!("{report}");
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    let reference = report.findings.references.first().unwrap_or_else(|| panic!("no references:\n{report}"));
    // The warm-up, measured and confirmation iterations came before the 3
    // attribution ones, whose tensors are the survivors: cache[n..n + 3].
    let n = iterations_before_attribution(&report);
    assert_eq!(reference.held_by, format!("state.cache[{n}..{}]", n + 3));
    assert_eq!((reference.tensors, reference.shape.clone(), reference.bytes), (3, vec![32, 1000], 3 * 128_000));
    assert_eq!(reference.allocated_at.as_deref(), Some(cache_line.location(FILE).as_str()));
    let device_name = if device == "cpu" { "cpu".to_string() } else { "cuda:0".to_string() };
    let line = format!(
        "retained 3 tensors [32, 1000] f32 {device_name} (375.00 KiB (384,000 B)) referenced from state.cache[{n}..{}], allocated at {}",
        n + 3,
        cache_line.location(FILE)
    );
    assert!(report.to_string().contains(&line), "{line}\nnot in\n{report}");
    // The survivor no root holds is still listed by its site.
    assert_eq!(report.findings.references.len(), 1, "{report}");
    let sites = &report.findings.attribution.as_ref().unwrap().sites;
    assert!(sites.iter().any(|s| s.location.as_deref() == Some(unwatched_line.location(FILE).as_str())), "{report}");
}

/// A simulation keeps its states; each holds an `energy` scalar that
/// requires grad. `watch` names the 4-byte scalar and says that its graph
/// keeps the activations allocated at another line alive.
fn a_kept_scalar_that_requires_grad_names_the_graph_it_keeps(device: &str) {
    #[derive(TensorRefs)]
    struct SimState {
        energy: Tensor,
        positions: Tensor,
    }
    let activation_line = &LineMark::default();
    let report = harness("simulation", device)
        .run_with_setup(|device| {
            let weights = Tensor::randn([64, 64], (Kind::Float, device)).set_requires_grad(true);
            let mut states: Vec<SimState> = Vec::new();
            move || {
                let positions = Tensor::randn([32, 64], (Kind::Float, device));
                activation_line.set(line!()); let activations = positions.matmul(&weights).tanh();
                let energy = activations.sum(Kind::Float);
                states.push(SimState { energy, positions });
                watch("states", &states);
            }
        })
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    let energy = report.findings.references.iter().find(|r| r.held_by.ends_with(".energy")).unwrap_or_else(|| panic!("{report}"));
    let graph = energy.graph.as_ref().unwrap_or_else(|| panic!("the energy's graph is reported:\n{report}"));
    // tanh saves its [32, 64] f32 output for backward: 8 KiB per state.
    let at_activation = graph.sites.iter().find(|(site, _)| *site == activation_line.location(FILE)).map(|(_, b)| *b);
    assert!(at_activation.is_some_and(|b| b >= 3 * 8192), "{report}");
    let text = report.to_string();
    assert!(text.contains("requires grad; its autograd graph keeps") && text.contains(&activation_line.location(FILE)), "{text}");
}

/// A tensor kept in two places (a best-so-far and the history) is one
/// storage: counted once, with both paths named.
fn storage_held_twice_is_counted_once_and_both_paths_are_named(device: &str) {
    #[derive(TensorRefs)]
    struct Tracking {
        best: Option<Tensor>,
        history: Vec<Tensor>,
    }
    let report = harness("shared_storage", device)
        .run_with_setup(|device| {
            let mut tracking = Tracking { best: None, history: Vec::new() };
            move || {
                let score = Tensor::randn([256], (Kind::Float, device));
                tracking.best = Some(score.shallow_clone());
                tracking.history.push(score);
                watch("tracking", &tracking);
            }
        })
        .unwrap();
    let total: u64 = report.findings.references.iter().map(|r| r.bytes).sum();
    let per_tensor = common::allocated_size(device, 1024);
    let kept = report.findings.references.iter().map(|r| r.tensors as u64).sum::<u64>();
    assert_eq!(total, kept * per_tensor, "each storage once:\n{report}");
    let named_twice = report.findings.references.iter().find(|r| !r.also_held_by.is_empty()).unwrap_or_else(|| panic!("{report}"));
    assert!(named_twice.also_held_by.iter().chain([&named_twice.held_by]).any(|p| p == "tracking.best"), "{report}");
    assert!(report.to_string().contains("the same storage, counted once"), "{report}");
}

on_each_device!(
    references_name_the_state_that_holds_retained_tensors,
    a_kept_scalar_that_requires_grad_names_the_graph_it_keeps,
    storage_held_twice_is_counted_once_and_both_paths_are_named,
);

#[test]
fn tensor_refs_paths_for_the_usual_containers() {
    let t = || Tensor::zeros([1], (Kind::Float, Device::Cpu));
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let _layer = tch::nn::linear(vs.root() / "fc", 2, 2, Default::default());
    let mut map = HashMap::new();
    map.insert("k", vec![t()]);
    let value = (map, [t(), t()], Box::new(Some(t())), vs);
    let mut paths = Vec::new();
    value.for_each_tensor(&mut "root".to_string(), &mut |path, _| paths.push(path.to_string()));
    assert_eq!(paths, ["root.0[\"k\"][0]", "root.1[0]", "root.1[1]", "root.2", "root.3[\"fc.bias\"]", "root.3[\"fc.weight\"]"]);
}

#[test]
fn watch_costs_nothing_outside_attribution() {
    // Not inside a leak test: returns at once, records nothing, no panic.
    watch("anything", &vec![Tensor::zeros([4], (Kind::Float, Device::Cpu))]);
    let report = harness("watch_clean", "cpu")
        .run(|device| {
            let t = Tensor::zeros([4], (Kind::Float, device));
            watch("t", &t);
        })
        .unwrap();
    assert_eq!(report.verdict, Verdict::Clean);
    assert!(report.findings.references.is_empty());
}

/// Every key path of a JSON value (array elements merged), sorted: the
/// shape of the schema, without its values.
fn key_paths(value: &serde_json::Value, prefix: &str, out: &mut std::collections::BTreeSet<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, child) in map {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                out.insert(path.clone());
                key_paths(child, &path, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| key_paths(item, &format!("{prefix}[]"), out)),
        _ => {}
    }
}

#[test]
fn json_report_round_trips_with_its_schema_version() {
    let (a, b) = (LineMark::default(), LineMark::default());
    let report = leaking_report("cpu", &a, &b);
    let text = json::to_json(&report, Some("watched_cache.svg")).unwrap();
    let parsed = json::from_json(&text).unwrap();
    assert_eq!(parsed.schema_version, 3);
    // One [32, 1000] f32 (128,000 B) and one [16] f32 (64 B) per iteration.
    let Verdict::Leak(leak) = &parsed.report.verdict else { panic!("{text}") };
    assert_eq!(leak.bytes_per_iteration, 128_064.0);
    assert_eq!(parsed.report.device, tch::Device::Cpu);
    assert!(!parsed.passed);
    assert_eq!(parsed.report.samples, report.samples);
    let n = iterations_before_attribution(&report);
    assert_eq!(parsed.report.findings.references[0].held_by, format!("state.cache[{n}..{}]", n + 3));
    assert_eq!(parsed.report.top_site().unwrap().location.as_deref(), Some(a.location(FILE).as_str()));
    // Written again it is the same text: the JSON is the report's own types.
    assert_eq!(json::to_json(&parsed.report, parsed.plot.as_deref()).unwrap(), text);

    // The shape is pinned: a field added, renamed or dropped shows here and
    // must be documented (UPDATE_SNAPSHOTS=1 rewrites the snapshot).
    let value: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut paths = std::collections::BTreeSet::new();
    key_paths(&value, "", &mut paths);
    // Other layers' verdicts have their variants' fields (documented with
    // `verdict`), and which layers are judged depends on the runner: the
    // Rust heap is followed only where the test has the process alone.
    paths.retain(|p| !p.starts_with("devices[].verdict.") || p == "devices[].verdict.kind");
    let shape: String = paths.iter().map(|p| format!("{p}\n")).collect();
    let snapshot = common::manifest_dir().join("docs/report-schema.keys");
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&snapshot, &shape).unwrap();
    }
    assert_eq!(shape, std::fs::read_to_string(&snapshot).unwrap_or_default(), "the JSON's shape changed; review docs/report-schema.md");
    let documented = std::fs::read_to_string(common::manifest_dir().join("docs/report-schema.md")).unwrap();
    for key in value.as_object().unwrap().keys() {
        let named = documented.contains(&format!("`{key}`")) || documented.contains(&format!("`{key}[]`"));
        assert!(named, "`{key}` is not documented in docs/report-schema.md");
    }
}

#[test]
fn files_are_written_atomically_with_an_index() {
    let dir = scratch("files");
    let (a, b) = (LineMark::default(), LineMark::default());
    let failing = leaking_report("cpu", &a, &b);
    let passing = harness("clean_one", "cpu").run(|_| {}).unwrap();
    let written = files::write_report(&failing, &dir, gpu_leak_test::settings::Plots::Failing).unwrap();
    let clean = files::write_report(&passing, &dir, gpu_leak_test::settings::Plots::Failing).unwrap();
    assert!(written.plot.is_some() && clean.plot.is_none(), "plots for failing tests only");
    let names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "no temporary files left: {names:?}");
    let index = std::fs::read_to_string(&written.index).unwrap();
    let plot_name = written.plot.as_ref().unwrap().file_name().unwrap().to_string_lossy().into_owned();
    assert!(plot_name.starts_with("watched_cache.cpu.") && plot_name.ends_with(".svg"), "{plot_name}");
    assert!(index.contains("watched_cache") && index.contains("clean_one") && index.contains(&plot_name), "{index}");
    // Writing into something that is not a folder fails with a reason.
    let not_a_folder = written.json.clone();
    let error = files::write_report(&failing, &not_a_folder, gpu_leak_test::settings::Plots::All).unwrap_err().to_string();
    let json_name = not_a_folder.file_name().unwrap().to_string_lossy().into_owned();
    assert!(error.contains(&json_name), "{error}");
}

/// Counts pixels within a small distance of `hex`.
fn pixels_near(pixmap: &resvg::tiny_skia::Pixmap, hex: &str) -> usize {
    let c = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap();
    let (r, g, b) = ((c >> 16) as i32 & 255, (c >> 8) as i32 & 255, c as i32 & 255);
    pixmap
        .pixels()
        .iter()
        .filter(|p| {
            let p = p.demultiply();
            (p.red() as i32 - r).abs() + (p.green() as i32 - g).abs() + (p.blue() as i32 - b).abs() < 24
        })
        .count()
}

#[test]
fn svg_timeline_renders_to_real_pixels() {
    let (a, b) = (LineMark::default(), LineMark::default());
    let report = leaking_report("cpu", &a, &b);
    let svg_text = svg::timeline(&report);
    let tree = resvg::usvg::Tree::from_str(&svg_text, &resvg::usvg::Options::default()).expect("valid SVG");
    let size = tree.size().to_int_size();
    // The legend sits under the plot, so the height follows its rows.
    assert!(size.width() == 860 && (420..=700).contains(&size.height()), "{}x{}", size.width(), size.height());
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(&tree, resvg::tiny_skia::Transform::default(), &mut pixmap.as_mut());
    let live = pixels_near(&pixmap, svg::LIVE_COLOR);
    let threshold = pixels_near(&pixmap, svg::THRESHOLD_COLOR);
    let warmup = pixels_near(&pixmap, svg::WARMUP_SHADE);
    let attribution = pixels_near(&pixmap, svg::ATTRIBUTION_SHADE);
    let white = pixels_near(&pixmap, "#ffffff");
    println!("pixels: live {live}, threshold {threshold}, warm-up {warmup}, attribution {attribution}, white {white}");
    // A 2.5-pixel line rising across the measured and attribution
    // iterations (~450 pixels), a dashed threshold line, two shaded bands,
    // and mostly white paper.
    assert!(live > 800, "live line {live}");
    assert!(threshold > 100, "threshold {threshold}");
    assert!(warmup > 5000 && attribution > 5000, "shading {warmup} {attribution}");
    assert!(white > (size.width() * size.height() / 3) as usize, "background {white}");
    if let Ok(path) = std::env::var("GPU_LEAK_TEST_SAVE_PNG") {
        pixmap.save_png(path).unwrap();
    }
}

/// A crate folder with a gpu-leak-test.yaml, for config tests.
fn crate_with_config(name: &str, yaml: &str) -> PathBuf {
    let dir = scratch(name);
    std::fs::write(dir.join("gpu-leak-test.yaml"), yaml).unwrap();
    dir
}

#[test]
fn config_file_is_found_at_the_crate_root_below_attribute_and_environment() {
    let root = crate_with_config("config_layers", "defaults:\n  iterations: 3\n  warmup: 1\noverrides:\n  - tests: \"layers::*\"\n    settings: { warmup: 0 }\n");
    let test = |name: &str| LeakTest::new(name).device(tch::Device::Cpu).location(format!("{FILE}:1"), &root);
    let from_file = test("other").run(|_| {}).unwrap();
    assert_eq!((from_file.settings.iterations, from_file.settings.warmup), (3, 1));
    let overridden = test("layers::one").run(|_| {}).unwrap();
    assert_eq!((overridden.settings.iterations, overridden.settings.warmup), (3, 0));
    let attribute = test("layers::two").iterations(6).run(|_| {}).unwrap();
    assert_eq!((attribute.settings.iterations, attribute.settings.warmup), (6, 0));
}

#[test]
fn a_bad_config_file_is_an_error_naming_file_line_and_key() {
    let root = crate_with_config("config_bad", "defaults:\n  iterations: 3\n  treshold_mb: 1\n");
    let error = LeakTest::new("x").device(tch::Device::Cpu).location(format!("{FILE}:1"), &root).run(|_| {}).unwrap_err().to_string();
    assert!(error.contains("gpu-leak-test.yaml:3: defaults: unknown field `treshold_mb`"), "{error}");
}

#[test]
fn suppressed_sites_are_listed_but_not_counted() {
    let mark = &LineMark::default();
    // Find the line first, then write a config that suppresses exactly it.
    let run = |root: &Path| {
        LeakTest::new("suppressed")
            .device(tch::Device::Cpu)
            .location(format!("{FILE}:1"), root)
            .run_with_setup(|device| {
                let mut kept = Vec::new();
                move || {
                    mark.set(line!()); kept.push(Tensor::zeros([8], (Kind::Float, device)));
                }
            })
            .unwrap()
    };
    let unconfigured = run(&scratch("suppress_none"));
    assert!(matches!(unconfigured.verdict, Verdict::Leak(_)));
    // This crate folder is not where the sources are, so sites show as
    // absolute paths; a glob matches them either way.
    let yaml = format!("suppressions:\n  - site: \"*{}\"\n    reason: \"a bounded cache in this fixture\"\n", mark.location(FILE));
    let root = crate_with_config("suppress_one", &yaml);
    let report = run(&root);
    println!("{report}");
    let Verdict::Leak(leak) = &unconfigured.verdict else { unreachable!() };
    let retained_bytes = 32 * leak.iterations as i64;
    assert_eq!(report.verdict, Verdict::Suppressed { retained_bytes, bytes_per_iteration: 32.0 }, "{report}");
    assert!(report.passed());
    let site = report.top_site().unwrap();
    assert_eq!(site.suppressed_by.as_deref(), Some("a bounded cache in this fixture"));
    assert!(report.to_string().contains("(suppressed: a bounded cache in this fixture)"), "{report}");
}

/// Sixteen leak tests that finish together write sixteen rows, every time.
#[test]
fn sixteen_concurrent_writers_lose_no_row() {
    let (a, b) = (LineMark::default(), LineMark::default());
    let template = leaking_report("cpu", &a, &b);
    for round in 0..10 {
        let dir = scratch(&format!("concurrent_{round}"));
        let barrier = std::sync::Barrier::new(16);
        std::thread::scope(|scope| {
            for writer in 0..16 {
                let (dir, barrier, template) = (&dir, &barrier, &template);
                scope.spawn(move || {
                    let mut report = template.clone();
                    report.test = format!("writer_{writer}");
                    barrier.wait();
                    files::write_report(&report, dir, gpu_leak_test::settings::Plots::None).unwrap();
                });
            }
        });
        let index = std::fs::read_to_string(dir.join("index.html")).unwrap();
        let rows = (0..16).filter(|w| index.contains(&format!(">writer_{w}<"))).count();
        assert_eq!(rows, 16, "round {round}: {rows} of 16 rows\n{index}");
        // The run's counts: every row, each a leak (the page's script counts
        // the same rows; scripts/browser-check.sh checks what it shows).
        let rows: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("index.rows"))
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(rows.len(), 16, "round {round}");
        assert!(rows.iter().all(|r| r["verdict"] == "leak"), "round {round}: {rows:?}");
    }
}

#[test]
fn a_250_character_test_name_is_written_and_kept_whole_in_the_report() {
    let (a, b) = (LineMark::default(), LineMark::default());
    let mut report = leaking_report("cpu", &a, &b);
    report.test = format!("module::{}", "very_long_name_".repeat(16).chars().take(250).collect::<String>());
    let dir = scratch("long_name");
    let written = files::write_report(&report, &dir, gpu_leak_test::settings::Plots::All).unwrap();
    let text = std::fs::read_to_string(&written.json).unwrap();
    assert_eq!(json::from_json(&text).unwrap().report.test, report.test);
    assert!(written.json.file_name().unwrap().len() < 160);
}

#[test]
fn a_panic_during_attribution_keeps_the_leak_and_says_where() {
    let mut kept = Vec::new();
    let mut calls = 0;
    let report = harness("panics_in_attribution", "cpu")
        .run(|device| {
            calls += 1;
            // Warm-up 2 and the measured and confirmation iterations (an
            // exact leak stops confirming at twice the window of 5) come
            // first; the next call is attribution's.
            if calls == 2 + 10 + 1 {
                panic!("boom in attribution");
            }
            kept.push(Tensor::zeros([64], (Kind::Float, device)));
        })
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    let Some(Verdict::Panicked { phase, iteration, message }) = &report.findings.attribution_failure else {
        panic!("the attribution failure is kept: {report}")
    };
    assert_eq!((*phase, *iteration), (gpu_leak_test::report::Phase::Attribution, 1));
    assert!(message.contains("boom in attribution"));
    assert!(report.to_string().contains("attribution stopped"), "{report}");
}

/// The kept tensors' own records grow libtorch's host objects beside them,
/// and only attribution can tell them apart from a kept graph. A body that
/// fails in attribution keeps the tensors' verdict: what attribution would
/// have explained is not promoted to the cause.
#[test]
fn a_panic_during_attribution_keeps_the_tensors_verdict_beside_their_records() {
    let mut kept = Vec::new();
    let mut calls = 0;
    let report = harness("panics_in_attribution_small", "cpu")
        .run(|device| {
            calls += 1;
            // Warm-up 2, 10 measured and confirmation iterations, then
            // attribution's first; its second panics.
            if calls == 2 + 10 + 2 {
                panic!("boom in attribution iteration 2");
            }
            kept.push(Tensor::zeros([4], (Kind::Float, device)));
        })
        .unwrap();
    let Verdict::Leak(leak) = &report.verdict else { panic!("{report}") };
    assert_eq!(report.verdict_layer, gpu_leak_test::report::Layer::Tensors(Device::Cpu), "{report}");
    assert_eq!(leak.bytes_per_iteration, 16.0, "{report}");
    assert!(matches!(report.findings.attribution_failure, Some(Verdict::Panicked { iteration: 2, .. })), "{report}");
    let text = report.to_string();
    assert!(text.contains("attribution stopped") && text.contains("records"), "the host objects' growth is reported as unexplained\n{text}");
}

#[test]
fn a_should_panic_leak_test_is_shown_as_expected_in_the_index() {
    let mut kept = Vec::new();
    let report = harness("expected_to_fail", "cpu")
        .expect_failure(true)
        .run(|device| kept.push(Tensor::zeros([8], (Kind::Float, device))))
        .unwrap();
    let dir = scratch("expected_failure");
    let written = files::write_report(&report, &dir, gpu_leak_test::settings::Plots::None).unwrap();
    let index = std::fs::read_to_string(written.index).unwrap();
    assert!(index.contains("expected by #[should_panic]") && index.contains("class=\"expected\""), "{index}");
    assert!(index.contains(&report.top_site().unwrap().location.clone().unwrap()), "the site column: {index}");
}

/// A leak at two lines: its page (written under target/test-scratch/page,
/// where scripts/browser-check.sh renders it in Chromium) has a stacked
/// series per site, the site table with stacks, the views and the links.
#[test]
fn a_failing_test_has_a_page_with_a_series_per_site() {
    let (a, b) = (LineMark::default(), LineMark::default());
    let report = leaking_report("cpu", &a, &b);
    let dir = scratch("page");
    let passing = harness("clean_neighbour", "cpu").run(|_| {}).unwrap();
    files::write_report(&passing, &dir, gpu_leak_test::settings::Plots::All).unwrap();
    let written = files::write_report(&report, &dir, gpu_leak_test::settings::Plots::All).unwrap();
    // Written again: the index keeps its newest row only (the page's script
    // drops the older one; scripts/browser-check.sh checks the rendering).
    files::write_report(&passing, &dir, gpu_leak_test::settings::Plots::All).unwrap();
    let page = std::fs::read_to_string(&written.page).unwrap();
    let sites = report.findings.attribution.as_ref().unwrap().sites.len();
    assert!(sites >= 2, "{report}");
    assert_eq!(page.matches("class=\"site-series\"").count(), sites.min(8), "one stacked series per site");
    assert_eq!(page.matches("<tr class=\"site\">").count(), sites);
    for id in ["verdict", "settings", "devices", "views", "timeline", "by-site", "sites", "references"] {
        assert!(page.contains(&format!("id=\"{id}\"")), "the page has #{id}");
    }
    assert!(page.contains(&a.location(FILE)) && page.contains("<details><summary>stack</summary>"), "{page}");
    let index = std::fs::read_to_string(&written.index).unwrap();
    let page_name = written.page.file_name().unwrap().to_string_lossy().into_owned();
    assert!(index.contains(&format!("href=\"{page_name}\"")), "the index links the page: {index}");
}

/// Three partitions' report folders merge into one index that lists exactly
/// the tests of one unpartitioned run.
#[test]
fn merged_partitions_list_exactly_the_tests_of_the_whole_run() {
    let (a, b) = (LineMark::default(), LineMark::default());
    let template = leaking_report("cpu", &a, &b);
    let names: Vec<String> = (0..9).map(|i| format!("suite::test_{i}")).collect();
    let write = |dir: &Path, names: &[String]| {
        for name in names {
            let mut report = template.clone();
            report.test = name.clone();
            files::write_report(&report, dir, gpu_leak_test::settings::Plots::None).unwrap();
        }
    };
    let whole = scratch("merge_whole");
    write(&whole, &names);
    let parts: Vec<PathBuf> = (0..3).map(|p| scratch(&format!("merge_part_{p}"))).collect();
    for (p, dir) in parts.iter().enumerate() {
        let mine: Vec<String> = names.iter().skip(p).step_by(3).cloned().collect();
        write(dir, &mine);
    }
    let merged = scratch("merge_out");
    let rows = gpu_leak_test::report::index::merge_report_dirs(&merged, &parts).unwrap();
    assert_eq!(rows, names.len());
    let listed = |dir: &Path| -> std::collections::BTreeSet<String> {
        std::fs::read_to_string(dir.join("index.rows"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["test"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(listed(&merged), listed(&whole));
    let index = std::fs::read_to_string(merged.join("index.html")).unwrap();
    assert!(index.contains("9 tests") && !index.contains("class=\"stale\""), "{index}");
    // Every report file came along.
    let jsons = std::fs::read_dir(&merged).unwrap().filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|x| x == "json")).count();
    assert_eq!(jsons, names.len());
}

/// Two runners' folders that hold the same test merge into one row and the
/// files of that same report: the newest, whichever folder is listed last.
/// A folder merged into itself is refused, and its files stay whole.
#[test]
fn merging_keeps_one_reports_row_and_files_and_refuses_its_own_output() {
    let (a, b) = (LineMark::default(), LineMark::default());
    let mut leaking = leaking_report("cpu", &a, &b);
    leaking.test = "suite::twice".into();
    let mut passing = harness("twice_passing", "cpu").run(|_| {}).unwrap();
    passing.test = "suite::twice".into();
    let (newer, older) = (scratch("merge_newer"), scratch("merge_older"));
    files::write_report(&leaking, &newer, gpu_leak_test::settings::Plots::All).unwrap();
    files::write_report(&passing, &older, gpu_leak_test::settings::Plots::All).unwrap();
    // The older folder's row, written an hour earlier.
    let rows_path = older.join("index.rows");
    let aged: String = std::fs::read_to_string(&rows_path)
        .unwrap()
        .lines()
        .map(|line| {
            let mut row: serde_json::Value = serde_json::from_str(line).unwrap();
            row["written_at"] = (row["written_at"].as_u64().unwrap() - 3600).into();
            format!("{row}\n")
        })
        .collect();
    std::fs::write(&rows_path, aged).unwrap();
    let merged = scratch("merge_both");
    gpu_leak_test::report::index::merge_report_dirs(&merged, &[newer.clone(), older.clone()]).unwrap();
    let row: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(merged.join("index.rows")).unwrap().lines().next().unwrap()).unwrap();
    let stem = row["stem"].as_str().unwrap();
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(merged.join(format!("{stem}.json"))).unwrap()).unwrap();
    assert_eq!(row["verdict"], "leak");
    assert_eq!(json["verdict"]["kind"], "leak", "the row and its JSON are one report");
    assert!(merged.join(format!("{stem}.svg")).metadata().unwrap().len() > 0);

    let before = std::fs::read_to_string(newer.join(format!("{stem}.json"))).unwrap();
    let error = gpu_leak_test::report::index::merge_report_dirs(&newer, &[newer.clone(), older.clone()]).unwrap_err().to_string();
    assert!(error.contains("also an input"), "{error}");
    assert_eq!(std::fs::read_to_string(newer.join(format!("{stem}.json"))).unwrap(), before);
}

/// A long leak's report stays small: the text, the JSON and the page keep
/// at most 1,000 samples, and the full series is a CSV beside the JSON.
/// `GPU_LEAK_TEST_LONG_ITERATIONS` runs it longer (the closing note's
/// 100,000).
#[test]
fn a_long_leak_writes_bounded_reports_and_names_the_full_series() {
    let iterations: u32 = std::env::var("GPU_LEAK_TEST_LONG_ITERATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(3_000);
    let mut kept = Vec::new();
    let dir = scratch("long");
    let mut report = harness("long_leak", "cpu")
        .iterations(iterations)
        .attribution_iterations(2)
        .run(|device| kept.push(Tensor::zeros([1], (Kind::Float, device))))
        .unwrap();
    let Verdict::Leak(leak) = &report.verdict else { panic!("{report}") };
    assert_eq!(leak.bytes_per_iteration, 4.0);
    let thinned = report.figures.thinned.clone().expect("a long run's samples are thinned");
    // 1,000, and the samples on either side of each phase's boundary.
    assert!(report.samples.len() <= 1_012 && thinned.samples_taken > iterations as usize, "{} of {}", report.samples.len(), thinned.samples_taken);
    // The iterations run are counted, not the samples kept.
    let (measured, confirmation) = report.window();
    assert_eq!(measured, iterations);
    assert_eq!(measured + confirmation, leak.iterations, "{report}");
    let written = files::write_report(&report, &dir, gpu_leak_test::settings::Plots::All).unwrap();
    report.files = Some(written.clone());
    let text = report.to_string();
    let json_bytes = std::fs::metadata(&written.json).unwrap().len();
    let page_bytes = std::fs::metadata(&written.page).unwrap().len();
    println!("{iterations} iterations: text {} B, JSON {json_bytes} B, page {page_bytes} B", text.len());
    assert!(text.len() < 20_000, "text of {} B:\n{text}", text.len());
    assert!(json_bytes < 2_000_000 && page_bytes < 2_000_000, "JSON {json_bytes} B, page {page_bytes} B");
    let csv_path = dir.join(written.json.file_name().unwrap().to_string_lossy().replace(".json", ".series.csv"));
    assert!(text.contains(&csv_path.display().to_string()), "the text names the full series\n{text}");
    let csv = std::fs::read_to_string(&csv_path).unwrap();
    assert_eq!(csv.lines().count(), thinned.samples_taken + 1, "a header and every sample");
    let parsed = json::from_json(&std::fs::read_to_string(&written.json).unwrap()).unwrap();
    assert_eq!(parsed.report.figures.thinned.unwrap().full_series.as_deref(), csv_path.file_name().and_then(|n| n.to_str()));
}
