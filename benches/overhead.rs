//! What the harness costs and how small a leak it sees.
//!
//! `cargo bench --bench overhead` (or `scripts/bench.sh`) prints Markdown:
//!
//! 1. Two training steps four ways each, taking turns within each round in
//!    an order that changes every turn (`turn_order`):
//!    plain (no hook installed at all); a passing leak test in thread scope
//!    (the hook, counting); in process scope (every thread, through the
//!    counting CPU allocator and the CUDA trace tracker); attribution forced
//!    on (a stack captured for every allocation). Ratios to plain, median
//!    with min and max over the rounds, and the cost per allocator event.
//!    The GPU-bound step is an MLP with Adam (1024-4096-4096-10 at batch 256
//!    on CUDA, 256-512-512-10 at batch 64 on the CPU); the allocation-heavy
//!    step an LSTM cell unrolled over 64 time steps at batch 8, hidden 256,
//!    with Adam: thousands of allocator events per step.
//!    Then each variant's cost per allocator event in a loop that does
//!    nothing else, and the tracker's callback alone; and (`host-objects`)
//!    what counting libtorch's host objects adds to an operator new and
//!    delete pair, freed on the same thread or on another.
//! 2. The cost of one stack capture, caching unwinder against libgcc's, and
//!    of writing a report into a folder of 10 or 10,000 earlier ones; and
//!    (`queues`) what growing autograd's ready queues costs in a fresh
//!    process, on a first call and on later ones, for few tasks and many.
//! 3. Sensitivity: the smallest per-iteration leak flagged, from a sweep
//!    starting at one element.
//! 4. False alarms over 1,000 runs of a varied clean scenario, and over
//!    1,000 runs of bounded shapes: plateaus that settle within the window
//!    and sawtooths of every period up to the window, in every phase.
//! 5. Misses over 1,000 runs of leaks every k-th iteration, k from 1 to
//!    half the window, in every phase.
//! 6. Long windows: the harness's cost per iteration of a tiny body at
//!    1,000 and 100,000 iterations, clean, and for a leak at 1,000 and
//!    10,000 (which confirms for twice its window).
//!
//! Sections can be named to run only them: `overhead --bench heavy step`
//! (the names are in `SECTIONS`); `--runs=10000` sets the clean runs of the
//! false-alarm section, and each false alarm prints its seed and report;
//! `--rounds=N` sets the step sections' rounds, `--round-seconds=S` how long
//! each variant runs per round (0.3 s), `--block-steps=N` has the variants
//! take turns every N steps within a round, and `--counting-only` runs only
//! the counting target's variants there, so many rounds fit, with plain
//! again as a variant of its own, whose ratio is the run's own bias and
//! noise between variants (`--target-only`: only all layers against plain,
//! and plain again, so still more rounds fit; `--attribution-only`: only
//! attribution forced on, in thread and in process scope, against plain,
//! and plain again); `--devices=cuda`
//! (or `cpu`) runs the step sections on that device only, for a profiler.
//! `--save-rounds=FILE` appends every round's ratios of the step sections,
//! with plain's step time, to FILE as they come, and `overhead --pool-rounds
//! FILE...` prints the table of the rounds of several runs together: where
//! one run cannot hold enough rounds for an interval inside a target's margin.
//! `--save-blocks=FILE` appends each block's time per step, and `overhead
//! --pool-blocks FILE...` prints what moves a round's ratio: each variant's
//! spread of block times, and the rounds' ratios with each variant's slowest
//! block left out, beside the ratios as measured.
//!
//! Run without `--bench` (as `cargo test --benches` does) it only smoke-tests
//! each part with tiny counts.
use gpu_leak_test::internals::probe::process::Observation;
use gpu_leak_test::internals::probe::{cuda, stacks::Stack, Tracker};
use gpu_leak_test::{LeakTest, Verdict};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

#[derive(Clone, Copy)]
struct Scale {
    rounds: usize,
    /// Seconds each variant runs per round, and the most steps that takes.
    round_seconds: f64,
    steps_per_round: usize,
    /// Steps per block where a round's variants alternate block by block
    /// (`--block-steps=N`), so the host's drift within the round falls on
    /// every variant alike; `None`: each variant runs its round in one go.
    block_steps: Option<usize>,
    false_alarm_runs: usize,
    captures: usize,
    /// Earlier reports in the folder for the index's cost.
    old_reports: usize,
    /// Batches of 4,096 operator new and delete pairs per variant and round.
    host_object_batches: usize,
}

const FULL: Scale = Scale {
    rounds: 21,
    round_seconds: 0.3,
    steps_per_round: 40,
    block_steps: None,
    false_alarm_runs: 1000,
    captures: 2000,
    old_reports: 10_000,
    host_object_batches: 40,
};
const SMOKE: Scale = Scale {
    rounds: 2,
    round_seconds: 0.3,
    steps_per_round: 2,
    block_steps: None,
    false_alarm_runs: 8,
    captures: 20,
    old_reports: 40,
    host_object_batches: 2,
};

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        cuda::synchronize(i).unwrap();
    }
}

/// A training step whose overhead is measured.
trait TrainingStep {
    fn run(&mut self);
    /// What the step is, for the table's heading.
    fn describe(&self) -> String;
}

/// The GPU-bound step: an MLP, Adam. On CUDA 1024-4096-4096-10 at batch
/// 256; on the CPU 256-512-512-10 at batch 64.
struct MlpStep {
    model: nn::Sequential,
    opt: nn::Optimizer,
    x: Tensor,
    y: Tensor,
    _vs: nn::VarStore,
}

impl MlpStep {
    fn new(device: Device) -> MlpStep {
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
        MlpStep { model, opt, x, y, _vs: vs }
    }
}

impl TrainingStep for MlpStep {
    fn run(&mut self) {
        let loss = self.model.forward(&self.x).cross_entropy_for_logits(&self.y);
        self.opt.backward_step(&loss);
    }

    fn describe(&self) -> String {
        "One training step (MLP, Adam)".into()
    }
}

/// Time steps, batch, input and hidden size of the allocation-heavy step.
const LSTM_SHAPE: (i64, i64, i64, i64) = (64, 8, 256, 256);

/// The allocation-heavy step: an LSTM cell unrolled over 64 time steps at
/// batch 8, input and hidden size 256, a linear head, cross-entropy, Adam.
/// Every cell op is a small kernel and a fresh tensor, so allocator events
/// (thousands per step) are a large share of the step's CPU time.
/// `benches/anchors/pytorch_step.py --model lstm` is the same step in PyTorch.
struct LstmStep {
    w_ih: Tensor,
    w_hh: Tensor,
    bias: Tensor,
    head: nn::Linear,
    opt: nn::Optimizer,
    x: Tensor,
    y: Tensor,
    _vs: nn::VarStore,
}

impl LstmStep {
    fn new(device: Device) -> LstmStep {
        let (steps, batch, input, hidden) = LSTM_SHAPE;
        let vs = nn::VarStore::new(device);
        let root = vs.root();
        let bound = 1.0 / (hidden as f64).sqrt();
        let uniform = nn::Init::Uniform { lo: -bound, up: bound };
        let w_ih = root.var("w_ih", &[input, 4 * hidden], uniform);
        let w_hh = root.var("w_hh", &[hidden, 4 * hidden], uniform);
        let bias = root.var("bias", &[4 * hidden], uniform);
        let head = nn::linear(&root / "head", hidden, 10, Default::default());
        let opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
        let x = Tensor::randn([steps, batch, input], (Kind::Float, device));
        let y = Tensor::randint(10, [batch], (Kind::Int64, device));
        LstmStep { w_ih, w_hh, bias, head, opt, x, y, _vs: vs }
    }
}

