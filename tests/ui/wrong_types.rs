use gpu_leak_test::gpu_leak_test;

#[gpu_leak_test(threshold_mb = "1")]
fn threshold_as_string() {}

#[gpu_leak_test(iterations = 2.5)]
fn fractional_iterations() {}

#[gpu_leak_test(device = cuda)]
fn device_not_a_string() {}

#[gpu_leak_test(device = "gpu")]
fn unknown_device() {}

#[gpu_leak_test(iterations = 0)]
fn zero_iterations() {}

#[gpu_leak_test(baseline = 1)]
fn baseline_not_a_bool() {}

#[gpu_leak_test(baseline_tolerance_pct = "5%")]
fn tolerance_as_string() {}

fn main() {}
