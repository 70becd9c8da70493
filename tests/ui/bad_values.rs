use gpu_leak_test::gpu_leak_test;

#[gpu_leak_test(threshold_mb = 1e400)]
fn infinite_threshold() {}

#[gpu_leak_test(threshold_mb = -1.0)]
fn negative_threshold() {}

#[gpu_leak_test(peak_mb = 0)]
fn zero_peak() {}

#[gpu_leak_test(scope = "global")]
fn unknown_scope() {}

#[gpu_leak_test(baseline_tolerance_pct = -5)]
fn negative_tolerance() {}

#[gpu_leak_test]
fn returns_a_number() -> u32 {
    1
}

fn main() {}
