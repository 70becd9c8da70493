//! Names that once made two tests share one baseline file: two Unicode
//! names that clean to the same letters, and (with `hostile_twin.rs`) one
//! name in two test binaries. `scripts/downstream-check.sh` writes their
//! baselines, then requires them: each test must pass against its own.
// The Greek letters are the point: names that clean to the same ASCII.
#![allow(mixed_script_confusables)]
use gpu_leak_test::gpu_leak_test;
use tch::{Device, Kind, Tensor};

/// A step of `floats` f32 activations, freed at its end.
fn step(device: Device, floats: i64) {
    let _ = Tensor::ones([floats], (Kind::Float, device)).sum(Kind::Float).double_value(&[]);
}

#[gpu_leak_test(device = "cpu", baseline = true, baseline_tolerance_pct = 0)]
fn бл_α(device: Device) {
    step(device, 100_000);
}

#[gpu_leak_test(device = "cpu", baseline = true, baseline_tolerance_pct = 0)]
fn бл_β(device: Device) {
    step(device, 1_000);
}

#[gpu_leak_test(device = "cpu", baseline = true, baseline_tolerance_pct = 0)]
fn bl_plain(device: Device) {
    step(device, 50_000);
}
