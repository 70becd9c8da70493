//! A binary whose own global allocator is wrapped in the documented line:
//! the Rust heap is judged as it is with the default feature.
use gpu_leak_test::gpu_leak_test;
use gpu_leak_test::settings::RustHeap;
use std::alloc::System;
use tch::{Device, Kind, Tensor};

#[global_allocator]
static ALLOCATOR: RustHeap<System> = RustHeap::new(System);

#[gpu_leak_test]
#[should_panic(expected = "on cpu (the Rust heap)")]
fn a_pipeline_that_keeps_every_decoded_sample_leaks(device: Device) -> impl FnMut() {
    let mut cache: Vec<Vec<f32>> = Vec::new();
    move || {
        let sample: Vec<f32> = vec![0.5; 65_536];
        let _ = Tensor::from_slice(&sample).to_device(device).sum(Kind::Float).double_value(&[]);
        cache.push(sample);
    }
}

#[gpu_leak_test]
fn a_loop_that_logs_one_f64_per_step_passes(device: Device) -> impl FnMut() {
    let mut losses: Vec<f64> = Vec::new();
    move || losses.push(Tensor::randn([64], (Kind::Float, device)).square().mean(Kind::Float).double_value(&[]))
}