impl TrainingStep for LstmStep {
    fn run(&mut self) {
        let (steps, batch, _, hidden) = LSTM_SHAPE;
        let options = (Kind::Float, self.x.device());
        let mut h = Tensor::zeros([batch, hidden], options);
        let mut c = Tensor::zeros([batch, hidden], options);
        for t in 0..steps {
            let gates = self.x.get(t).matmul(&self.w_ih) + h.matmul(&self.w_hh) + &self.bias;
            let parts = gates.chunk(4, 1);
            let (i, f, g, o) = (parts[0].sigmoid(), parts[1].sigmoid(), parts[2].tanh(), parts[3].sigmoid());
            c = f * &c + i * g;
            h = o * c.tanh();
        }
        let loss = self.head.forward(&h).cross_entropy_for_logits(&self.y);
        self.opt.backward_step(&loss);
    }

    fn describe(&self) -> String {
        let (steps, batch, input, hidden) = LSTM_SHAPE;
        format!("An allocation-heavy step (LSTM cell unrolled over {steps} time steps, batch {batch}, input {input}, hidden {hidden}, Adam)")
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Variant {
    Plain,
    /// Thread scope: tensors and libtorch's host objects (operator new).
    Counting,
    /// Every thread counted: the counting CPU allocator, the CUDA trace
    /// tracker and operator new feed a tracker.
    Process,
    Attribution,
    /// The two counting variants without libtorch's host objects (operator
    /// new reports nothing): what that layer costs, in the same run.
    CountingTensorsOnly,
    ProcessTensorsOnly,
    /// Process scope without CUPTI's callbacks on the driver's allocation
    /// calls (`GPU_LEAK_TEST_DRIVER_CALLS=0`): what that layer costs.
    ProcessWithoutDriverCalls,
    /// Attribution as it was before host objects got stacks only where
    /// they are attributed: a stack for every C++ heap block too.
    AttributionWithHostObjects,
    /// Process scope without the Rust heap's count (the counting global
    /// allocator only hands calls on): what that layer costs.
    ProcessWithoutRustHeap,
    /// Attribution where a failing test runs it by default: in process
    /// scope (a process per test under nextest, the harness's own child
    /// under `cargo test`), where the process-wide sources feed the tracker
    /// and no hook is installed. `Attribution` is thread scope's, the
    /// hook's dispatch included.
    ProcessAttribution,
    /// Plain again, as a variant of its own: it costs what plain costs, so
    /// its ratio shows the run's own bias and noise between variants.
    PlainAgain,
}

const VARIANTS: [Variant; 10] = [
    Variant::Plain,
    Variant::Counting,
    Variant::Process,
    Variant::Attribution,
    Variant::CountingTensorsOnly,
    Variant::ProcessTensorsOnly,
    Variant::ProcessWithoutDriverCalls,
    Variant::AttributionWithHostObjects,
    Variant::ProcessWithoutRustHeap,
    Variant::ProcessAttribution,
];

/// Runs `f` under `variant`, as a leak test would run its body: the sources
/// of the variant installed, and stack walks ending at this frame.
fn under_variant<T>(variant: Variant, f: impl FnOnce() -> T) -> T {
    let tensors_only = matches!(variant, Variant::CountingTensorsOnly | Variant::ProcessTensorsOnly);
    gpu_leak_test::internals::switches::switch_off_host_objects(tensors_only);
    // The counting global allocator counts every Rust allocation of the
    // process, in a leak test or not: plain is the step without it.
    gpu_leak_test::internals::switches::switch_off_rust_heap(matches!(
        variant,
        Variant::Plain | Variant::PlainAgain | Variant::ProcessWithoutRustHeap
    ));
    gpu_leak_test::internals::probe::driver::force((variant == Variant::ProcessWithoutDriverCalls).then_some(false));
    let observation = matches!(
        variant,
        Variant::Process
            | Variant::ProcessTensorsOnly
            | Variant::ProcessWithoutDriverCalls
            | Variant::ProcessWithoutRustHeap
            | Variant::ProcessAttribution
    )
        .then(|| Observation::open(true).unwrap());
    let tracker = Tracker::new();
    let hook =
        matches!(variant, Variant::Counting | Variant::Attribution | Variant::CountingTensorsOnly | Variant::AttributionWithHostObjects)
            .then(|| tracker.enter().unwrap());
    // A tensor leak's attribution: stacks for tensors, not for the C++
    // heap blocks beside them (see Tracker::start_recording_layers).
    let recording = match (variant, &observation) {
        (Variant::ProcessAttribution, Some(observation)) => observation.tracker(),
        _ => &tracker,
    };
    match variant {
        Variant::Attribution | Variant::ProcessAttribution => recording.start_recording_layers(1, false),
        Variant::AttributionWithHostObjects => recording.start_recording(1),
        _ => {}
    }
    let value = gpu_leak_test::internals::probe::stacks::stop_walks_here(f);
    recording.stop_recording();
    drop(hook);
    drop(observation);
    gpu_leak_test::internals::switches::switch_off_host_objects(false);
    gpu_leak_test::internals::switches::switch_off_rust_heap(false);
    gpu_leak_test::internals::probe::driver::force(None);
    value
}

/// Seconds per step for `steps` steps of one variant.
fn time_variant(step: &mut dyn TrainingStep, device: Device, variant: Variant, steps: usize) -> f64 {
    under_variant(variant, || {
        sync(device);
        let start = Instant::now();
        for _ in 0..steps {
            step.run();
        }
        sync(device);
        start.elapsed().as_secs_f64() / steps as f64
    })
}

/// A 95% interval for the median of `values` from their order statistics
/// (the binomial bound: no assumption on the distribution).
fn median_interval(values: &mut [f64]) -> (f64, f64) {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = values.len() as f64;
    let half_width = (1.96 * n.sqrt() / 2.0).ceil() as usize;
    let low = (values.len() / 2).saturating_sub(half_width);
    let high = (values.len() / 2 + half_width).min(values.len() - 1);
    (values[low], values[high])
}

/// An interval as printed, rounded outward to `decimals`, so that the
/// printed interval holds the measured one: a top of 1.03005 prints as
/// 1.031, not as a 1.030 that would read as inside a 1.03 target.
fn interval_text(low: f64, high: f64, decimals: i32) -> String {
    let scale = 10f64.powi(decimals);
    let digits = decimals as usize;
    format!("{:.digits$} to {:.digits$}", (low * scale).floor() / scale, (high * scale).ceil() / scale)
}

/// The outward rounding that `interval_text` promises, checked where the
/// smoke run (`cargo test --benches`) sees it.
fn check_interval_text() {
    assert_eq!(interval_text(1.01449, 1.03005, 3), "1.014 to 1.031", "the top must round up, past a 1.03 target");
    assert_eq!(interval_text(0.99951, 1.0004, 3), "0.999 to 1.001");
    assert_eq!(interval_text(95.06, 104.91, 1), "95.0 to 105.0");
}

/// A ratio column's cells: the median, its 95% interval, min and max.
fn ratio_cells(ratios: &mut [f64]) -> String {
    let (low, high) = median_interval(ratios);
    let (median, min, max) = summary(ratios);
    format!("{median:.3} | {} | {min:.3} | {max:.3}", interval_text(low, high, 3))
}

fn summary(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (values[values.len() / 2], values[0], values[values.len() - 1])
}

/// Allocator events (allocations and frees, every device) of one step, as
/// the hook counts them on the step's threads and as the process-wide
/// sources count them.
fn events_per_step(step: &mut dyn TrainingStep, device: Device) -> (u64, u64, u64) {
    let events = |tracker: &Tracker| -> u64 {
        [Device::Cpu, device].iter().take(if device == Device::Cpu { 1 } else { 2 }).map(|&d| {
            let view = tracker.view(d);
            view.allocations + view.frees
        }).sum()
    };
    let tracker = Tracker::new();
    {
        let _hook = tracker.enter().unwrap();
        step.run();
        sync(device);
    }
    let observation = Observation::open(true).unwrap();
    step.run();
    sync(device);
    let process = events(observation.tracker());
    drop(observation);
    let host = tracker.layer_view(gpu_leak_test::report::Layer::HostObjects);
    (events(&tracker), process, host.allocations + host.frees)
}

/// What a variant's row says in a step's table.
fn step_label(variant: Variant) -> &'static str {
    match variant {
        Variant::Plain => "plain (no hook, the Rust heap's count off)",
        Variant::Counting => "passing leak test, thread scope (hook, counting, all layers)",
        Variant::Process => "passing leak test, process scope (every thread, counting, all layers)",
        Variant::Attribution => "attribution forced on (a stack per tensor allocation, as for a tensor leak)",
        Variant::CountingTensorsOnly => "thread scope without libtorch's host objects",
        Variant::ProcessTensorsOnly => "process scope without libtorch's host objects",
        Variant::ProcessWithoutDriverCalls => "process scope without the CUDA driver's calls (CUPTI)",
        Variant::AttributionWithHostObjects => "attribution with a stack for every C++ heap block too (as before)",
        Variant::ProcessWithoutRustHeap => "process scope without the Rust heap",
        Variant::ProcessAttribution => {
            "attribution forced on in process scope (the default under nextest and `cargo test`; a stack per tensor allocation)"
        }
        Variant::PlainAgain => "plain again (costs what plain costs: the run's own bias and noise)",
    }
}

/// The variants that decide the counting target (process scope, and it
/// without each host layer): fewer variants, so more rounds fit where the
/// median's spread must be narrower than the target's margin. Plain again
/// checks the run: its ratio should be 1, within its interval.
const COUNTING_VARIANTS: [Variant; 5] =
    [Variant::Plain, Variant::Process, Variant::ProcessTensorsOnly, Variant::ProcessWithoutRustHeap, Variant::PlainAgain];

/// Only what the counting target is read from, all layers against plain,
/// with plain again to check the run: 3 variants where `COUNTING_VARIANTS`
/// has 5, so a device's minutes hold 5/3 as many rounds, for an interval
/// inside the target's margin once the layers' shares are known.
const TARGET_VARIANTS: [Variant; 3] = [Variant::Plain, Variant::Process, Variant::PlainAgain];

/// Only what the attribution target is read from, in both scopes, with
/// plain again to check the run: on a short, noisy step (the MLP on a
/// 16-thread host CPU) ten variants leave too few rounds for an interval
/// inside the target's margin.
const ATTRIBUTION_VARIANTS: [Variant; 4] =
    [Variant::Plain, Variant::Attribution, Variant::ProcessAttribution, Variant::PlainAgain];

/// The order in which `count` variants take their turns in turn `turn` (a
/// block of a round): a Williams design. Over every `count` turns (twice
/// that where `count` is odd) each variant comes first equally often and
/// comes right after each other variant equally often, so what a variant
/// leaves behind (caches, the heap's layout, trained branches) falls on
/// every variant alike. The rotation used before kept each variant's
/// predecessor fixed: process scope always ran right after plain.
fn turn_order(count: usize, turn: usize) -> Vec<usize> {
    // The first row: 0, 1, count-1, 2, count-2, ...
    let first = (0..count).map(|i| match i {
        0 => 0,
        _ if i % 2 == 1 => i.div_ceil(2),
        _ => count - i / 2,
    });
    let row = turn % if count % 2 == 0 { count } else { 2 * count };
    let mut order: Vec<usize> = first.map(|v| (v + row) % count).collect();
    // Where `count` is odd, the second `count` rows are the first ones reversed.
    if row >= count {
        order.reverse();
    }
    order
}

/// Panics unless `turn_order` balances what it promises, for every count a
/// section uses: checked at every start (it takes microseconds), so the
/// design cannot rot.
fn check_turn_orders() {
    for count in 1..=VARIANTS.len() + 1 {
        let rows = if count % 2 == 0 { count } else { 2 * count };
        let mut first = vec![0; count];
        let mut after = vec![vec![0; count]; count];
        for turn in 0..rows {
            let order = turn_order(count, turn);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..count).collect::<Vec<_>>(), "turn {turn} of {count} is not an order of them all");
            first[order[0]] += 1;
            for pair in order.windows(2) {
                after[pair[0]][pair[1]] += 1;
            }
        }
        assert!(first.iter().all(|&n| n == rows / count), "{count} variants: not each first equally often: {first:?}");
        for (a, row) in after.iter().enumerate() {
            for (b, &n) in row.iter().enumerate() {
                assert_eq!(n, if a == b { 0 } else { rows / count }, "{count} variants: {b} after {a} {n} times in {rows} turns");
            }
        }
    }
}

