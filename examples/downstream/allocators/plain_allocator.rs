//! A binary with a global allocator of its own, not wrapped: the Rust heap
//! is not counted, the other layers still are, and the report says so.
use gpu_leak_test::gpu_leak_test;
use std::alloc::System;
use tch::{Device, Kind, Tensor};

#[global_allocator]
static ALLOCATOR: System = System;

#[gpu_leak_test]
fn a_loop_that_logs_one_f64_per_step_passes(device: Device) -> impl FnMut() {
    let mut losses: Vec<f64> = Vec::new();
    move || losses.push(Tensor::randn([64], (Kind::Float, device)).square().mean(Kind::Float).double_value(&[]))
}

#[gpu_leak_test]
#[should_panic(expected = "LEAK")]
fn a_kept_tensor_still_fails(device: Device) -> impl FnMut() {
    let mut kept: Vec<Tensor> = Vec::new();
    move || kept.push(Tensor::ones([256], (Kind::Float, device)))
}
