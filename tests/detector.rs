//! The detector through the builder API. Every scenario runs on the CPU (in
//! CI) and again on CUDA where a GPU is present.
mod common;

use gpu_leak_test::{report::Phase, report::RetainedDuring};
use common::{allocated_size, LineMark};
use gpu_leak_test::{report::Layer, LeakTest, Verdict};
use tch::{Device, Kind, Tensor};

/// A leak test located at the line that calls this.
#[track_caller]
fn leak_test(name: &str, device: &str) -> LeakTest {
    common::located(name).device(common::device(device))
}

fn kept_tensor_is_a_leak_named_at_its_line(device: &str) {
    let mut kept = Vec::new();
    let mut leak_line = 0;
    let report = leak_test("kept_tensor", device)
        .run(|device| {
            leak_line = line!() + 1;
            kept.push(Tensor::zeros([1000], (Kind::Float, device)));
        })
        .unwrap();
    println!("{report}");
    let per_iteration = allocated_size(device, 4000);
    let Verdict::Leak(leak) = &report.verdict else { panic!("expected a leak:\n{report}") };
    assert_eq!(leak.bytes_per_iteration, per_iteration as f64);
    assert_eq!(leak.retained_bytes, leak.iterations as i64 * per_iteration as i64);
    let location = format!("tests/detector.rs:{leak_line}");
    let text = report.to_string();
    if common::sites_can_be_named(&report) {
        let site = report.top_site().unwrap();
        assert_eq!(site.location.as_deref(), Some(location.as_str()), "{report}");
        assert_eq!((site.survivors.allocations, site.survivors.bytes, site.survivors.iterations.clone()), (3, 3 * per_iteration, vec![1, 2, 3]));
        assert!(text.contains(&location), "{text}");
    }
    assert!(text.contains(&format!("({} B) per iteration", gpu_leak_test::report::thousands(per_iteration))), "{text}");
}

fn clean_twin_passes(device: &str) {
    let report = leak_test("clean_twin", device)
        .run(|device| {
            let t = Tensor::zeros([1000], (Kind::Float, device));
            let _ = t.sum(Kind::Float).double_value(&[]);
        })
        .unwrap();
    assert_eq!(report.verdict, Verdict::Clean, "{report}");
    assert!(report.findings.attribution.is_none(), "passing tests pay no attribution");
}

fn leak_every_third_iteration_is_caught(device: &str) {
    let mut kept = Vec::new();
    let mut calls = 0;
    let report = leak_test("every_third", device)
        .run(|device| {
            calls += 1;
            if calls % 3 == 0 {
                kept.push(Tensor::zeros([64], (Kind::Float, device)));
            }
        })
        .unwrap();
    let Verdict::Leak(leak) = &report.verdict else { panic!("expected a leak:\n{report}") };
    assert!(leak.growing_iterations.len() >= 2, "{report}");
}

fn one_time_retention_passes_and_is_reported(device: &str) {
    let mut cache: Option<Tensor> = None;
    let report = leak_test("one_time", device)
        .run(|device| {
            cache.get_or_insert_with(|| Tensor::zeros([4096], (Kind::Float, device)));
        })
        .unwrap();
    assert!(report.passed());
    let Verdict::OneTimeRetention { bytes, during: RetainedDuring::WarmUp } = report.verdict else {
        panic!("expected one-time retention in warm-up:\n{report}")
    };
    assert_eq!(bytes, 16384);

    // Without warm-up the cache fills in the first measured iteration; the
    // confirmation iterations show it stays flat.
    let mut cache: Option<Tensor> = None;
    let report = leak_test("one_time_no_warmup", device)
        .warmup(0)
        .run(|device| {
            cache.get_or_insert_with(|| Tensor::zeros([4096], (Kind::Float, device)));
        })
        .unwrap();
    assert_eq!(report.verdict, Verdict::OneTimeRetention { bytes: 16384, during: RetainedDuring::Iteration(1) }, "{report}");
    // A pass that says growth stopped says how far the window looked.
    assert!(report.to_string().contains("less often than every 5 iterations would not be seen"), "{report}");
}

fn panic_is_reported_with_phase_and_iteration(device: &str) {
    let mut calls = 0;
    let report = leak_test("panics", device)
        .run(|_| {
            calls += 1;
            if calls == 4 {
                panic!("boom in the body");
            }
        })
        .unwrap();
    assert_eq!(report.verdict, Verdict::Panicked { phase: Phase::Measure, iteration: 2, message: "boom in the body".into() });
    assert!(report.to_string().contains("in measured iteration 2"), "{report}");
    // The closing line counts what ran, not what was asked for.
    assert!(report.to_string().contains("Stopped in measured iteration 2, of 2 warm-up + 5 measured iterations asked for"), "{report}");
    // The device lock was released: the next test on this device runs.
    let next = leak_test("after_panic", device).run(|_| {}).unwrap();
    assert_eq!(next.verdict, Verdict::Clean);
}