/// Where `--save-rounds=FILE` sends each round's ratios: one line per round
/// and variant, `heading<TAB>variant<TAB>ratio<TAB>plain step ms`, written
/// as the round ends so that a run cut short keeps its rounds.
static SAVED_ROUNDS: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

fn save_round(heading: &str, variant: Variant, ratio: f64, plain_ms: f64) {
    // One write per line: runs appending to one file do not interleave.
    append(&SAVED_ROUNDS, "--save-rounds", || format!("{heading}\t{}\t{ratio}\t{plain_ms}\n", step_label(variant)));
}

/// `--save-rounds=FILE` and `--save-blocks=FILE`: FILE opened to append, into
/// `saved`.
fn open_to_append(saved: &OnceLock<Mutex<std::fs::File>>, flag: &str, path: &str) {
    let file = std::fs::OpenOptions::new().create(true).append(true).open(path);
    let file = file.unwrap_or_else(|e| panic!("{flag}: cannot open {path} to append: {e}"));
    saved.set(Mutex::new(file)).unwrap();
}

/// `text` in one write to the file that `flag` opened, if it was given.
fn append(saved: &OnceLock<Mutex<std::fs::File>>, flag: &str, text: impl FnOnce() -> String) {
    if let Some(file) = saved.get() {
        file.lock().unwrap().write_all(text().as_bytes()).unwrap_or_else(|e| panic!("{flag}: cannot write: {e}"));
    }
}

/// The entry named `name` in a list kept in first-seen order, added empty if
/// it is not there yet.
fn named_entry<'a, T: Default>(list: &'a mut Vec<(String, T)>, name: &str) -> &'a mut T {
    let at = match list.iter().position(|(n, _)| n == name) {
        Some(at) => at,
        None => {
            list.push((name.to_string(), T::default()));
            list.len() - 1
        }
    };
    &mut list[at].1
}

/// Where `--save-blocks=FILE` sends each block's time: one line per block,
/// `heading<TAB>round<TAB>variant<TAB>steps<TAB>seconds per step`, a round's
/// lines written together as the round ends.
static SAVED_BLOCKS: OnceLock<Mutex<std::fs::File>> = OnceLock::new();

fn save_blocks(heading: &str, round: usize, blocks: &[(Variant, usize, f64)]) {
    append(&SAVED_BLOCKS, "--save-blocks", || {
        blocks
            .iter()
            .map(|&(variant, steps, seconds)| format!("{heading}\t{round}\t{}\t{steps}\t{seconds}\n", step_label(variant)))
            .collect()
    });
}

