//! No verdict from a blind source: where the source that counts a device
//! does not see a canary allocation, the test fails as "cannot measure",
//! naming the device, the layer and why; it never passes clean. Its own
//! binary, since switching a source off is process-wide.
mod common;

use gpu_leak_test::internals::switches::{switch_off, switch_off_host_objects};
use gpu_leak_test::{report::Layer, LeakTest, Verdict};
use std::sync::{Mutex, MutexGuard};
use tch::{Device, Kind, Tensor};

/// One switched-off source at a time: the switches are process-wide.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static SWITCHES: Mutex<()> = Mutex::new(());
    SWITCHES.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn a_blind_source_fails_as_cannot_measure_in_both_scopes_never_clean() {
    let _switches = one_at_a_time();
    switch_off(Device::Cpu, true);
    let mut kept = Vec::new();
    for scope in ["thread", "process"] {
        let report = LeakTest::new("blind")
            .device(tch::Device::Cpu)
            .scope(scope.parse::<gpu_leak_test::settings::Scope>().unwrap())
            .run(|device| kept.push(Tensor::zeros([64], (Kind::Float, device))))
            .unwrap();
        let Verdict::CannotMeasure { layer, source, reason } = &report.verdict else {
            panic!("a blind source gave a verdict ({scope} scope):\n{report}")
        };
        assert!(!report.passed() && kept.is_empty(), "the body must not run blind:\n{report}");
        assert_eq!(report.verdict_device, Device::Cpu);
        assert!(layer.contains("host memory") && reason.contains("canary") && reason.contains("switched off"), "{report}");
        let expected = if scope == "thread" { "per-thread allocation hook" } else { "counting CPU allocator" };
        assert!(source.contains(expected), "{scope}: {source}");
        let text = report.to_string();
        assert!(text.starts_with("gpu-leak-test: CANNOT MEASURE in `blind`"), "{text}");
        assert!(text.contains("No verdict could be backed") && text.contains("before the body ran"), "{text}");
    }
    // Sighted again, the same body is judged, and the report says what counted.
    switch_off(Device::Cpu, false);
    let report = LeakTest::new("sighted")
        .device(tch::Device::Cpu)
        .scope(gpu_leak_test::settings::Scope::Process)
        .run(|device| kept.push(Tensor::zeros([64], (Kind::Float, device))))
        .unwrap();
    assert!(matches!(report.verdict, Verdict::Leak(_)), "{report}");
    assert_eq!(report.devices[0].source, "the counting CPU allocator", "{report}");
    assert!(report.to_string().contains("counted by the counting CPU allocator") || report.to_string().contains("Counted on cpu by the counting CPU allocator"), "{report}");
}

/// libtorch's host objects made blind on purpose (operator new reports
/// nothing): the FAQ's kept graph would pass as clean, so the test fails
/// as "cannot measure" instead, naming the C++ heap.
#[test]
fn blind_host_objects_fail_as_cannot_measure_in_both_scopes_never_clean() {
    let _switches = one_at_a_time();
    switch_off_host_objects(true);
    let mut ran = false;
    for scope in ["thread", "process"] {
        let report = LeakTest::new("blind_host_objects")
            .device(tch::Device::Cpu)
            .scope(scope.parse::<gpu_leak_test::settings::Scope>().unwrap())
            .run(|device| {
                ran = true;
                drop(Tensor::zeros([64], (Kind::Float, device)));
            })
            .unwrap();
        let Verdict::CannotMeasure { layer, reason, .. } = &report.verdict else {
            panic!("a blind C++ heap gave a verdict ({scope} scope):\n{report}")
        };
        assert!(!report.passed() && !ran, "the body must not run blind:\n{report}");
        assert_eq!(report.verdict_layer, Layer::HostObjects, "{report}");
        assert!(layer.contains("host objects") && reason.contains("TensorImpl") && reason.contains("switched off"), "{report}");
        assert!(report.to_string().contains("CANNOT MEASURE in `blind_host_objects`"), "{report}");
    }
    switch_off_host_objects(false);
    let report = LeakTest::new("host_objects_sighted").device(tch::Device::Cpu).scope(gpu_leak_test::settings::Scope::Process).run(|device| drop(Tensor::zeros([64], (Kind::Float, device)))).unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!(report.judged(Layer::HostObjects).unwrap().source, "operator new (the process's C++ heap)", "{report}");
}

/// Device memory outside libtorch made blind on purpose, and then blinded
/// the way users blind it: a profiler holding CUPTI, which takes one
/// subscriber. Each CUDA test is "cannot measure" with what to do, never
/// clean; with CUPTI free again it is judged.
#[test]
fn blind_driver_calls_and_a_second_cupti_subscriber_fail_as_cannot_measure() {
    let Some(index) = gpu_leak_test::settings::cuda_device_or_skip("blind_driver_calls_and_a_second_cupti_subscriber") else {
        return;
    };
    let _switches = one_at_a_time();
    gpu_leak_test::internals::probe::driver::turn_on();
    let outside = Layer::OutsideLibtorch(Device::Cuda(index));
    let run = |name: &str, scope: &str| {
        LeakTest::new(name)
            .device(tch::Device::Cuda(index))
            .scope(scope.parse::<gpu_leak_test::settings::Scope>().unwrap())
            .run(|device| drop(Tensor::zeros([64], (Kind::Float, device))))
            .unwrap()
    };
    // Where the CUDA allocator reports nothing to the hook (thread scope),
    // or keeps no statistics (caching off), the CUDA tensors too are
    // counted through the driver's calls, and go blind first.
    let blinded = |scope: &str| match common::cuda_tensors_are_cached_blocks() || (scope == "process" && !common::uncached()) {
        true => outside,
        false => Layer::Tensors(Device::Cuda(index)),
    };
    gpu_leak_test::internals::probe::driver::switch_off(true);
    for scope in ["thread", "process"] {
        let report = run("blind_driver_calls", scope);
        let Verdict::CannotMeasure { reason, .. } = &report.verdict else {
            panic!("blind driver calls gave a verdict ({scope} scope):\n{report}")
        };
        assert_eq!(report.verdict_layer, blinded(scope), "{report}");
        assert!(reason.contains("switched off"), "{report}");
    }
    gpu_leak_test::internals::probe::driver::switch_off(false);

    let profiler = gpu_leak_test::internals::probe::driver::ProfilerStandIn::hold_cupti().expect("CUPTI is free");
    for scope in ["thread", "process"] {
        let report = run("second_cupti_subscriber", scope);
        let Verdict::CannotMeasure { reason, .. } = &report.verdict else {
            panic!("a test with CUPTI held by another subscriber gave a verdict ({scope} scope):\n{report}")
        };
        assert_eq!(report.verdict_layer, blinded(scope), "{report}");
        assert!(reason.contains("another CUPTI subscriber") && reason.contains("profiler"), "{report}");
        assert!(report.to_string().contains("CANNOT MEASURE in `second_cupti_subscriber`"), "{report}");
    }
    drop(profiler);
    let report = run("cupti_free_again", "process");
    assert!(report.passed(), "{report}");
    assert!(report.judged(outside).unwrap().source.contains("CUPTI"), "{report}");
}