fn out_of_memory_is_a_failure_with_views(device: &str) {
    let report = leak_test("out_of_memory", device)
        .run(|device| {
            // 2^46 floats: 256 TiB, more than any machine has.
            let _ = Tensor::zeros([1 << 46], (Kind::Float, device));
        })
        .unwrap();
    let Verdict::OutOfMemory { phase, iteration, message } = &report.verdict else {
        panic!("expected out of memory:\n{report}")
    };
    assert_eq!((*phase, *iteration), (Phase::WarmUp, 1));
    assert!(message.to_lowercase().contains("memory"), "{message}");
    assert!(report.to_string().contains("OUT OF MEMORY"), "{report}");
    assert!(report.figures.after.is_some(), "the views at the failure are in the report");
}

fn training_loop_that_keeps_losses_leaks(device: &str) {
    let mark = &LineMark::default();
    let report = leak_test("keeps_losses", device)
        .run_with_setup(|device| {
            let w = Tensor::randn([32, 32], (Kind::Float, device)).set_requires_grad(true);
            let mut losses = Vec::new();
            move || {
                let x = Tensor::randn([8, 32], (Kind::Float, device));
                mark.set(line!()); let loss = x.matmul(&w).sum(Kind::Float);
                loss.backward();
                losses.push(loss);
            }
        })
        .unwrap();
    println!("{report}");
    // backward() freed the graph's buffers: the scalar loss stays, and its
    // graph's nodes on the host, which outweigh it.
    assert_eq!(report.verdict_layer, Layer::HostObjects, "{report}");
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    let tensors = report.judged(Layer::Tensors(report.device)).unwrap();
    let Verdict::Leak(scalar) = &tensors.verdict else { panic!("the kept scalars are a leak:\n{report}") };
    assert_eq!(scalar.bytes_per_iteration, allocated_size(device, 4) as f64, "{report}");
    let location = mark.location("tests/detector.rs");
    if common::sites_can_be_named(&report) {
        assert_eq!(report.top_site().unwrap().location.as_deref(), Some(location.as_str()), "{report}");
    }
}

fn training_loop_that_keeps_plain_numbers_is_clean(device: &str) {
    let report = leak_test("keeps_numbers", device)
        .run_with_setup(|device| {
            let w = Tensor::randn([32, 32], (Kind::Float, device)).set_requires_grad(true);
            let mut losses = Vec::new();
            move || {
                let x = Tensor::randn([8, 32], (Kind::Float, device));
                let loss = x.matmul(&w).sum(Kind::Float);
                loss.backward();
                let _ = w.grad().zero_();
                losses.push(loss.double_value(&[]));
            }
        })
        .unwrap();
    // The gradient is allocated once, in warm-up.
    assert!(report.passed(), "{report}");
    assert!(matches!(report.verdict, Verdict::OneTimeRetention { during: RetainedDuring::WarmUp, .. }), "{report}");
}

fn gradients_kept_from_backward_get_the_autograd_hint(device: &str) {
    // A fresh leaf each iteration, so backward() allocates its gradient anew;
    // the test keeps the gradients.
    let mut grads = Vec::new();
    let report = leak_test("keeps_gradients", device)
        .run(|device| {
            let w = Tensor::ones([64], (Kind::Float, device)).set_requires_grad(true);
            (&w * 2.0).sum(Kind::Float).backward();
            grads.push(w.grad());
        })
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    let top = report.top_site().unwrap();
    // On the CPU backward runs on the test's thread; on CUDA on autograd's.
    assert!(top.allocated_by.inside_backward || top.allocated_by.on_other_thread, "{report}");
    assert!(report.findings.hints.iter().any(|h| h.contains("inside backward()")), "{report}");
}

fn a_buffer_whose_size_varies_is_bounded_not_a_leak(device: &str) {
    // Sizes that set new highs several times, then fall back.
    let sizes = [100i64, 300, 200, 600, 50, 900, 1200, 100, 700, 400, 1000, 300, 800];
    let mut step = 0;
    let mut buffer: Option<Tensor> = None;
    let report = leak_test("varying_buffer", device)
        .run(|device| {
            buffer = Some(Tensor::zeros([sizes[step % sizes.len()]], (Kind::Float, device)));
            step += 1;
        })
        .unwrap();
    assert!(report.passed(), "{report}");
    assert!(matches!(report.verdict, Verdict::Bounded { .. } | Verdict::OneTimeRetention { .. }), "{report}");
}

