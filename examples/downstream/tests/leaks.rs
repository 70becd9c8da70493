//! A downstream crate's leak tests: a clean training step, one that keeps
//! every loss (the leak the README's first example shows), one that keeps
//! every graph through a running tensor sum, and a kept tensor named at its
//! line.
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

/// The FAQ's loop, `total = total + loss` after `backward()`: each step's
/// graph stays reachable from `total`, so libtorch's host objects (autograd
/// nodes, saved-variable records) grow. The tensor itself stays one scalar.
#[gpu_leak_test]
#[should_panic(expected = "libtorch's host objects")]
fn summing_losses_as_tensors_keeps_every_graph(device: Device) -> impl FnMut() {
    let (_vs, net, mut opt) = model(device);
    let mut total = Tensor::zeros([], (Kind::Float, device));
    move || {
        let loss = net.forward(&Tensor::randn([8, 32], (Kind::Float, device))).square().mean(Kind::Float);
        opt.backward_step(&loss);
        total = &total + loss;
    }
}

/// A tensor kept every step fails, and the report names the line that
/// allocated it: checked on the report itself, as a user's own test can.
#[test]
fn a_kept_tensor_fails_naming_its_line() {
    let mut kept: Vec<Tensor> = Vec::new();
    let mut line = 0;
    let report = gpu_leak_test::LeakTest::new("a_kept_tensor_fails_naming_its_line")
        .run(|device| {
            line = line!() + 1;
            kept.push(Tensor::ones([1024], (Kind::Float, device)));
        })
        .expect("the leak test ran");
    assert!(!report.passed(), "a kept tensor is a leak:\n{report}");
    // Relative to the crate under `cargo test`; from an archive run in
    // another folder, the build's path (a builder without `.location(..)`
    // does not know the crate's folder at build time).
    let site = report.top_site().and_then(|site| site.location.clone()).unwrap_or_default();
    assert!(site.ends_with(&format!("tests/leaks.rs:{line}")), "the site is the line that allocates, not {site}\n{report}");
}
