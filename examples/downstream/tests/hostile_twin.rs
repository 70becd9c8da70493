//! `bl_plain` again, in a second test binary with a step a hundred times
//! smaller: against the other's baseline it would pass at -99%, or fail.
use gpu_leak_test::gpu_leak_test;
use tch::{Device, Kind, Tensor};

#[gpu_leak_test(device = "cpu", baseline = true, baseline_tolerance_pct = 0)]
fn bl_plain(device: Device) {
    let _ = Tensor::ones([500], (Kind::Float, device)).sum(Kind::Float).double_value(&[]);
}