/// `--pool-blocks FILE...`: the blocks that `--save-blocks` kept, per step.
/// For each variant, its block times per step against plain's median block
/// (median, 90th and 99th percentile, max); then the rounds' ratios as the
/// step sections measure them (each variant's mean over its blocks against
/// plain's), beside the same rounds with each variant's slowest block left
/// out. Where leaving one block out narrows the interval much, single slow
/// blocks move the figure, not the variant's steady cost. A diagnostic: the
/// target's figure stays the mean, which a slow block is part of.
fn pool_blocks(files: &[String]) {
    // One round's blocks: each variant's (steps, seconds per step).
    type RoundBlocks = Vec<(String, Vec<Block>)>;
    // A step's rounds, each keyed by its file and round number.
    type StepBlocks = Vec<((usize, usize), RoundBlocks)>;
    fn blocks_of<'a>(round: &'a RoundBlocks, name: &str) -> &'a [Block] {
        &round.iter().find(|(n, _)| n == name).unwrap().1
    }
    let mut steps: Vec<(String, StepBlocks)> = Vec::new();
    for (f, file) in files.iter().enumerate() {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("--pool-blocks: cannot read {file}: {e}"));
        for line in text.lines() {
            // A run killed mid-write leaves at most its last line partial.
            let [heading, round, variant, count, seconds] = line.split('\t').collect::<Vec<_>>()[..] else { continue };
            let (Ok(round), Ok(count), Ok(seconds)) = (round.parse::<usize>(), count.parse::<usize>(), seconds.parse::<f64>()) else {
                continue;
            };
            let rounds = named_entry(&mut steps, heading);
            if rounds.last().is_none_or(|(key, _)| *key != (f, round)) {
                rounds.push(((f, round), Vec::new()));
            }
            named_entry(&mut rounds.last_mut().unwrap().1, variant).push((count, seconds));
        }
    }
    for (heading, rounds) in &steps {
        // A round's lines go out in one write, so a run cut off keeps whole
        // rounds; one that still lacks a variant is left out.
        let mut names: Vec<&String> = Vec::new();
        for (name, _) in rounds.iter().flat_map(|(_, variants)| variants) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let whole: Vec<&RoundBlocks> = rounds.iter().map(|(_, v)| v).filter(|v| v.len() == names.len()).collect();
        let Some(plain) = names.first() else { continue };
        let mut plain_blocks: Vec<f64> = whole.iter().flat_map(|r| blocks_of(r, plain).iter().map(|b| b.1)).collect();
        let (plain_median, _, _) = summary(&mut plain_blocks);
        println!("### {heading}, blocks pooled from {}\n", files.join(", "));
        println!(
            "{} whole rounds; plain's median block {:.3} ms per step. Block times per step against plain's median block:\n",
            whole.len(),
            plain_median * 1e3
        );
        println!("| variant | blocks | median | 90th percentile | 99th percentile | max |\n| --- | --- | --- | --- | --- | --- |");
        for name in &names {
            let mut times: Vec<f64> = whole.iter().flat_map(|r| blocks_of(r, name).iter().map(|b| b.1 / plain_median)).collect();
            times.sort_by(f64::total_cmp);
            let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
            println!("| {name} | {} | {:.3} | {:.3} | {:.3} | {:.3} |", times.len(), at(0.5), at(0.9), at(0.99), at(1.0));
        }
        println!("\n| variant | rounds' ratio to plain, as measured: median (95% interval), sd | each variant's slowest block left out: median (95% interval), sd |\n| --- | --- | --- |");
        for name in &names[1..] {
            let ratios = |of: fn(&[Block]) -> f64| -> Vec<f64> {
                whole.iter().map(|r| of(blocks_of(r, name)) / of(blocks_of(r, plain))).collect()
            };
            let cells = |mut values: Vec<f64>| {
                let n = values.len() as f64;
                let average = values.iter().sum::<f64>() / n;
                let sd = (values.iter().map(|v| (v - average).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
                let (low, high) = median_interval(&mut values);
                let (median, _, _) = summary(&mut values);
                format!("{median:.3} ({}), {sd:.3}", interval_text(low, high, 3))
            };
            println!("| {name} | {} | {} |", cells(ratios(mean_per_step)), cells(ratios(mean_without_slowest)));
        }
        println!();
    }
}

/// One block of a variant: its steps, and its seconds per step.
type Block = (usize, f64);

fn mean_per_step(blocks: &[Block]) -> f64 {
    let steps: usize = blocks.iter().map(|b| b.0).sum();
    blocks.iter().map(|&(n, seconds)| n as f64 * seconds).sum::<f64>() / steps.max(1) as f64
}

/// The mean per step with the slowest block left out (all of them where
/// there is one).
fn mean_without_slowest(blocks: &[Block]) -> f64 {
    let slowest = blocks.iter().enumerate().max_by(|a, b| a.1 .1.total_cmp(&b.1 .1)).map(|(i, _)| i);
    let kept: Vec<Block> = blocks.iter().enumerate().filter(|(i, _)| Some(*i) != slowest).map(|(_, b)| *b).collect();
    mean_per_step(if kept.is_empty() { blocks } else { &kept })
}

/// A step's plain step times (ms, one per round), and its variants, each
/// with the ratios of its kept rounds.
type StepRounds = (Vec<f64>, Vec<(String, Vec<f64>)>);

/// `--pool-rounds FILE...`: the rounds that `--save-rounds` kept, of one run
/// or several, as one table per step, in the order they first appear.
fn pool_rounds(files: &[String]) {
    let mut steps: Vec<(String, StepRounds)> = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("--pool-rounds: cannot read {file}: {e}"));
        for line in text.lines() {
            // A run killed mid-write leaves at most its last line partial.
            // Files saved before the plain step time was kept have three fields.
            let (heading, variant, ratio, plain_ms) = match line.split('\t').collect::<Vec<_>>()[..] {
                [heading, variant, ratio] => (heading, variant, ratio, None),
                [heading, variant, ratio, plain_ms] => (heading, variant, ratio, Some(plain_ms)),
                _ => continue,
            };
            let Ok(ratio) = ratio.parse::<f64>() else { continue };
            let plain_ms = plain_ms.and_then(|ms| ms.parse::<f64>().ok());
            let (plain, variants) = named_entry(&mut steps, heading);
            // Every variant's line repeats its round's plain time; the
            // first variant's lines count each round once.
            if variants.first().is_none_or(|(first, _)| first == variant) {
                plain.extend(plain_ms);
            }
            named_entry(variants, variant).push(ratio);
        }
    }
    for (heading, (plain, variants)) in &mut steps {
        println!("### {heading}, rounds pooled from {}\n", files.join(", "));
        if !plain.is_empty() {
            let (plain_ms, _, _) = summary(plain);
            println!("Plain step {plain_ms:.3} ms (median of the {} rounds that carry it).\n", plain.len());
        }
        println!("| variant | rounds | ratio to plain: median | median's 95% interval | min | max |\n| --- | --- | --- | --- | --- | --- |");
        for (variant, ratios) in variants.iter_mut() {
            println!("| {variant} | {} | {} |", ratios.len(), ratio_cells(ratios));
        }
        println!();
    }
}

