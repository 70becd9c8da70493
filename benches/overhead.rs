//! What the harness costs and how small a leak it sees.
//!
//! `cargo bench --bench overhead` (or `scripts/bench.sh`) prints Markdown:
//!
//! 1. One training step three ways, alternating within each round: plain
//!    (no hook installed at all); counting (the hook of a passing leak
//!    test); attribution forced on (a stack captured for every allocation).
//!    Ratios to plain, median with min and max over the rounds. On CUDA the
//!    step is an MLP 1024-4096-4096-10, batch 256, Adam; on the CPU an MLP
//!    256-512-512-10, batch 64, Adam.
//! 2. The cost of one stack capture, caching unwinder against libgcc's.
//! 3. Sensitivity: the smallest per-iteration leak flagged, from a sweep
//!    starting at one element.
//! 4. False alarms over 1,000 runs of a varied clean scenario, and over
//!    1,000 runs of bounded shapes: plateaus that settle within the window
//!    and sawtooths of every period up to the window, in every phase.
//! 5. Misses over 1,000 runs of leaks every k-th iteration, k from 1 to
//!    half the window, in every phase.
//!
//! Run without `--bench` (as `cargo test --benches` does) it only smoke-tests
//! each part with tiny counts.
use gpu_leak_test::internals::probe::process::Observation;
use gpu_leak_test::internals::probe::{cuda, stacks::Stack, Tracker};
use gpu_leak_test::{LeakTest, Verdict};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

struct Scale {
    rounds: usize,
    steps_per_round: usize,
    false_alarm_runs: usize,
    captures: usize,
}

const FULL: Scale = Scale { rounds: 21, steps_per_round: 40, false_alarm_runs: 1000, captures: 2000 };
const SMOKE: Scale = Scale { rounds: 2, steps_per_round: 2, false_alarm_runs: 8, captures: 20 };

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        cuda::synchronize(i).unwrap();
    }
}

struct Step {
    model: nn::Sequential,
    opt: nn::Optimizer,
    x: Tensor,
    y: Tensor,
    _vs: nn::VarStore,
}

impl Step {
    fn new(device: Device) -> Step {
        let (sizes, batch): (&[i64], i64) =
            if device.is_cuda() { (&[1024, 4096, 4096, 10], 256) } else { (&[256, 512, 512, 10], 64) };
        let vs = nn::VarStore::new(device);
        let mut model = nn::seq();
        for (i, w) in sizes.windows(2).enumerate() {
            if i > 0 {
                model = model.add_fn(|x| x.relu());
            }
            model = model.add(nn::linear(vs.root() / format!("l{i}"), w[0], w[1], Default::default()));
        }
        let opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
        let x = Tensor::randn([batch, sizes[0]], (Kind::Float, device));
        let y = Tensor::randint(10, [batch], (Kind::Int64, device));
        Step { model, opt, x, y, _vs: vs }
    }

