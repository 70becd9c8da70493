//! #[gpu_leak_test] in each of its forms. `device = "cpu"` tests run in CI;
//! `auto` tests run on CUDA where there is a GPU.
// Generated code must not warn: a warning in it is a warning in every
// user's test file.
#![deny(warnings)]
use gpu_leak_test::gpu_leak_test;
use rstest::rstest;
use std::sync::Mutex;
use tch::{Device, Kind, Tensor};

static KEPT: Mutex<Vec<Tensor>> = Mutex::new(Vec::new());

#[gpu_leak_test(device = "cpu")]
fn clean_body_passes() {
    let t = Tensor::ones([128], (Kind::Float, Device::Cpu));
    assert_eq!(t.sum(Kind::Float).double_value(&[]), 128.0);
}

#[gpu_leak_test(device = "cpu", iterations = 3, warmup = 1)]
#[should_panic(expected = "LEAK in `leaky_static_fails`")]
fn leaky_static_fails(device: Device) {
    KEPT.lock().unwrap().push(Tensor::zeros([64], (Kind::Float, device)));
}

#[gpu_leak_test(device = "cpu")]
fn setup_form_that_keeps_nothing(device: Device) -> impl FnMut() {
    let weights = Tensor::randn([16, 16], (Kind::Float, device));
    let mut sums = Vec::new();
    move || {
        let x = Tensor::randn([4, 16], (Kind::Float, device));
        // Plain numbers kept across iterations are not tensors: no leak.
        sums.push(x.matmul(&weights).sum(Kind::Float).double_value(&[]));
    }
}

#[gpu_leak_test(device = "cpu")]
#[should_panic(expected = "per iteration")]
fn setup_form_that_keeps_outputs(device: Device) -> impl FnMut() {
    let weights = Tensor::randn([16, 16], (Kind::Float, device));
    let mut outputs = Vec::new();
    move || outputs.push(Tensor::randn([4, 16], (Kind::Float, device)).matmul(&weights))
}

#[gpu_leak_test(device = "cpu", threshold_mb = 1)]
fn small_growth_under_the_threshold_passes(device: Device) -> impl FnMut() {
    let mut kept = Vec::new();
    move || kept.push(Tensor::zeros([256], (Kind::Float, device)))
}

#[gpu_leak_test(device = "cpu")]
fn returning_ok_passes(device: Device) -> Result<(), String> {
    let t = Tensor::zeros([4], (Kind::Float, device));
    if t.size() == [4] {
        Ok(())
    } else {
        Err("wrong size".into())
    }
}

#[gpu_leak_test(device = "cpu", peak_mb = 0.01)]
#[should_panic(expected = "PEAK OVER BUDGET")]
fn peak_over_budget_fails(device: Device) {
    let big = Tensor::zeros([1 << 16], (Kind::Float, device));
    drop(big);
}

// #[gpu_leak_test] goes above #[rstest]: rstest copies attributes below it
// onto each case next to its own #[test].
#[gpu_leak_test(device = "cpu")]
#[rstest]
#[case(8)]
#[case(512)]
fn rstest_cases_run_as_leak_tests(#[case] elements: i64, device: Device) {
    let t = Tensor::zeros([elements], (Kind::Float, device));
    assert_eq!(t.numel() as i64, elements);
}

#[rstest::fixture]
fn batch_size() -> i64 {
    16
}

#[gpu_leak_test(device = "cpu")]
#[rstest]
fn rstest_fixtures_are_injected(batch_size: i64, device: Device) {
    let t = Tensor::zeros([batch_size, 8], (Kind::Float, device));
    assert_eq!(t.size(), [16, 8]);
}

#[gpu_leak_test]
fn auto_device_clean(device: Device) {
    let x = Tensor::randn([64, 64], (Kind::Float, device));
    let _ = x.matmul(&x).sum(Kind::Float).double_value(&[]);
}

#[gpu_leak_test(device = "cuda")]
fn cuda_only_test_skips_without_a_gpu(device: Device) {
    assert!(matches!(device, Device::Cuda(_)));
    let _ = Tensor::ones([8], (Kind::Float, device)).sum(Kind::Float).double_value(&[]);
}

/// `cuda:1` where there is no second GPU: a skip with a clear line, or with
/// GPU_LEAK_TEST_REQUIRE_CUDA=1 a failure that names the device.
#[test]
fn second_gpu_skips_or_fails_clearly() {
    let mut ran_on = None;
    let test = gpu_leak_test::LeakTest::new("on_cuda_1").device(tch::Device::Cuda(1));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| test.check(|device| ran_on = Some(device))));
    let required = std::env::var("GPU_LEAK_TEST_REQUIRE_CUDA")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"));
    match gpu_leak_test::internals::probe::cuda::device_count() {
        n if n >= 2 => assert_eq!((result.is_ok(), ran_on), (true, Some(Device::Cuda(1)))),
        _ if required => {
            let payload = result.expect_err("a required missing device fails");
            let message = payload.downcast_ref::<String>().unwrap();
            assert!(message.contains("cuda:1") && message.contains("GPU_LEAK_TEST_REQUIRE_CUDA"), "{message}");
        }
        _ => assert_eq!((result.is_ok(), ran_on), (true, None), "skipped without running the body"),
    }
}

#[gpu_leak_test(crate = ::gpu_leak_test, device = "cpu", warmup = 0, iterations = 2)]
fn crate_path_option() {}

#[gpu_leak_test(device = "cpu", warmup = 0, iterations = 2)]
fn setup_returning_impl_fn() -> impl Fn() {
    || {}
}

#[gpu_leak_test(device = "cpu", warmup = 0, iterations = 2)]
fn setup_returning_a_boxed_closure(device: Device) -> Box<dyn FnMut()> {
    Box::new(move || drop(Tensor::zeros([4], (Kind::Float, device))))
}

#[gpu_leak_test(device = "cpu", warmup = 0, iterations = 2)]
fn _leading_underscore_name() {}

/// `#[test]` written above `#[gpu_leak_test]` registers the test twice; the
/// second copy to start fails and says where to put the attribute.
#[test]
fn a_test_registered_twice_says_how_to_fix_it() {
    // One call site, as both registrations share the attribute's location.
    let run = || gpu_leak_test::LeakTest::for_test_function("registered_twice", module_path!()).device(tch::Device::Cpu).check(|_| {});
    run();
    let second = std::panic::catch_unwind(run);
    let message = second.expect_err("the second registration fails").downcast::<String>().unwrap();
    assert!(message.contains("registered twice") && message.contains("Put `#[gpu_leak_test]` first"), "{message}");
}

/// `#[tensor_refs(crate = path)]` for a renamed dependency.
#[test]
fn derive_takes_a_renamed_crate_path() {
    use gpu_leak_test as renamed;
    #[derive(renamed::TensorRefs)]
    #[tensor_refs(crate = renamed)]
    struct State {
        weights: Tensor,
        #[tensor_refs(skip)]
        _steps: usize,
    }
    let state = State { weights: Tensor::zeros([2], (Kind::Float, Device::Cpu)), _steps: 0 };
    let mut seen = Vec::new();
    renamed::TensorRefs::for_each_tensor(&state, &mut "state".to_string(), &mut |path, _| seen.push(path.to_string()));
    assert_eq!(seen, ["state.weights"]);
}

/// A `where` clause stays on the body's function, where its bounds apply.
#[gpu_leak_test::gpu_leak_test(device = "cpu", iterations = 2)]
fn a_where_clause_is_kept()
where
    Vec<u8>: Clone,
{
    let _ = Vec::<u8>::new().clone();
}
