//! The detector through the builder API, on the CPU (runs in CI).
use gpu_leak_test::verdict::{Phase, RetainedDuring};
use gpu_leak_test::{LeakTest, Verdict};
use tch::{Device, Kind, Tensor};

fn cpu_test(name: &str) -> LeakTest {
    LeakTest::new(name).device("cpu").location(format!("{}:{}", file!(), line!()), env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn a_kept_tensor_is_a_leak_named_at_its_line() {
    let mut kept = Vec::new();
    let mut leak_line = 0;
    let report = cpu_test("kept_tensor")
        .run(|device| {
            leak_line = line!() + 1;
            kept.push(Tensor::zeros([1000], (Kind::Float, device)));
        })
        .unwrap();
    println!("{report}");
    let Verdict::Leak(leak) = &report.verdict else { panic!("expected a leak:\n{report}") };
    assert_eq!(leak.bytes_per_iteration, 4000.0);
    assert_eq!(leak.retained_bytes, 5 * 4000);
    let site = report.top_site().unwrap();
    assert_eq!(site.location.as_deref(), Some(format!("tests/detector_cpu.rs:{leak_line}").as_str()));
    assert_eq!((site.allocations, site.bytes, site.iterations.clone()), (3, 12_000, vec![1, 2, 3]));
    let text = report.to_string();
    assert!(text.contains(&format!("tests/detector_cpu.rs:{leak_line}")), "{text}");
    assert!(text.contains("4,000 B per iteration") || text.contains("3.91 KiB (4,000 B) per iteration"), "{text}");
}

#[test]
fn the_clean_twin_passes() {
    let report = cpu_test("clean_twin")
        .run(|device| {
            let t = Tensor::zeros([1000], (Kind::Float, device));
            let _ = t.sum(Kind::Float).double_value(&[]);
        })
        .unwrap();
    assert_eq!(report.verdict, Verdict::Clean, "{report}");
    assert!(report.attribution.is_none(), "passing tests pay no attribution");
}

#[test]
fn a_leak_every_third_iteration_is_caught() {
    let mut kept = Vec::new();
    let mut calls = 0;
    let report = cpu_test("every_third")
        .run(|device| {
            calls += 1;
            if calls % 3 == 0 {
                kept.push(Tensor::zeros([64], (Kind::Float, device)));
            }
        })
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
}

#[test]
fn one_time_retention_passes_and_is_reported() {
    let mut cache: Option<Tensor> = None;
    let report = cpu_test("one_time")
        .run(|device| {
            cache.get_or_insert_with(|| Tensor::zeros([4096], (Kind::Float, device)));
        })
        .unwrap();
    assert_eq!(report.verdict, Verdict::OneTimeRetention { bytes: 16384, during: RetainedDuring::WarmUp }, "{report}");
    assert!(report.passed());

    // Without warm-up the cache fills in the first measured iteration.
    let mut cache: Option<Tensor> = None;
    let report = cpu_test("one_time_no_warmup")
        .warmup(0)
        .run(|device| {
            cache.get_or_insert_with(|| Tensor::zeros([4096], (Kind::Float, device)));
        })
        .unwrap();
    assert_eq!(report.verdict, Verdict::OneTimeRetention { bytes: 16384, during: RetainedDuring::Iteration(1) }, "{report}");
}

#[test]
fn a_panic_is_reported_with_phase_and_iteration_and_the_next_test_runs() {
    let mut calls = 0;
    let report = cpu_test("panics")
        .run(|_| {
            calls += 1;
            if calls == 4 {
                panic!("boom in the body");
            }
        })
        .unwrap();
    assert_eq!(
        report.verdict,
        Verdict::Panicked { phase: Phase::Measure, iteration: 2, message: "boom in the body".into() }
    );
    assert!(report.to_string().contains("in measured iteration 2"), "{report}");
    // The device lock was released: another test on the CPU runs.
    let next = cpu_test("after_panic").run(|_| {}).unwrap();
    assert_eq!(next.verdict, Verdict::Clean);
}

#[test]
fn setup_form_with_a_training_loop_that_keeps_losses() {
    let report = cpu_test("keeps_losses")
        .run_with_setup(|device| {
            let w = Tensor::randn([32, 32], (Kind::Float, device)).set_requires_grad(true);
            let mut losses = Vec::new();
            move || {
                let x = Tensor::randn([8, 32], (Kind::Float, Device::Cpu));
                let loss = x.matmul(&w).sum(Kind::Float);
                loss.backward();
                losses.push(loss);
            }
        })
        .unwrap();
    println!("{report}");
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
}
