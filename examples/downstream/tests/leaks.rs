//! A downstream crate's leak tests: a clean training step, and one that
//! keeps every loss (the leak the README's first example shows).
use gpu_leak_test::gpu_leak_test;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

fn model(device: Device) -> (nn::VarStore, nn::Sequential, nn::Optimizer) {
    let vs = nn::VarStore::new(device);
    let net = nn::seq()
        .add(nn::linear(vs.root() / "l1", 32, 64, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(vs.root() / "l2", 64, 4, Default::default()));
    let opt = nn::Sgd::default().build(&vs, 0.01).unwrap();
    (vs, net, opt)
}

#[gpu_leak_test]
fn training_step_keeps_plain_numbers(device: Device) -> impl FnMut() {
    let (_vs, net, mut opt) = model(device);
    let mut losses: Vec<f64> = Vec::new();
    move || {
        let loss = net.forward(&Tensor::randn([8, 32], (Kind::Float, device))).square().mean(Kind::Float);
        opt.backward_step(&loss);
        losses.push(loss.double_value(&[]));
    }
}

#[gpu_leak_test]
#[should_panic(expected = "LEAK")]
fn training_step_that_keeps_losses_leaks(device: Device) -> impl FnMut() {
    let (_vs, net, mut opt) = model(device);
    let mut losses: Vec<Tensor> = Vec::new();
    move || {
        let loss = net.forward(&Tensor::randn([8, 32], (Kind::Float, device))).square().mean(Kind::Float);
        opt.backward_step(&loss);
        losses.push(loss);
    }
}