/// The variants of one step (plain first), alternating round by round:
/// ratios to plain, and what each costs per allocator event.
fn step_overhead(step: &mut dyn TrainingStep, device: Device, scale: &Scale, variants: &[Variant]) {
    assert_eq!(variants[0], Variant::Plain, "ratios are to plain");
    // Warm-up: optimizer state, workspaces, the unwinder's module list.
    for &variant in variants {
        time_variant(step, device, variant, 3);
    }
    // Rounds of about 0.3 s per variant by default: enough steps to average
    // over, few enough that a slow step (the CPU's LSTM) does not take minutes.
    let estimate = time_variant(step, device, Variant::Plain, 3);
    let steps_per_round = ((scale.round_seconds / estimate).round() as usize).max(3).min(scale.steps_per_round);
    let (events, process_events, host_events) = events_per_step(step, device);
    let mut plain_times = Vec::new();
    let mut ratios = vec![Vec::new(); variants.len() - 1];
    let mut per_event_ns = vec![Vec::new(); variants.len() - 1];
    // Blocks of each round's steps, the variants taking turns block by block
    // (one block of them all by default).
    let block = scale.block_steps.unwrap_or(steps_per_round).clamp(1, steps_per_round);
    let blocks = steps_per_round.div_ceil(block);
    // The CPU's intra-op threads in the heading too, so that pooled rounds
    // (`--pool-rounds`, which groups by heading) never mix thread counts.
    let intra_op_threads = tch::get_num_threads();
    let threads = match (device, intra_op_threads) {
        (Device::Cpu, 1) => ", 1 intra-op thread".to_string(),
        (Device::Cpu, n) => format!(", {n} intra-op threads"),
        _ => String::new(),
    };
    let heading = format!("{} on {device:?}{threads}", step.describe());
    for round in 0..scale.rounds {
        let mut times = vec![0.0; variants.len()];
        let mut block_times = Vec::new();
        for b in 0..blocks {
            let steps = block.min(steps_per_round - b * block);
            // A new order every block and round, so drift and what each
            // variant leaves behind hit every variant alike.
            for index in turn_order(variants.len(), round * blocks + b) {
                let seconds = time_variant(step, device, variants[index], steps);
                times[index] += seconds * steps as f64 / steps_per_round as f64;
                block_times.push((variants[index], steps, seconds));
            }
        }
        save_blocks(&heading, round, &block_times);
        plain_times.push(times[0]);
        for v in 1..variants.len() {
            let ratio = times[v] / times[0];
            ratios[v - 1].push(ratio);
            per_event_ns[v - 1].push((times[v] - times[0]) * 1e9 / events.max(1) as f64);
            save_round(&heading, variants[v], ratio, times[0] * 1e3);
        }
    }
    let (plain, _, _) = summary(&mut plain_times);
    println!("### {heading}\n");
    println!(
        "{} rounds of {} steps per variant, variants taking turns in a balanced order{}; plain step {:.3} ms (median); {events} allocator events \
         per step (allocations and frees) on the step's threads, {process_events} in the whole process, and \
         {host_events} operator new and delete calls of libtorch's host objects; libtorch intra-op threads: {intra_op_threads}.\n",
        scale.rounds,
        steps_per_round,
        if scale.block_steps.is_some() { format!(" in blocks of {block} steps") } else { String::new() },
        plain * 1e3,
    );
    if variants.contains(&Variant::Attribution) {
        // How well the unwinder's rule cache serves one step with attribution.
        let before = gpu_leak_test::internals::probe::stacks::unwinder_cache_stats().unwrap_or_default();
        time_variant(step, device, Variant::Attribution, 1);
        let after = gpu_leak_test::internals::probe::stacks::unwinder_cache_stats().unwrap_or_default();
        let (hits, collisions, other) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        println!(
            "Unwinder rule cache over one step with attribution, on the test's thread: {hits} hits, {collisions} misses from slot collisions, {other} other misses.\n"
        );
    }
    println!(
        "| variant | ratio to plain: median | median's 95% interval | min | max | cost per allocator event (median) |\n| --- | --- | --- | --- | --- | --- |"
    );
    println!("| {} | 1.000 | | | | |", step_label(Variant::Plain));
    for ((&variant, r), ns) in variants[1..].iter().zip(ratios.iter_mut()).zip(per_event_ns.iter_mut()) {
        let (ns, _, _) = summary(ns);
        println!("| {} | {} | {ns:.0} ns |", step_label(variant), ratio_cells(r));
    }
    println!();
}

/// Each of `variants` timed once to warm up, then `rounds` rounds in which
/// they take turns, in a new order every round (`turn_order`) so drift hits
/// each alike: plain's figures (the first variant), and what each other
/// variant added to plain's in the same round.
fn added_to_plain(rounds: usize, variants: &[Variant], mut time: impl FnMut(Variant) -> f64) -> (Vec<f64>, Vec<Vec<f64>>) {
    assert_eq!(variants[0], Variant::Plain, "figures are added to plain's");
    for &variant in variants {
        time(variant);
    }
    let mut plain = Vec::new();
    let mut added = vec![Vec::new(); variants.len() - 1];
    for round in 0..rounds {
        let mut figures = vec![0.0; variants.len()];
        for index in turn_order(variants.len(), round) {
            figures[index] = time(variants[index]);
        }
        plain.push(figures[0]);
        for v in 1..variants.len() {
            added[v - 1].push(figures[v] - figures[0]);
        }
    }
    (plain, added)
}

/// Nanoseconds per allocator event in a loop that does nothing else: an
/// empty one-element tensor made and dropped (one allocation, one free),
/// plain and under each variant, and the tracker's callback fed directly
/// (its map update, locking and counters, without libtorch).
fn event_costs(device: Device, scale: &Scale) {
    const TENSORS: usize = 20_000;
    let options = (Kind::Float, device);
    let churn = || {
        for _ in 0..TENSORS {
            drop(std::hint::black_box(Tensor::empty([1], options)));
        }
    };
    let time = |variant: Variant| -> f64 {
        under_variant(variant, || {
            let start = Instant::now();
            churn();
            start.elapsed().as_secs_f64() * 1e9 / (2 * TENSORS) as f64
        })
    };
    let (mut plain, mut added) = added_to_plain(scale.rounds, &VARIANTS, time);
    // The callback alone: alloc and free of distinct addresses, as the
    // allocator hands them out.
    let tracker = Tracker::new();
    let mut fed = Vec::new();
    for _ in 0..scale.rounds {
        let start = Instant::now();
        for i in 0..TENSORS {
            let address = 0x7f00_0000_0000 + (i % 512) * 512;
            tracker.feed(address, 512, device);
            tracker.feed(address, -512, device);
        }
        fed.push(start.elapsed().as_secs_f64() * 1e9 / (2 * TENSORS) as f64);
    }
    let (plain, _, _) = summary(&mut plain);
    let (fed, _, _) = summary(&mut fed);
    println!("#### Cost per allocator event on {device:?}, in isolation\n");
    println!(
        "{} rounds of {TENSORS} empty one-element tensors made and dropped (an allocation and a free each), variants alternating; \
         plain: {plain:.0} ns per event (median).\n",
        scale.rounds
    );
    println!("| what | ns per event (median) |\n| --- | --- |");
    println!("| the tracker's callback alone (map update, lock, counters; fed directly) | {fed:.0} |");
    for (&variant, ns) in VARIANTS[1..].iter().zip(added.iter_mut()) {
        let (ns, _, _) = summary(ns);
        let name = event_label(variant);
        println!("| {name} | {ns:.0} |");
    }
    println!();
}

/// What a variant's row says in the table of costs per allocator event.
fn event_label(variant: Variant) -> &'static str {
    match variant {
        Variant::Counting => "thread scope: libtorch's hook dispatch and the callback, all layers",
        Variant::Process => {
            "process scope: the counting CPU allocator or the CUDA trace tracker, operator new, and the callback"
        }
        Variant::Attribution => "attribution: the above in thread scope, plus a stack per allocation",
        Variant::CountingTensorsOnly => "thread scope without libtorch's host objects",
        Variant::ProcessTensorsOnly => "process scope without libtorch's host objects",
        Variant::ProcessWithoutDriverCalls => "process scope without the CUDA driver's calls (CUPTI)",
        Variant::AttributionWithHostObjects => "attribution with a stack for every C++ heap block too (as before)",
        Variant::ProcessWithoutRustHeap => "process scope without the Rust heap",
        Variant::ProcessAttribution => "attribution in process scope: process scope, plus a stack per allocation",
        Variant::Plain | Variant::PlainAgain => step_label(variant),
    }
}

/// The allocation-heavy step. On the CPU with one intra-op thread: the
/// cell's matrices are small, and a pool of threads waking for each of
/// them makes rounds differ by more than the harness costs.
fn heavy_step_overhead(device: Device, scale: &Scale, variants: &[Variant]) {
    with_cpu_threads_at_most(device, 1, || {
        step_overhead(&mut LstmStep::new(device), device, scale, variants);
        if variants.len() == VARIANTS.len() {
            event_costs(device, scale);
        }
    });
}