    fn run(&mut self) {
        let loss = self.model.forward(&self.x).cross_entropy_for_logits(&self.y);
        self.opt.backward_step(&loss);
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Variant {
    Plain,
    Counting,
    /// Every thread counted: the counting CPU allocator and the CUDA trace
    /// tracker feed a tracker.
    Process,
    Attribution,
}

/// Seconds per step for `steps` steps of one variant.
fn time_variant(step: &mut Step, device: Device, variant: Variant, steps: usize) -> f64 {
    let observation = (variant == Variant::Process).then(|| Observation::open(true).unwrap());
    let tracker = Tracker::new();
    let hook = matches!(variant, Variant::Counting | Variant::Attribution).then(|| tracker.enter().unwrap());
    if variant == Variant::Attribution {
        tracker.start_recording(1);
    }
    sync(device);
    let start = Instant::now();
    // As inside a leak test: stack walks end at the harness's frame.
    gpu_leak_test::internals::probe::stacks::stop_walks_here(|| {
        for _ in 0..steps {
            step.run();
        }
    });
    sync(device);
    let elapsed = start.elapsed().as_secs_f64() / steps as f64;
    tracker.stop_recording();
    drop(hook);
    drop(observation);
    elapsed
}

fn summary(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (values[values.len() / 2], values[0], values[values.len() - 1])
}

fn step_overhead(device: Device, scale: &Scale) {
    let mut step = Step::new(device);
    // Warm-up: optimizer state, workspaces, the unwinder's module list.
    let variants = [Variant::Plain, Variant::Counting, Variant::Process, Variant::Attribution];
    for variant in variants {
        time_variant(&mut step, device, variant, 3);
    }
    let mut plain_times = Vec::new();
    let mut ratios: [Vec<f64>; 3] = Default::default();
    for round in 0..scale.rounds {
        let mut times = [0.0; 4];
        for k in 0..variants.len() {
            // Rotate the order every round so drift hits every variant alike.
            let index = (k + round) % variants.len();
            times[index] = time_variant(&mut step, device, variants[index], scale.steps_per_round);
        }
        plain_times.push(times[0]);
        for v in 1..variants.len() {
            ratios[v - 1].push(times[v] / times[0]);
        }
    }
    // Allocator events per step, from the hook itself.
    let tracker = Tracker::new();
    {
        let _hook = tracker.enter().unwrap();
        step.run();
        sync(device);
    }
    let view = tracker.view(device);
    // How well the unwinder's rule cache serves one step with attribution.
    let before = gpu_leak_test::internals::probe::stacks::unwinder_cache_stats().unwrap_or_default();
    time_variant(&mut step, device, Variant::Attribution, 1);
    let after = gpu_leak_test::internals::probe::stacks::unwinder_cache_stats().unwrap_or_default();
    let (hits, collisions, other) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    let (plain, _, _) = summary(&mut plain_times);
    println!("### One training step on {device:?}\n");
    println!(
        "{} rounds of {} steps per variant, variants alternating; plain step {:.3} ms (median); {} allocations and {} frees per step on the device.\n",
        scale.rounds,
        scale.steps_per_round,
        plain * 1e3,
        view.allocations,
        view.frees
    );
    println!(
        "Unwinder rule cache over one step with attribution, on the test's thread: {hits} hits, {collisions} misses from slot collisions, {other} other misses.\n"
    );
    println!("| variant | ratio to plain: median | min | max |\n| --- | --- | --- | --- |");
    println!("| plain (no hook) | 1.000 | | |");
    let names = [
        "passing leak test, thread scope (hook, counting)",
        "passing leak test, process scope (every thread, counting)",
        "attribution forced on (stack per allocation)",
    ];
    for (name, r) in names.into_iter().zip(ratios.iter_mut()) {
        let (median, min, max) = summary(r);
        println!("| {name} | {median:.3} | {min:.3} | {max:.3} |");
    }
    println!();
}

#[inline(never)]
fn at_depth<T>(depth: usize, f: &mut dyn FnMut() -> T) -> T {
    if depth == 0 {
        f()
    } else {
        let value = at_depth(depth - 1, f);
        std::hint::black_box(&value);
        value
    }
}

fn capture_cost(scale: &Scale) {
    println!("### One stack capture, 50 frames deep\n");
    println!("| unwinder | µs per capture | frames |\n| --- | --- | --- |");
    let fast = |_: ()| Stack::capture(96);
    let slow = |_: ()| Stack::capture_with_libgcc(96);
    for (name, capture) in [("caching (framehop)", &fast as &dyn Fn(()) -> Stack), ("libgcc (backtrace)", &slow)] {
        let frames = at_depth(40, &mut || capture(())).ips().len();
        let start = Instant::now();
        for _ in 0..scale.captures {
            std::hint::black_box(at_depth(40, &mut || capture(())));
        }
        let micros = start.elapsed().as_secs_f64() * 1e6 / scale.captures as f64;
        println!("| {name} | {micros:.2} | {frames} |");
    }
    println!();
}

fn sensitivity(device: Device, name: &str) {
    let mut flagged = None;
    let mut elements = 1i64;
    while elements <= 1 << 16 {
        let mut kept = Vec::new();
        let report = LeakTest::new(format!("sweep_{elements}"))
            .device(name)
            .attribution_iterations(1)
            .run(|device| kept.push(Tensor::zeros([elements], (Kind::Float, device))))
            .unwrap();
        if let Verdict::Leak(leak) = &report.verdict {
            flagged = Some((elements, leak.bytes_per_iteration));
            break;
        }
        elements *= 2;
    }
    match flagged {
        Some((elements, bytes)) => println!(
            "| {device:?} | {elements} f32 element{} | {bytes} B per iteration |",
            if elements == 1 { "" } else { "s" }
        ),
        None => println!("| {device:?} | none up to 65,536 elements | |"),
    }
}

/// A clean scenario that varies everything a noisy detector trips on.
fn varied_clean_run(name: &str, device: &str, seed: u64) -> Verdict {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as i64
    };
    let mut cache: Option<Tensor> = None;
    LeakTest::new(name)
        .device(device)
        // Four at once next to an unhooked noise thread: the scope that
        // keeps parallel tests apart.
        .scope("thread")
        .run(|device| {
            // Shapes that change every iteration.
            let rows = 1 + next() % 64;
            let cols = 1 + next() % 256;
            let a = Tensor::randn([rows, cols], (Kind::Float, device));
            let b = a.matmul(&a.tr()).relu().sum(Kind::Float);
            let _ = b.double_value(&[]);
            // A bounded buffer replaced every iteration.
            cache = Some(Tensor::zeros([1 + next() % 128], (Kind::Float, device)));
            // Work on a helper thread that the test does not own.
            if next() % 4 == 0 {
                std::thread::spawn(move || Tensor::ones([257], (Kind::Float, Device::Cpu)).sum(Kind::Float).double_value(&[]))
                    .join()
                    .unwrap();
            }
        })
        .unwrap()
        .verdict
}

/// A small xorshift generator: the benchmark's shapes are random but
/// reproducible.
struct Random(u64);

impl Random {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

const SHAPE_WINDOW: u32 = 10;
const SHAPE_WARMUP: u32 = 2;

/// One run of a scripted shape: the body keeps `kept(i)` blocks of `bytes`
/// after iteration `i` (1-based, warm-up included).
fn shape_run(name: &str, device: &str, elements: i64, kept: impl Fn(u32) -> usize) -> Verdict {
    let mut held: Vec<Tensor> = Vec::new();
    let mut iteration = 0u32;
    LeakTest::new(name)
        .device(device)
        .scope("thread")
        .warmup(SHAPE_WARMUP)
        .iterations(SHAPE_WINDOW)
        .run(|device| {
            iteration += 1;
            let want = kept(iteration);
            held.truncate(want);
            while held.len() < want {
                held.push(Tensor::zeros([elements], (Kind::Float, device)));
            }
        })
        .unwrap()
        .verdict
}

/// Bounded shapes that must pass: plateaus that settle within the window,
/// and sawtooths (build up over p - 1 iterations, release on the p-th) of
/// every period up to the window plus one, in every phase.
fn bounded_shape_alarms(device: &str, runs: usize) -> (usize, usize) {
    let mut random = Random(0x9e3779b97f4a7c15);
    let mut alarms = 0;
    for run in 0..runs {
        let elements = 1 + random.below(512) as i64;
        let verdict = if run % 2 == 0 {
            let settle = SHAPE_WARMUP + 1 + random.below(SHAPE_WINDOW as u64) as u32;
            let step = 1 + random.below(3) as usize;
            shape_run("plateau", device, elements, move |i| step * i.min(settle) as usize)
        } else {
            let period = 2 + random.below(SHAPE_WINDOW as u64) as u32;
            let phase = random.below(period as u64) as u32;
            shape_run("sawtooth", device, elements, move |i| ((i + phase) % period) as usize)
        };
        alarms += usize::from(verdict.is_failure());
    }
    (alarms, runs)
}

/// Leaks every k-th iteration, k from 1 to half the window, in every phase:
/// each must fail.
fn periodic_leak_misses(device: &str, runs: usize) -> Vec<(u32, usize, usize)> {
    let mut random = Random(0x2545f4914f6cdd1d);
    let ks = SHAPE_WINDOW / 2;
    (1..=ks)
        .map(|k| {
            let per_k = runs.div_ceil(ks as usize);
            let misses = (0..per_k)
                .filter(|_| {
                    let elements = 1 + random.below(256) as i64;
                    let phase = random.below(k as u64) as u32;
                    let verdict = shape_run("every_k", device, elements, move |i| ((i + phase) / k) as usize);
                    !matches!(verdict, Verdict::Leak(_))
                })
                .count();
            (k, misses, per_k)
        })
        .collect()
}

fn false_alarms(device: &str, runs: usize) -> (usize, usize) {
    // Noise: a thread allocating and keeping tensors, never hooked.
    let stop = Arc::new(AtomicBool::new(false));
    let noise = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                held.push(Tensor::randn([1024], (Kind::Float, Device::Cpu)));
                if held.len() > 64 {
                    held.clear();
                }
            }
        })
    };
    // Four test threads at once, as `cargo test` runs them.
    let threads = 4;
    let per_thread = runs.div_ceil(threads);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let device = device.to_string();
            std::thread::spawn(move || {
                (0..per_thread)
                    .filter(|i| {
                        let verdict = varied_clean_run(&format!("clean_{t}_{i}"), &device, (t * 100_000 + i) as u64);
                        verdict.is_failure()
                    })
                    .count()
            })
        })
        .collect();
    let alarms = handles.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    noise.join().unwrap();
    (alarms, per_thread * threads)
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let scale = if full { &FULL } else { &SMOKE };
    let has_cuda = cuda::is_available();
    println!("## gpu-leak-test overhead and sensitivity\n");
    println!(
        "Machine: {} CPU threads{}.\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        if has_cuda { format!(", {} CUDA device(s)", cuda::device_count()) } else { ", no CUDA".into() }
    );
    let mut devices = vec![Device::Cpu];
    if has_cuda {
        devices.push(Device::Cuda(0));
    }
    for &device in &devices {
        step_overhead(device, scale);
    }
    capture_cost(scale);
    println!("### Smallest leak flagged (threshold 0, sweep from one element, doubling)\n");
    println!("| device | smallest leak flagged | as measured |\n| --- | --- | --- |");
    sensitivity(Device::Cpu, "cpu");
    if has_cuda {
        sensitivity(Device::Cuda(0), "cuda");
    }
    println!("\n### False alarms on a varied clean scenario\n");
    println!("Shapes change every iteration, a buffer is replaced every iteration, some iterations work on a helper thread, four leak tests run at once, and a thread allocates without the hook all along.\n");
    println!("| device | runs | false alarms |\n| --- | --- | --- |");
    for device in if has_cuda { vec!["cpu", "cuda"] } else { vec!["cpu"] } {
        let (alarms, runs) = false_alarms(device, scale.false_alarm_runs);
        println!("| {device} | {runs} | {alarms} |");
        assert!(full || alarms == 0, "false alarms in the smoke run");
    }
    println!("\n### Bounded shapes and periodic leaks (warm-up {SHAPE_WARMUP}, window {SHAPE_WINDOW}, threshold 0)\n");
    println!(
        "Plateaus settle at a random measured iteration within the window; sawtooths have periods 2 to {} in a random phase; \
         leaks keep a random-sized tensor every k-th iteration in a random phase.\n",
        SHAPE_WINDOW + 1
    );
    println!("| device | shapes | runs | wrong verdicts |\n| --- | --- | --- | --- |");
    for device in if has_cuda { vec!["cpu", "cuda"] } else { vec!["cpu"] } {
        let (alarms, runs) = bounded_shape_alarms(device, scale.false_alarm_runs);
        println!("| {device} | plateaus and sawtooths (false alarms) | {runs} | {alarms} |");
        assert!(full || alarms == 0, "false alarms on bounded shapes in the smoke run");
        for (k, misses, runs) in periodic_leak_misses(device, scale.false_alarm_runs) {
            println!("| {device} | leak every {k} iteration{} (misses) | {runs} | {misses} |", if k == 1 { "" } else { "s" });
            assert!(full || misses == 0, "missed leaks in the smoke run");
        }
    }
}
