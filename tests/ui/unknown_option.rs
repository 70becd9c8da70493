use gpu_leak_test::gpu_leak_test;

#[gpu_leak_test(threshold_mb = 1.0, iteratons = 5)]
fn misspelled() {}

fn main() {}

#[gpu_leak_test(plots = "all")]
fn a_suite_setting() {}

#[gpu_leak_test(baselines = "update")]
fn the_baseline_mode_is_the_suites() {}