/// The MLP step's intra-op threads on the CPU, at most. With libtorch's
/// sixteen on a 16-CPU GPU host, counting's rounds spread from 0.69x to
/// 1.75x; with four, in the same call, from 1.00x to 1.02x, and the plain
/// step was faster (1.70 ms median against 2.33), so the ratio is not bought
/// with a longer step (benches/RESULTS.md, "A thirteenth H100 lease").
const MLP_CPU_THREADS: i32 = 4;

/// Runs `run` with libtorch's intra-op threads on the CPU at most `cap`,
/// and gives libtorch its own count back after.
fn with_cpu_threads_at_most(device: Device, cap: i32, run: impl FnOnce()) {
    let threads = tch::get_num_threads();
    if device == Device::Cpu {
        tch::set_num_threads(threads.min(cap));
    }
    run();
    tch::set_num_threads(threads);
}

// libtorch's host objects come from C++ operator new; the bench calls the
// process's own definitions (the shim's) by their Itanium names.
extern "C-unwind" {
    #[link_name = "_Znwm"]
    fn cxx_operator_new(bytes: usize) -> *mut u8;
    #[link_name = "_ZdlPvm"]
    fn cxx_operator_delete_sized(ptr: *mut u8, bytes: usize);
}

/// Sizes of libtorch's host objects, roughly (intrusive_ptr control
/// blocks to TensorImpls and autograd nodes), in a fixed order.
const HOST_OBJECT_SIZES: [usize; 14] = [16, 24, 32, 48, 64, 80, 96, 128, 160, 200, 256, 320, 400, 512];

/// A batch of blocks from operator new, each written whole, as a
/// constructor writes its object.
fn allocate_batch(batch: &mut Vec<(usize, usize)>, count: usize) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    for _ in 0..count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let bytes = HOST_OBJECT_SIZES[(state % HOST_OBJECT_SIZES.len() as u64) as usize];
        // SAFETY: operator new returns a block of `bytes` bytes, ours until
        // freed below, or throws `bad_alloc`, which a `C-unwind` call lets
        // through as a foreign exception: Rust's runtime then aborts.
        let ptr = unsafe { cxx_operator_new(bytes) };
        // SAFETY: `ptr` holds `bytes` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0xA5, bytes) };
        batch.push((ptr as usize, bytes));
    }
}

/// Frees a batch with sized delete, reading each block's first word first,
/// as a destructor reads its fields.
fn free_batch(batch: &mut Vec<(usize, usize)>) {
    for (ptr, bytes) in batch.drain(..) {
        let ptr = ptr as *mut u8;
        // SAFETY: `ptr` came from operator new with `bytes` bytes, written
        // whole, and is freed once, with its size, as sized delete asks.
        unsafe {
            std::hint::black_box(std::ptr::read_unaligned(ptr as *const u64));
            cxx_operator_delete_sized(ptr, bytes);
        }
    }
}

/// The host-object layer's cost per operator new and delete pair, in
/// isolation: blocks of libtorch's object sizes made and written on this
/// thread, then freed with sized delete on the same thread (as on the
/// CPU, where one thread runs forward and backward) or on another (as on
/// CUDA, where autograd's device thread frees what the forward made).
/// Plain, process scope (every layer counting), and process scope with
/// this layer off take turns within each round.
fn host_object_pair_costs(scale: &Scale) {
    const BATCH: usize = 4096;
    let batches = scale.host_object_batches;
    let variants = [Variant::Plain, Variant::Process, Variant::ProcessTensorsOnly];
    let (to_freer, freer_gets) = std::sync::mpsc::channel::<Vec<(usize, usize)>>();
    let (freer_returns, from_freer) = std::sync::mpsc::channel::<Vec<(usize, usize)>>();
    let freer = std::thread::spawn(move || {
        for mut batch in freer_gets {
            free_batch(&mut batch);
            if freer_returns.send(batch).is_err() {
                break;
            }
        }
    });
    let mut batch = Vec::with_capacity(BATCH);
    let mut pair_ns = |variant: Variant, on_another_thread: bool| -> f64 {
        under_variant(variant, || {
            let start = Instant::now();
            for _ in 0..batches {
                allocate_batch(&mut batch, BATCH);
                if on_another_thread {
                    to_freer.send(std::mem::take(&mut batch)).unwrap();
                    batch = from_freer.recv().unwrap();
                } else {
                    free_batch(&mut batch);
                }
            }
            start.elapsed().as_secs_f64() * 1e9 / (batches * BATCH) as f64
        })
    };
    println!("#### Cost per operator new and delete pair of libtorch's host objects, in isolation\n");
    println!(
        "{} rounds of {batches} batches of {BATCH} blocks of {} to {} bytes, made and written on one thread, freed with sized \
         delete; the variants take turns within each round.\n",
        scale.rounds,
        HOST_OBJECT_SIZES[0],
        HOST_OBJECT_SIZES[HOST_OBJECT_SIZES.len() - 1]
    );
    println!(
        "| freed on | plain: ns per pair (median) | process scope, all layers: ns added (median) | median's 95% interval | \
         process scope without host objects: ns added (median) | median's 95% interval |\n| --- | --- | --- | --- | --- | --- |"
    );
    for on_another_thread in [false, true] {
        let (mut plain, mut added) = added_to_plain(scale.rounds, &variants, |variant| pair_ns(variant, on_another_thread));
        let (plain, _, _) = summary(&mut plain);
        let cells: Vec<String> = added
            .iter_mut()
            .map(|added| {
                let (low, high) = median_interval(added);
                let (median, _, _) = summary(added);
                format!("{median:.1} | {}", interval_text(low, high, 1))
            })
            .collect();
        let freed_on = if on_another_thread { "another thread" } else { "the same thread" };
        println!("| {freed_on} | {plain:.1} | {} | {} |", cells[0], cells[1]);
    }
    println!();
    drop(to_freer);
    freer.join().unwrap();
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
            .device(name.parse::<gpu_leak_test::settings::DeviceChoice>().unwrap())
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
fn varied_clean_run(name: &str, device: &str, seed: u64) -> gpu_leak_test::Report {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 33) as i64
    };
    let mut cache: Option<Tensor> = None;
    LeakTest::new(name)
        .device(device.parse::<gpu_leak_test::settings::DeviceChoice>().unwrap())
        // Four at once next to an unhooked noise thread: the scope that
        // keeps parallel tests apart.
        .scope(gpu_leak_test::settings::Scope::Thread)
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
        .device(device.parse::<gpu_leak_test::settings::DeviceChoice>().unwrap())
        .scope(gpu_leak_test::settings::Scope::Thread)
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
        let (shape, verdict) = if run % 2 == 0 {
            let settle = SHAPE_WARMUP + 1 + random.below(SHAPE_WINDOW as u64) as u32;
            let step = 1 + random.below(3) as usize;
            (format!("plateau settling at {settle}, step {step}"), shape_run("plateau", device, elements, move |i| step * i.min(settle) as usize))
        } else {
            let period = 2 + random.below(SHAPE_WINDOW as u64) as u32;
            let phase = random.below(period as u64) as u32;
            (format!("sawtooth of period {period}, phase {phase}"), shape_run("sawtooth", device, elements, move |i| ((i + phase) % period) as usize))
        };
        if verdict.is_failure() {
            eprintln!("false alarm on {device}, run {run}: {shape} of {elements} floats: {verdict:?}");
        }
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
                        let seed = (t * 100_000 + i) as u64;
                        let report = varied_clean_run(&format!("clean_{t}_{i}"), &device, seed);
                        if report.verdict.is_failure() {
                            // The seed reproduces the run's shapes (not its threads' timing).
                            eprintln!("false alarm on {device}, seed {seed}:\n{report}\n{:?}", report.devices);
                        }
                        report.verdict.is_failure()
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

