//! The Rust heap is a judged layer: a data pipeline that keeps each decoded
//! sample on the Rust heap fails, naming the line that allocates it, under
//! every runner; what a loop rightly keeps (a log of one `f64` per step, a
//! bounded cache, metrics updated in place, a formatted line) passes with
//! the default settings. The shapes are `#[ignore]`d: the leak fails on
//! purpose, and only the runs below start them.
mod common;

use std::collections::BTreeMap;

mod shapes {
    use gpu_leak_test::gpu_leak_test;
    use std::collections::{HashMap, VecDeque};
    use tch::nn::{self, Module, OptimizerConfig};
    use tch::{Device, Kind, Tensor};

    /// A decoded sample: 256 KiB of `f32`, as a data loader hands it over.
    fn decode(step: usize) -> Vec<f32> {
        (0..65_536).map(|i| ((i + step) % 251) as f32).collect() // site: decode
    }

    fn train_on(sample: &[f32], device: Device) -> f64 {
        Tensor::from_slice(sample).to_device(device).mean(Kind::Float).double_value(&[])
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "fails on purpose; run by each_runner_judges_the_rust_heap_alike"]
    fn keeps_every_decoded_sample(device: Device) -> impl FnMut() {
        let mut cache: Vec<Vec<f32>> = Vec::new();
        let mut step = 0;
        move || {
            step += 1;
            let sample = decode(step);
            std::hint::black_box(train_on(&sample, device));
            cache.push(sample);
        }
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "run by each_runner_judges_the_rust_heap_alike"]
    fn keeps_the_latest_eight_samples(device: Device) -> impl FnMut() {
        let mut cache: VecDeque<Vec<f32>> = VecDeque::with_capacity(8);
        let mut step = 0;
        move || {
            step += 1;
            let sample = decode(step);
            std::hint::black_box(train_on(&sample, device));
            if cache.len() == 8 {
                cache.pop_front();
            }
            cache.push_back(sample);
        }
    }

    /// The README's first example, fixed: a training step that logs its
    /// loss as a number.
    #[gpu_leak_test(device = "auto")]
    #[ignore = "run by each_runner_judges_the_rust_heap_alike"]
    fn logs_one_f64_per_step(device: Device) -> impl FnMut() {
        let vs = nn::VarStore::new(device);
        let model = nn::linear(vs.root(), 64, 8, Default::default());
        let mut opt = nn::Sgd::default().build(&vs, 0.01).unwrap();
        let mut losses: Vec<f64> = Vec::new();
        move || {
            let loss = model.forward(&Tensor::randn([16, 64], (Kind::Float, device))).square().mean(Kind::Float);
            opt.backward_step(&loss);
            losses.push(loss.double_value(&[]));
        }
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "run by each_runner_judges_the_rust_heap_alike"]
    fn updates_metrics_in_place(device: Device) -> impl FnMut() {
        let mut metrics: HashMap<String, f64> = HashMap::new();
        let mut step = 0u64;
        move || {
            step += 1;
            let x = Tensor::randn([256], (Kind::Float, device));
            *metrics.entry("mean".to_string()).or_default() = x.mean(Kind::Float).double_value(&[]);
            *metrics.entry("max".to_string()).or_default() = x.max().double_value(&[]);
            *metrics.entry(format!("step_{}", step % 4)).or_default() += 1.0;
        }
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "run by each_runner_judges_the_rust_heap_alike"]
    fn prints_a_formatted_line_per_step(device: Device) -> impl FnMut() {
        let mut step = 0u64;
        move || {
            step += 1;
            let loss = Tensor::randn([16], (Kind::Float, device)).square().mean(Kind::Float).double_value(&[]);
            // A String formatted each step, then printed.
            let line = format!("step {step:>5}: loss {loss:.4}");
            println!("{line}");
        }
    }
}

/// What each shape must get: a leak naming its site's line, or a pass.
const EXPECTED: &[(&str, Option<&str>)] = &[
    ("keeps_every_decoded_sample", Some("decode")),
    ("keeps_the_latest_eight_samples", None),
    ("logs_one_f64_per_step", None),
    ("updates_metrics_in_place", None),
    ("prints_a_formatted_line_per_step", None),
];

/// Each shape's outcome in one run's output: the first line of its report
/// where it failed, else "passed".
fn outcomes(output: &str) -> BTreeMap<&'static str, String> {
    common::shape_outcomes(EXPECTED.iter().map(|&(name, _)| name), output, " in")
}

#[test]
fn each_runner_judges_the_rust_heap_alike() {
    let source = std::fs::read_to_string(common::manifest_dir().join("tests/rust_heap.rs")).unwrap();
    let line_of = |mark: &str| {
        let needle = format!("// site: {mark}");
        source.lines().position(|line| line.trim_end().ends_with(&needle)).map(|i| i + 1).unwrap()
    };
    let parallel = common::run_this_binary(&["shapes::", "--ignored"], false);
    let one_thread = common::run_this_binary(&["shapes::", "--ignored", "--test-threads=1"], false);
    let mut per_process = String::new();
    for &(name, _) in EXPECTED {
        per_process += &common::run_this_binary(&[&format!("shapes::{name}"), "--exact", "--ignored"], true);
    }
    let first = outcomes(&parallel);
    for &(name, expected) in EXPECTED {
        let outcome = &first[name];
        match expected {
            Some(mark) => {
                assert!(outcome.contains("LEAK in") && outcome.contains("(the Rust heap)"), "{name}: {outcome}\n{parallel}");
                let report = parallel.split(&format!("LEAK in `shapes::{name}`")).nth(1).unwrap();
                let site = format!("tests/rust_heap.rs:{}", line_of(mark));
                assert!(report.contains(&site), "{name}: the report does not name {site}:\n{report}");
                assert!(report.contains("What grew is the Rust heap"), "{report}");
            }
            None => assert_eq!(outcome, "passed", "{name} under cargo test:\n{parallel}"),
        }
    }
    for (runner, output) in [("--test-threads=1", &one_thread), ("nextest's way", &per_process)] {
        assert_eq!(outcomes(output), first, "{runner} gives other verdicts than cargo test's threads:\n{output}");
    }
}

/// The Rust heap's canary reads its own thread's count, so other threads
/// allocating meanwhile (libtest-mimic still spawning its workers beside
/// the test, on a many-core runner) do not make it blind; switched off,
/// it still fails.
#[test]
fn the_rust_heap_canary_sees_its_block_while_other_threads_allocate() {
    use gpu_leak_test::internals::canaries::rust_heap_canary;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let stop = AtomicBool::new(false);
    let outcomes: Vec<_> = std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                while !stop.load(Relaxed) {
                    drop(std::hint::black_box(vec![0u8; 4096]));
                }
            });
        }
        let outcomes = (0..300).map(|_| rust_heap_canary()).collect();
        stop.store(true, Relaxed);
        outcomes
    });
    let blind: Vec<_> = outcomes.iter().filter_map(|outcome| outcome.as_ref().err()).collect();
    assert!(blind.is_empty(), "{} of {} canaries blind, the first: {}", blind.len(), outcomes.len(), blind[0]);
    assert!(outcomes.iter().all(|outcome| outcome == &Ok(4096)), "{outcomes:?}");

    gpu_leak_test::internals::switches::switch_off_rust_heap(true);
    let switched_off = rust_heap_canary();
    gpu_leak_test::internals::switches::switch_off_rust_heap(false);
    assert!(switched_off.as_ref().is_err_and(|why| why.contains("switched off")), "{switched_off:?}");
}
