//! Leak tests in parallel threads, next to threads that allocate without the
//! hook, give the verdicts they give one at a time.
use gpu_leak_test::{LeakTest, Verdict};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tch::{Device, Kind, Tensor};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Body {
    Clean,
    KeepsEachIteration(i64),
    KeepsOnce(i64),
}

fn run(body: Body, name: String) -> Verdict {
    let mut kept = Vec::new();
    // Thread scope on purpose: this is the scope that keeps parallel tests
    // apart (process scope would serialise them and count the noise).
    let report = LeakTest::new(name)
        .device(tch::Device::Cpu)
        .scope(gpu_leak_test::settings::Scope::Thread)
        .run(|device| match body {
            Body::Clean => {
                let _ = Tensor::ones([300], (Kind::Float, device)).sum(Kind::Float).double_value(&[]);
            }
            Body::KeepsEachIteration(n) => kept.push(Tensor::zeros([n], (Kind::Float, device))),
            Body::KeepsOnce(n) => {
                if kept.is_empty() {
                    kept.push(Tensor::zeros([n], (Kind::Float, device)))
                }
            }
        })
        .unwrap();
    report.verdict
}

/// Drops attribution-irrelevant details so verdicts compare across runs.
fn summary(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Leak(leak) => format!("leak {} B/iteration", leak.bytes_per_iteration),
        other => format!("{other:?}"),
    }
}

#[test]
fn parallel_leak_tests_agree_with_sequential_ones() {
    let bodies = [
        Body::Clean,
        Body::KeepsEachIteration(10),
        Body::KeepsOnce(1000),
        Body::KeepsEachIteration(777),
        Body::Clean,
        Body::KeepsOnce(5),
    ];
    let sequential: Vec<String> = bodies.iter().enumerate().map(|(i, b)| summary(&run(*b, format!("seq{i}")))).collect();

    // Noise: threads that allocate and keep tensors without any hook.
    let stop = Arc::new(AtomicBool::new(false));
    let noise: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    held.push(Tensor::randn([512], (Kind::Float, Device::Cpu)));
                    if held.len() > 50 {
                        held.clear();
                    }
                }
            })
        })
        .collect();
    for round in 0..3 {
        let handles: Vec<_> = bodies
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let b = *b;
                std::thread::spawn(move || summary(&run(b, format!("par{round}_{i}"))))
            })
            .collect();
        let parallel: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(parallel, sequential, "round {round}");
    }
    stop.store(true, Ordering::Relaxed);
    noise.into_iter().for_each(|h| h.join().unwrap());
}