/// One leak test of a tiny CPU body (a one-element tensor made, and kept
/// where `leaking`) over `iterations` measured iterations: the harness's
/// time per iteration run, body included, and the iterations it ran.
fn long_run(iterations: u32, leaking: bool) -> (f64, u32) {
    let mut kept = Vec::new();
    let start = Instant::now();
    let report = LeakTest::new(format!("long_{iterations}_{leaking}"))
        .device(Device::Cpu)
        .iterations(iterations)
        .attribution_iterations(1)
        .run(|device| {
            let t = Tensor::zeros([1], (Kind::Float, device));
            if leaking {
                kept.push(t);
            }
        })
        .unwrap();
    let elapsed = start.elapsed().as_secs_f64();
    assert_eq!(report.verdict.is_failure(), leaking, "{report}");
    // Every iteration run: a long run's report keeps only some samples.
    let (measured, confirmation) = report.window();
    let ran = report.settings.warmup + measured + confirmation + report.settings.attribution_iterations;
    (elapsed * 1e6 / ran.max(1) as f64, ran)
}

/// Each case runs in a process of its own, as a test does under either
/// runner: glibc's heap statistics cost more in a process whose heap
/// earlier cases fragmented, which is no cost of the window's length.
fn long_windows(full: bool) {
    println!("### Long windows: cost per iteration (a one-element tensor per iteration, CPU, thread scope, a process per case)\n");
    println!("| body | iterations asked | iterations run | µs per iteration | ratio to the shortest |\n| --- | --- | --- | --- | --- |");
    // Linear means flat per iteration: within 1.5x from 25k to 200k.
    let windows: &[u32] = if full { &[25_000, 50_000, 100_000, 200_000] } else { &[10, 100] };
    for leaking in [false, true] {
        let mut shortest = None;
        for &window in windows {
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--long-case", &window.to_string(), &leaking.to_string()])
                .stderr(std::process::Stdio::inherit())
                .output()
                .unwrap();
            let line = String::from_utf8_lossy(&output.stdout);
            let mut fields = line.split_whitespace();
            let (Some(micros), Some(ran)) = (fields.next().and_then(|f| f.parse::<f64>().ok()), fields.next()) else {
                panic!("the case {window} {leaking} printed {line:?}")
            };
            let ratio = micros / *shortest.get_or_insert(micros);
            let body = if leaking { "kept (a leak)" } else { "dropped (clean)" };
            println!("| {body} | {window} | {ran} | {micros:.1} | {ratio:.2} |");
        }
    }
    println!();
}

/// One case of `ready_queue_costs`, in a process of its own as under
/// nextest: CUDA's start-up where a call needs a device, then each call in
/// turn ("prewarm": CUDA's whole one-time state, printed part by part;
/// "cuda:N" or "cpu:N": growing that device's autograd ready queue to hold
/// N tasks). Prints one "label milliseconds" pair per line.
fn ready_queue_case(calls: &[String]) {
    if calls.iter().any(|call| !call.starts_with("cpu:")) {
        // Loads libtorch's CUDA library, which tch alone does not.
        assert!(cuda::is_available(), "a CUDA call in a case, and no CUDA device");
        drop(Tensor::zeros([1], (Kind::Float, Device::Cuda(0))));
        cuda::synchronize(0).unwrap();
    }
    for (at, call) in calls.iter().enumerate() {
        let started = Instant::now();
        if call == "prewarm" {
            let parts = cuda::prewarm(0).unwrap();
            for (part, time) in [
                ("cublas_here", parts.cublas_here),
                ("callers_queue", parts.callers_queue),
                ("waiting_beside", parts.waiting_beside),
                ("beside.autograd_worker", parts.autograd_worker),
                ("beside.device_queue", parts.device_queue),
                ("all", started.elapsed()),
            ] {
                println!("{at}.{part} {:.3}", time.as_secs_f64() * 1e3);
            }
            continue;
        }
        let (device, tasks) = call.split_once(':').unwrap_or_else(|| panic!("a call is prewarm, cuda:N or cpu:N, not {call:?}"));
        let device = if device == "cpu" { Device::Cpu } else { Device::Cuda(0) };
        cuda::grow_autograd_ready_queue(device, tasks.parse().unwrap()).unwrap();
        if device != Device::Cpu {
            cuda::synchronize(0).unwrap();
        }
        println!("{at}.{call} {:.3}", started.elapsed().as_secs_f64() * 1e3);
    }
}

/// What growing autograd's ready queues costs, and of what: a first call in
/// a process (the engine's and the operators' first use on the device)
/// against later ones, and few tasks against many. Each case runs in
/// fresh processes, as a test does under nextest.
fn ready_queue_costs(full: bool, has_cuda: bool) {
    println!("### Growing autograd's ready queues: each call in order, a fresh process per run\n");
    let mut cases: Vec<&[&str]> = vec![&["cpu:64", "cpu:64", "cpu:256", "cpu:256", "cpu:16"]];
    if has_cuda {
        cases.push(&["prewarm", "cuda:256", "cuda:64", "cuda:16", "cuda:1", "cpu:64"]);
        cases.push(&["cuda:1", "cuda:1", "cuda:16", "cuda:256", "cuda:256", "cuda:64"]);
        cases.push(&["cuda:256", "cuda:256", "cuda:1"]);
    }
    let runs = if full { 7 } else { 1 };
    println!("| case | call | median ms | min | max |\n| --- | --- | --- | --- | --- |");
    for (number, case) in cases.iter().enumerate() {
        let mut times: Vec<(String, Vec<f64>)> = Vec::new();
        for _ in 0..runs {
            let output = std::process::Command::new(std::env::current_exe().unwrap())
                .arg("--ready-queue-case")
                .args(*case)
                .stderr(std::process::Stdio::inherit())
                .output()
                .unwrap();
            assert!(output.status.success(), "the case {case:?} failed");
            for (at, line) in String::from_utf8_lossy(&output.stdout).lines().enumerate() {
                let (label, ms) = line.split_once(' ').unwrap_or_else(|| panic!("the case {case:?} printed {line:?}"));
                if times.len() <= at {
                    times.push((label.to_string(), Vec::new()));
                }
                times[at].1.push(ms.parse().unwrap());
            }
        }
        for (label, mut ms) in times {
            ms.sort_by(f64::total_cmp);
            println!("| {} | {label} | {:.3} | {:.3} | {:.3} |", number + 1, ms[ms.len() / 2], ms[0], ms[ms.len() - 1]);
        }
    }
    println!();
}