fn a_history_grown_with_cat_is_a_leak(device: &str) {
    // One tensor, replaced by a bigger one each iteration: only the latest
    // survives, yet memory grows without bound.
    let mark = &LineMark::default();
    let report = leak_test("history_by_cat", device)
        .run_with_setup(|device| {
            let mut history = Tensor::zeros([0], (Kind::Float, device));
            move || {
                let step = Tensor::ones([256], (Kind::Float, device));
                mark.set(line!()); history = Tensor::cat(&[&history, &step], 0);
            }
        })
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    assert_eq!(report.top_site().unwrap().location.as_deref(), Some(mark.location("tests/detector.rs").as_str()), "{report}");
}

/// One `nn::seq().add_fn(..)` model, a clean training loop and a validation
/// loop that keeps a total as a tensor (with every batch's graph): the sites
/// in the model's closure are named with the validation loop's line, never
/// the training loop's.
fn an_add_fn_model_used_by_two_loops_is_named_at_the_loop_that_keeps_it(device: &str) {
    use tch::nn::{self, Module, OptimizerConfig};
    let (training_line, validation_line) = (&LineMark::default(), &LineMark::default());
    // The model's closure must be 'static: its line is a constant.
    const MODEL_LINE: u32 = line!() + 6;
    let report = leak_test("two_loops", device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let net = nn::seq()
                .add(nn::linear(vs.root() / "l1", 16, 32, Default::default()))
                .add_fn(|x| x.relu() * 2.0)
                .add(nn::linear(vs.root() / "l2", 32, 1, Default::default()));
            let mut opt = nn::Sgd::default().build(&vs, 0.01).unwrap();
            let mut total = Tensor::zeros([], (Kind::Float, device));
            move || {
                let x = Tensor::randn([8, 16], (Kind::Float, device));
                training_line.set(line!()); let loss = net.forward(&x).mean(Kind::Float);
                opt.backward_step(&loss);
                let v = Tensor::randn([8, 16], (Kind::Float, device));
                validation_line.set(line!()); total = &total + net.forward(&v).sum(Kind::Float);
            }
        })
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    let file = "tests/detector.rs";
    // The kept outputs' tensors; their graphs' host objects are judged on
    // their own layer.
    let sites: Vec<_> = report.findings.attribution.as_ref().unwrap().sites.iter().filter(|s| s.layer != Layer::HostObjects).collect();
    let model_location = format!("{file}:{MODEL_LINE}");
    let in_model: Vec<_> = sites.iter().filter(|s| s.location.as_deref() == Some(model_location.as_str())).collect();
    assert!(!in_model.is_empty(), "a site in the model's closure:\n{report}");
    for site in in_model {
        assert_eq!(site.called_from.as_deref(), Some(validation_line.location(file).as_str()), "{report}");
    }
    let training = training_line.location(file);
    assert!(sites.iter().all(|s| s.location.as_deref() != Some(&training) && s.called_from.as_deref() != Some(&training)), "{report}");
    assert!(report.to_string().contains(&format!("called from {}", validation_line.location(file))), "{report}");
}

/// A big leak, exact every iteration, stops confirming once twice the
/// window has shown it: more iterations would only pile up more of it.
fn a_big_exact_leak_stops_confirming_early(device: &str) {
    const BLOCK: i64 = 16 << 20;
    let mut kept = Vec::new();
    let report = leak_test("big_exact_leak", device).run(|device| kept.push(Tensor::zeros([BLOCK / 4], (Kind::Float, device)))).unwrap();
    drop(kept);
    let Verdict::Leak(leak) = &report.verdict else { panic!("{report}") };
    let window = report.settings.iterations;
    assert_eq!(leak.iterations, 2 * window, "{report}");
    assert_eq!(leak.bytes_per_iteration, BLOCK as f64, "{report}");
    assert!(report.to_string().contains(&format!("Ran 2 warm-up + {window} measured + {window} confirmation iterations")), "{report}");
}

on_each_device!(
    a_big_exact_leak_stops_confirming_early,
    an_add_fn_model_used_by_two_loops_is_named_at_the_loop_that_keeps_it,
    gradients_kept_from_backward_get_the_autograd_hint,
    a_buffer_whose_size_varies_is_bounded_not_a_leak,
    a_history_grown_with_cat_is_a_leak,
    kept_tensor_is_a_leak_named_at_its_line,
    clean_twin_passes,
    leak_every_third_iteration_is_caught,
    one_time_retention_passes_and_is_reported,
    panic_is_reported_with_phase_and_iteration,
    out_of_memory_is_a_failure_with_views,
    training_loop_that_keeps_losses_leaks,
    training_loop_that_keeps_plain_numbers_is_clean,
);

#[test]
fn device_cpu_is_the_cpu_even_where_cuda_exists() {
    let report = leak_test("cpu_pinned", "cpu").run(|_| {}).unwrap();
    assert_eq!(report.device, Device::Cpu);
}