/// Writing one report's files (JSON, page, index row) into a folder that
/// already holds 10 reports, and into one that holds many: the index must
/// cost the same. 200 writes each (20 tests, 10 runs), compactions included.
fn index_cost(scale: &Scale) {
    use gpu_leak_test::report::files::write_report;
    let template = LeakTest::new("template").device(tch::Device::Cpu).scope(gpu_leak_test::settings::Scope::Thread).run(|_| {}).unwrap();
    println!("### Writing a report into a folder of earlier reports\n");
    println!("| earlier reports in the folder | ms per report written (mean of 200) | index.rows after |\n| --- | --- | --- |");
    for old in [10, scale.old_reports] {
        let dir = std::env::temp_dir().join(format!("gpu-leak-test-bench-index-{old}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut report = template.clone();
        for i in 0..old {
            report.test = format!("earlier::test_{i}");
            write_report(&report, &dir, gpu_leak_test::settings::Plots::None).unwrap();
        }
        let start = Instant::now();
        for i in 0..200 {
            report.test = format!("suite::test_{}", i % 20);
            write_report(&report, &dir, gpu_leak_test::settings::Plots::None).unwrap();
        }
        let ms = start.elapsed().as_secs_f64() * 1e3 / 200.0;
        let rows = std::fs::metadata(dir.join("index.rows")).map(|m| m.len()).unwrap_or(0);
        println!("| {old} | {ms:.2} | {} KiB |", rows / 1024);
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!();
}

/// The sections, in the order they print; `overhead --bench heavy step`
/// runs only the ones named.
const SECTIONS: &[&str] =
    &["step", "heavy", "events", "host-objects", "capture", "index", "queues", "sensitivity", "false-alarms", "shapes", "long"];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // One case of `long_windows`, in its own process: prints its figures.
    if let [flag, window, leaking] = &args[..] {
        if flag == "--long-case" {
            let (micros, ran) = long_run(window.parse().unwrap(), leaking == "true");
            println!("{micros} {ran}");
            return;
        }
    }
    if args.first().is_some_and(|a| a == "--ready-queue-case") {
        ready_queue_case(&args[1..]);
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--pool-rounds") {
        pool_rounds(&args[at + 1..]);
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--pool-blocks") {
        pool_blocks(&args[at + 1..]);
        return;
    }
    if let Some(path) = args.iter().find_map(|a| a.strip_prefix("--save-blocks=")) {
        open_to_append(&SAVED_BLOCKS, "--save-blocks", path);
    }
    if let Some(path) = args.iter().find_map(|a| a.strip_prefix("--save-rounds=")) {
        open_to_append(&SAVED_ROUNDS, "--save-rounds", path);
    }
    check_turn_orders();
    check_interval_text();
    let full = args.iter().any(|a| a == "--bench");
    let named: Vec<&str> = args.iter().map(String::as_str).filter(|a| SECTIONS.contains(a)).collect();
    let wanted = |section: &str| named.is_empty() || named.contains(&section);
    // `--rounds=N`: more rounds where a median's spread must be narrower
    // than a target's margin.
    let rounds = args.iter().find_map(|a| a.strip_prefix("--rounds=")?.parse::<usize>().ok());
    let chosen = if full { &FULL } else { &SMOKE };
    // `--round-seconds=S`: longer rounds, where single steps move more than
    // the variants differ (a host-bound CUDA step).
    let round_seconds = args.iter().find_map(|a| a.strip_prefix("--round-seconds=")?.parse::<f64>().ok());
    // `--block-steps=N`: the variants take turns every N steps within a
    // round, where the host's speed drifts within a round more than the
    // variants differ.
    let block_steps = args.iter().find_map(|a| a.strip_prefix("--block-steps=")?.parse::<usize>().ok());
    let scale = &Scale {
        rounds: rounds.unwrap_or(chosen.rounds),
        block_steps,
        round_seconds: round_seconds.unwrap_or(chosen.round_seconds),
        steps_per_round: if round_seconds.is_some() && full { 10_000 } else { chosen.steps_per_round },
        ..*chosen
    };
    // `--runs=N`: how many clean runs the false-alarm section makes.
    let false_alarm_runs = args.iter().find_map(|a| a.strip_prefix("--runs=")?.parse::<usize>().ok());
    // `--counting-only`: the step sections run only the counting target's
    // variants, so `--rounds` can be large; `--target-only`, only the
    // counting target's own figure; `--attribution-only`, only the
    // attribution target's.
    let variant_sets: [(&str, &[Variant]); 3] =
        [("--target-only", &TARGET_VARIANTS), ("--counting-only", &COUNTING_VARIANTS), ("--attribution-only", &ATTRIBUTION_VARIANTS)];
    let chosen_sets: Vec<_> = variant_sets.iter().filter(|(flag, _)| args.iter().any(|a| a == flag)).collect();
    assert!(
        chosen_sets.len() <= 1,
        "{} choose different variant sets: pass one of them",
        chosen_sets.iter().map(|(flag, _)| *flag).collect::<Vec<_>>().join(" and ")
    );
    let variants: &[Variant] = chosen_sets.first().map_or(&VARIANTS, |(_, set)| set);
    let has_cuda = cuda::is_available();
    println!("## gpu-leak-test overhead and sensitivity\n");
    println!(
        "Machine: {} CPU threads{}.\n",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        if has_cuda { format!(", {} CUDA device(s)", cuda::device_count()) } else { ", no CUDA".into() }
    );
    // `--devices=cuda` (or `cpu`): the step sections on that device only, so
    // a profiler's samples come from one device's step.
    let only = args.iter().find_map(|a| a.strip_prefix("--devices="));
    assert!(matches!(only, None | Some("cpu" | "cuda")), "--devices= takes cpu or cuda, not {:?}", only.unwrap_or_default());
    let mut devices = vec![Device::Cpu];
    if has_cuda {
        devices.push(Device::Cuda(0));
    }
    devices.retain(|&device| only.is_none_or(|only| only == if device == Device::Cpu { "cpu" } else { "cuda" }));
    if wanted("step") {
        for &device in &devices {
            with_cpu_threads_at_most(device, MLP_CPU_THREADS, || {
                step_overhead(&mut MlpStep::new(device), device, scale, variants)
            });
        }
    }
    if wanted("heavy") {
        for &device in &devices {
            heavy_step_overhead(device, scale, variants);
        }
    }
    if wanted("events") && !wanted("heavy") {
        for &device in &devices {
            event_costs(device, scale);
        }
    }
    if wanted("host-objects") {
        host_object_pair_costs(scale);
    }
    if wanted("capture") {
        capture_cost(scale);
    }
    if wanted("index") {
        index_cost(scale);
    }
    if wanted("queues") {
        ready_queue_costs(full, has_cuda);
    }
    if wanted("sensitivity") {
        println!("### Smallest leak flagged (threshold 0, sweep from one element, doubling)\n");
        println!("| device | smallest leak flagged | as measured |\n| --- | --- | --- |");
        sensitivity(Device::Cpu, "cpu");
        if has_cuda {
            sensitivity(Device::Cuda(0), "cuda");
        }
        println!();
    }
    let names = if has_cuda { vec!["cpu", "cuda"] } else { vec!["cpu"] };
    if wanted("false-alarms") {
        println!("### False alarms on a varied clean scenario\n");
        println!("Shapes change every iteration, a buffer is replaced every iteration, some iterations work on a helper thread, four leak tests run at once, and a thread allocates without the hook all along.\n");
        println!("| device | runs | false alarms |\n| --- | --- | --- |");
        for &device in &names {
            let (alarms, runs) = false_alarms(device, false_alarm_runs.unwrap_or(scale.false_alarm_runs));
            println!("| {device} | {runs} | {alarms} |");
            assert!(full || alarms == 0, "false alarms in the smoke run");
        }
        println!();
    }
    if wanted("long") {
        long_windows(full);
    }
    if wanted("shapes") {
        println!("### Bounded shapes and periodic leaks (warm-up {SHAPE_WARMUP}, window {SHAPE_WINDOW}, threshold 0)\n");
        println!(
            "Plateaus settle at a random measured iteration within the window; sawtooths have periods 2 to {} in a random phase; \
             leaks keep a random-sized tensor every k-th iteration in a random phase.\n",
            SHAPE_WINDOW + 1
        );
        println!("| device | shapes | runs | wrong verdicts |\n| --- | --- | --- | --- |");
        for &device in &names {
            let (alarms, runs) = bounded_shape_alarms(device, scale.false_alarm_runs);
            println!("| {device} | plateaus and sawtooths (false alarms) | {runs} | {alarms} |");
            assert!(full || alarms == 0, "false alarms on bounded shapes in the smoke run");
            for (k, misses, runs) in periodic_leak_misses(device, scale.false_alarm_runs) {
                println!("| {device} | leak every {k} iteration{} (misses) | {runs} | {misses} |", if k == 1 { "" } else { "s" });
                assert!(full || misses == 0, "missed leaks in the smoke run");
            }
        }
        println!();
    }
}
