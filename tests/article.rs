//! The article's scenarios (shared/article, summarised with what is really
//! true in DESIGN.md's table), each in its leaking and its fixed form,
//! translated to tch. Leaking forms are checked on the `Report`: verdict,
//! call site and bytes per iteration. The accounting is exact, so the
//! tolerance on bytes per iteration is zero; on CUDA sizes are rounded up to
//! the caching allocator's 512-byte blocks.
//!
//! Every scenario runs on the CPU (CI) and again on CUDA where there is a GPU.
//! `scripts/main-job.sh` runs this file and prints every report.
mod common;

use common::{allocated_size, LineMark};
use gpu_leak_test::internals::probe::{self, Tracker};
use gpu_leak_test::report::RetainedDuring;
use gpu_leak_test::{report::Layer, LeakTest, Report, Verdict};
use tch::nn::{self, Module, ModuleT, OptimizerConfig};
use tch::{Device, Kind, Tensor};

const FILE: &str = "tests/article.rs";
/// The article's model: nn.Linear(1000, 1000), batch 32.
const FEATURES: i64 = 1000;
const BATCH: i64 = 32;
/// One [32, 1000] f32 activation.
const ACTIVATION_BYTES: u64 = (BATCH * FEATURES * 4) as u64;

/// A leak test located at the line that calls this.
#[track_caller]
fn harness(name: &str, device: &str) -> LeakTest {
    common::located(name).device(common::device(device))
}

/// Prints the report (the main job's output) and writes its files beside the
/// other reports, as the attribute does.
fn show(report: &Report) {
    let mut report = report.clone();
    report.write_files();
    println!("{report}\n");
}

fn assert_leak(report: &Report, site: &str, bytes_per_iteration: u64) {
    let Verdict::Leak(leak) = &report.verdict else { panic!("expected a leak:\n{report}") };
    assert_eq!(leak.bytes_per_iteration, bytes_per_iteration as f64, "bytes per iteration\n{report}");
    if !common::sites_can_be_named(report) {
        return;
    }
    let top = report.top_site().unwrap_or_else(|| panic!("no allocation site:\n{report}"));
    // Allocations inside a helper (`input()`) are named at the helper and
    // at the line that called it.
    let named = [top.location.as_deref(), top.called_from.as_deref()];
    assert!(named.contains(&Some(site)), "call site {site} not in {named:?}\n{report}");
}

/// A kept tensor that still holds its graph's nodes: the verdict is about
/// libtorch's host objects (the nodes outweigh a scalar), named at a line of
/// the loop, and the tensors' own leak beside it is exact.
fn assert_keeps_graph_nodes(report: &Report, tensor_bytes_per_iteration: u64) {
    assert_eq!(report.verdict_layer, Layer::HostObjects, "the kept graph's nodes are the verdict\n{report}");
    let Verdict::Leak(nodes) = &report.verdict else { panic!("expected a leak:\n{report}") };
    assert!(nodes.bytes_per_iteration > tensor_bytes_per_iteration as f64, "{report}");
    let tensors = report.judged(Layer::Tensors(report.device)).expect("the body's tensors are judged");
    let Verdict::Leak(kept) = &tensors.verdict else { panic!("the kept scalars are a leak too:\n{report}") };
    assert_eq!(kept.bytes_per_iteration, tensor_bytes_per_iteration as f64, "{report}");
    if common::sites_can_be_named(report) {
        let top = report.top_site().unwrap_or_else(|| panic!("no allocation site:\n{report}"));
        assert_eq!(top.layer, Layer::HostObjects, "{report}");
        assert!(top.location.as_deref().is_some_and(|l| l.starts_with(FILE)), "the line that builds the graph\n{report}");
    }
    assert!(report.to_string().contains("libtorch's host objects"), "{report}");
}

fn assert_passes(report: &Report) {
    assert!(report.passed(), "expected a pass:\n{report}");
}

fn linear(vs: &nn::VarStore) -> nn::Linear {
    nn::linear(vs.root() / "fc", FEATURES, FEATURES, Default::default())
}

fn input(device: Device) -> Tensor {
    Tensor::randn([BATCH, FEATURES], (Kind::Float, device))
}

// Row 1: the training loop keeps `loss` tensors in a list.

/// The article's loop: `losses.append(loss)` after `backward()`. backward()
/// frees the graph's buffers, so each step retains one scalar (4 B on the
/// CPU, one 512-byte block on CUDA) and that scalar's graph nodes on the
/// host (libtorch's host objects, about 2.7 KiB a step here). Slow, but it
/// never stops.
fn row1_keeping_losses_after_backward_leaks_a_scalar_per_step(device: &str) {
    let mark = &LineMark::default();
    let report = harness("row1_keeps_losses", device).run_with_setup(|device| training_loop_keeping_losses(device, mark)).unwrap();
    show(&report);
    assert_keeps_graph_nodes(&report, allocated_size(device, 4));
}

/// Setup and one step of the article's loop that keeps every loss tensor.
fn training_loop_keeping_losses(device: Device, mark: &LineMark) -> impl FnMut() + '_ {
    let vs = nn::VarStore::new(device);
    let model = linear(&vs);
    let mut opt = nn::Sgd::default().build(&vs, 0.01).unwrap();
    let mut losses = Vec::new();
    move || {
        let y = model.forward(&input(device));
        mark.set(line!()); let loss = y.sum(Kind::Float);
        loss.backward();
        losses.push(loss);
        opt.step();
    }
}

/// Without backward() the kept loss holds its whole graph: the scalar and
/// the input that Linear saved for the weight gradient.
fn row1_keeping_losses_without_backward_keeps_the_graph(device: &str) {
    let mark = &LineMark::default();
    let report = harness("row1_keeps_graph", device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            let mut losses = Vec::new();
            move || {
                mark.set(line!()); let x = input(device);
                losses.push(model.forward(&x).sum(Kind::Float));
            }
        })
        .unwrap();
    show(&report);
    // The saved input is the biggest survivor; the scalar comes with it.
    assert_leak(&report, &mark.location(FILE), allocated_size(device, ACTIVATION_BYTES) + allocated_size(device, 4));
}

/// The fix: keep the number, not the tensor.
fn row1_fixed_keeping_plain_numbers_passes(device: &str) {
    let report = harness("row1_fixed", device)
        .threshold_mb(0.0)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            let mut opt = nn::Sgd::default().build(&vs, 0.01).unwrap();
            let mut losses: Vec<f64> = Vec::new();
            move || {
                opt.zero_grad();
                let loss = model.forward(&input(device)).sum(Kind::Float);
                loss.backward();
                losses.push(loss.double_value(&[]));
                opt.step();
            }
        })
        .unwrap();
    show(&report);
    assert_passes(&report);
}

// Row 2: outputs cached in a list.

/// Cached outputs that require grad keep their graph: the output and the
/// input Linear saved, two activations per step.
fn row2_caching_outputs_keeps_output_and_saved_input(device: &str) {
    let mark = &LineMark::default();
    let report = harness("row2_caches_outputs", device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            let mut cached_outputs = Vec::new();
            move || {
                let x = input(device);
                mark.set(line!()); let y = model.forward(&x);
                cached_outputs.push(y);
            }
        })
        .unwrap();
    show(&report);
    let Verdict::Leak(leak) = &report.verdict else { panic!("expected a leak:\n{report}") };
    assert_eq!(leak.bytes_per_iteration, 2.0 * allocated_size(device, ACTIVATION_BYTES) as f64, "{report}");
    if !common::sites_can_be_named(&report) {
        return;
    }
    // Two sites of one activation each: the output (named) and the input.
    let sites = &report.findings.attribution.as_ref().unwrap().sites;
    assert!(sites.iter().any(|s| s.location.as_deref() == Some(mark.location(FILE).as_str())), "{report}");
}

/// `detach()` drops the graph: the cache still grows, by the output alone.
fn row2_caching_detached_outputs_still_grows_by_the_output(device: &str) {
    let mark = &LineMark::default();
    let report = harness("row2_caches_detached", device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            let mut cached_outputs = Vec::new();
            move || {
                mark.set(line!()); let y = model.forward(&input(device)).detach();
                cached_outputs.push(y);
            }
        })
        .unwrap();
    show(&report);
    assert_leak(&report, &mark.location(FILE), allocated_size(device, ACTIVATION_BYTES));
}

/// The fix: don't cache tensors; keep what you need as numbers.
fn row2_fixed_not_caching_passes(device: &str) {
    let report = harness("row2_fixed", device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            let mut means = Vec::new();
            move || means.push(tch::no_grad(|| model.forward(&input(device)).mean(Kind::Float).double_value(&[])))
        })
        .unwrap();
    show(&report);
    assert_passes(&report);
}

// Row 3: evaluation without no_grad.

fn mlp(vs: &nn::VarStore) -> impl Module {
    let root = vs.root();
    nn::seq()
        .add(nn::linear(&root / "l1", FEATURES, FEATURES, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "l2", FEATURES, FEATURES, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "l3", FEATURES, 10, Default::default()))
}

fn evaluate(name: &str, device: &str, with_no_grad: bool, peak_mb: Option<f64>) -> Report {
    let mut test = harness(name, device);
    if let Some(budget) = peak_mb {
        test = test.peak_mb(budget);
    }
    test.run_with_setup(|device| {
        let vs = nn::VarStore::new(device);
        let model = mlp(&vs);
        move || {
            let x = input(device);
            let forward = || model.forward(&x).sum(Kind::Float).double_value(&[]);
            let _ = if with_no_grad { tch::no_grad(forward) } else { forward() };
        }
    })
    .unwrap()
}

/// The article says memory grows; it does not once the output is dropped
/// each step. What no_grad saves is the peak: activations saved for a
/// backward that never comes.
fn row3_evaluation_without_no_grad_does_not_grow_but_peaks_higher(device: &str) {
    let without = evaluate("row3_eval_without_no_grad", device, false, None);
    let with = evaluate("row3_eval_with_no_grad", device, true, None);
    show(&without);
    show(&with);
    assert_passes(&without);
    assert_passes(&with);
    assert_eq!(without.retained_growth_bytes(), 0, "{without}");
    // A passing test's figures are its body's tensors', which keep a peak.
    let (Some(peak_without), Some(peak_with)) = (without.figures.peak_bytes, with.figures.peak_bytes) else {
        panic!("tensor layers keep a peak:\n{without}\n{with}")
    };
    assert!(peak_without > peak_with, "peak without no_grad {peak_without} should exceed peak with it {peak_with}");
    println!(
        "row 3: peak without no_grad {peak_without} B, with no_grad {peak_with} B (+{} B of saved activations)\n",
        peak_without - peak_with
    );
    // A peak budget between the two fails evaluation without no_grad only.
    let budget_mb = (peak_without + peak_with) as f64 / 2.0 / (1024.0 * 1024.0);
    let over = evaluate("row3_eval_without_no_grad_budget", device, false, Some(budget_mb));
    show(&over);
    assert!(matches!(over.verdict, Verdict::PeakOverBudget { .. }), "{over}");
    assert_passes(&evaluate("row3_eval_with_no_grad_budget", device, true, Some(budget_mb)));
}

// Row 4: a global buffer holds the last output.

/// Bounded: the buffer holds one output (and its graph's saved input) at a
/// time. One-time retention, reported and not failed.
fn row4_global_buffer_is_one_time_retention(device: &str) {
    let report = harness("row4_global_buffer", device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            let mut global_buffer: Option<Tensor> = None;
            move || {
                global_buffer.replace(model.forward(&input(device)));
            }
        })
        .unwrap();
    show(&report);
    assert_passes(&report);
    let Verdict::OneTimeRetention { bytes, during: RetainedDuring::WarmUp } = report.verdict else {
        panic!("expected one-time retention in warm-up:\n{report}")
    };
    assert_eq!(bytes as u64, 2 * allocated_size(device, ACTIVATION_BYTES), "{report}");
}

/// The fix: scope it. Nothing retained.
fn row4_fixed_scoped_output_is_clean(device: &str) {
    let report = harness("row4_fixed", device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            move || {
                let y = model.forward(&input(device));
                let _ = y.mean(Kind::Float).double_value(&[]);
            }
        })
        .unwrap();
    show(&report);
    assert_eq!(report.verdict, Verdict::Clean, "{report}");
}

// Row 5: no zero_grad().

fn train_steps(name: &str, device: &str, zero_grad: bool, grad_sums: &std::cell::RefCell<Vec<f64>>) -> Report {
    harness(name, device)
        .run_with_setup(|device| {
            let vs = nn::VarStore::new(device);
            let model = linear(&vs);
            let mut opt = nn::Sgd::default().build(&vs, 0.0).unwrap();
            let x = Tensor::ones([BATCH, FEATURES], (Kind::Float, device));
            move || {
                if zero_grad {
                    opt.zero_grad();
                }
                model.forward(&x).sum(Kind::Float).backward();
                opt.step();
                grad_sums.borrow_mut().push(model.bs.as_ref().unwrap().grad().sum(Kind::Float).double_value(&[]));
            }
        })
        .unwrap()
}

/// Gradients accumulate in place: their values grow, their memory does not.
/// Allocated once in the first step (warm-up), then flat.
fn row5_gradients_without_zero_grad_accumulate_in_place(device: &str) {
    let sums = std::cell::RefCell::new(Vec::new());
    let report = train_steps("row5_no_zero_grad", device, false, &sums);
    show(&report);
    assert_passes(&report);
    let Verdict::OneTimeRetention { bytes, during: RetainedDuring::WarmUp } = report.verdict else {
        panic!("expected one-time retention in warm-up:\n{report}")
    };
    // The weight and bias gradients.
    assert_eq!(bytes as u64, allocated_size(device, (FEATURES * FEATURES * 4) as u64) + allocated_size(device, (FEATURES * 4) as u64));
    let sums = sums.into_inner();
    // d(sum)/d(bias) is BATCH per element; without zero_grad it adds up.
    assert_eq!(sums[0], (BATCH * FEATURES) as f64);
    assert_eq!(sums[3], 4.0 * (BATCH * FEATURES) as f64, "{sums:?}");

    let fixed_sums = std::cell::RefCell::new(Vec::new());
    let fixed = train_steps("row5_fixed_zero_grad", device, true, &fixed_sums);
    show(&fixed);
    assert_passes(&fixed);
    assert_eq!(fixed.figures.warmup_retained_bytes, report.figures.warmup_retained_bytes, "zero_grad changes values, not memory");
    assert!(fixed_sums.into_inner().iter().all(|&s| s == (BATCH * FEATURES) as f64));
}

// Row 6: empty_cache().

/// The article's `free_gpu_memory()` (empty the cache every step) does not
/// stop a leak: the cache holds only blocks no tensor uses.
fn row6_empty_cache_does_not_hide_a_leak(device: &str) {
    let mark = &LineMark::default();
    let report = harness("row6_empty_cache_each_step", device)
        .run_with_setup(|device| {
            let mut kept = Vec::new();
            move || {
                mark.set(line!()); kept.push(input(device));
                if let Device::Cuda(_) = device {
                    probe::cuda::empty_cache().unwrap();
                }
            }
        })
        .unwrap();
    show(&report);
    assert_leak(&report, &mark.location(FILE), allocated_size(device, ACTIVATION_BYTES));
}

/// On CUDA: empty_cache() lowers reserved, never allocated.
fn row6_empty_cache_lowers_reserved_not_allocated(device: &str) {
    let Ok(index) = probe::cuda::check_device(0) else {
        println!("row 6 on {device}: libtorch keeps no CPU cache; empty_cache() applies to CUDA only\n");
        return;
    };
    if !common::cuda_tensors_are_cached_blocks() {
        println!("row 6 on {device}: skipped: no caching allocator serves CUDA tensors here, so there is no cache to empty\n");
        return;
    }
    let index = index as usize;
    let device = Device::Cuda(index);
    let referenced = input(device);
    drop(Tensor::zeros([64 << 20], (Kind::Float, device)));
    probe::cuda::synchronize(index).unwrap();
    let before = probe::cuda::allocator_stats(index).unwrap();
    probe::cuda::empty_cache().unwrap();
    let after = probe::cuda::allocator_stats(index).unwrap();
    println!(
        "row 6: empty_cache(): allocated {} -> {} B, reserved {} -> {} B\n",
        before.allocated_bytes.current, after.allocated_bytes.current, before.reserved_bytes.current, after.reserved_bytes.current
    );
    assert_eq!(after.allocated_bytes.current, before.allocated_bytes.current);
    assert!(after.reserved_bytes.current + (256 << 20) <= before.reserved_bytes.current);
    drop(referenced);
}

// Row 7: reset_peak_memory_stats() in "force free".

/// Resetting peak statistics frees nothing: allocated and reserved stay,
/// only the peak moves down to the current value.
fn row7_resetting_peak_statistics_frees_nothing(device: &str) {
    let mark = &LineMark::default();
    let report = harness("row7_reset_peak_each_step", device)
        .run_with_setup(|device| {
            let mut kept = Vec::new();
            move || {
                mark.set(line!()); kept.push(input(device));
                if let Device::Cuda(index) = device {
                    probe::cuda::reset_peak_stats(index).unwrap();
                }
            }
        })
        .unwrap();
    show(&report);
    assert_leak(&report, &mark.location(FILE), allocated_size(device, ACTIVATION_BYTES));

    if !common::cuda_tensors_are_cached_blocks() {
        println!("row 7: the statistics' part skipped: no caching allocator serves CUDA tensors here\n");
    } else if let Device::Cuda(index) = report.device {
        let held = Tensor::zeros([1 << 20], (Kind::Float, report.device));
        drop(Tensor::zeros([16 << 20], (Kind::Float, report.device)));
        probe::cuda::synchronize(index).unwrap();
        let before = probe::cuda::allocator_stats(index).unwrap();
        probe::cuda::reset_peak_stats(index).unwrap();
        let after = probe::cuda::allocator_stats(index).unwrap();
        println!(
            "row 7: reset_peak_stats(): allocated {} -> {} B, reserved {} -> {} B, peak {} -> {} B\n",
            before.allocated_bytes.current,
            after.allocated_bytes.current,
            before.reserved_bytes.current,
            after.reserved_bytes.current,
            before.allocated_bytes.peak,
            after.allocated_bytes.peak
        );
        assert_eq!(after.allocated_bytes.current, before.allocated_bytes.current);
        assert_eq!(after.reserved_bytes.current, before.reserved_bytes.current);
        assert_eq!(after.allocated_bytes.peak, after.allocated_bytes.current);
        assert!(before.allocated_bytes.peak > after.allocated_bytes.peak);
        drop(held);
    }
}

// Row 8: the article's trainer, with monitor, gradient accumulation,
// validation under no_grad and a checkpoint copied to the CPU.

/// The article's SimpleModel: 784-256-256-10 with ReLU and dropout 0.3.
fn simple_model(vs: &nn::VarStore) -> impl ModuleT {
    let root = vs.root();
    nn::seq_t()
        .add(nn::linear(&root / "l1", 784, 256, Default::default()))
        .add_fn(|x| x.relu())
        .add_fn_t(|x, train| x.dropout(0.3, train))
        .add(nn::linear(&root / "l2", 256, 256, Default::default()))
        .add_fn(|x| x.relu())
        .add_fn_t(|x, train| x.dropout(0.3, train))
        .add(nn::linear(&root / "l3", 256, 10, Default::default()))
}

struct Trainer {
    vs: nn::VarStore,
    model: Box<dyn ModuleT>,
    optimizer: nn::Optimizer,
    train: Vec<(Tensor, Tensor)>,
    val: Vec<(Tensor, Tensor)>,
    accumulation_steps: usize,
    best_accuracy: f64,
    checkpoint: Vec<(String, Tensor)>,
    history: Vec<f64>,
}

impl Trainer {
    fn new(device: Device) -> Trainer {
        let batches = |n: usize| -> Vec<(Tensor, Tensor)> {
            (0..n)
                .map(|_| (Tensor::randn([64, 784], (Kind::Float, device)), Tensor::randint(10, [64], (Kind::Int64, device))))
                .collect()
        };
        let vs = nn::VarStore::new(device);
        let model = Box::new(simple_model(&vs));
        let optimizer = nn::Adam::default().build(&vs, 1e-3).unwrap();
        Trainer {
            vs,
            model,
            optimizer,
            train: batches(8),
            val: batches(2),
            accumulation_steps: 2,
            best_accuracy: -1.0,
            checkpoint: Vec::new(),
            history: Vec::new(),
        }
    }

    /// One epoch: train with gradient accumulation, validate, checkpoint.
    fn epoch(&mut self) {
        self.optimizer.zero_grad();
        let mut total_loss = 0.0;
        for (step, (data, target)) in self.train.iter().enumerate() {
            let output = self.model.forward_t(data, true);
            let loss = output.cross_entropy_for_logits(target) / self.accumulation_steps as f64;
            loss.backward();
            if (step + 1) % self.accumulation_steps == 0 {
                self.optimizer.step();
                self.optimizer.zero_grad();
            }
            total_loss += loss.double_value(&[]) * self.accumulation_steps as f64;
        }
        self.history.push(total_loss / self.train.len() as f64);
        let accuracy = tch::no_grad(|| {
            let correct: f64 = self
                .val
                .iter()
                .map(|(data, target)| {
                    let output = self.model.forward_t(data, false);
                    output.argmax(1, false).eq_tensor(target).sum(Kind::Float).double_value(&[])
                })
                .sum();
            correct / (self.val.len() * 64) as f64
        });
        if accuracy > self.best_accuracy {
            self.best_accuracy = accuracy;
            // A copy on the CPU, so the checkpoint holds no device memory.
            self.checkpoint =
                self.vs.variables().into_iter().map(|(name, t)| (name, t.to_device(Device::Cpu).copy())).collect();
        }
    }
}

fn row8_article_trainer_is_clean_at_threshold_zero(device: &str) {
    let report = harness("row8_trainer", device)
        .threshold_mb(0.0)
        .run_with_setup(|device| {
            let mut trainer = Trainer::new(device);
            move || trainer.epoch()
        })
        .unwrap();
    show(&report);
    assert_passes(&report);
}

// Row 9: the article's detect_leak() heuristic.

/// The article's GPUMemoryMonitor.detect_leak: compare the first and last of
/// the last five samples against a threshold (500 MB in its trainer).
struct ArticleMonitor {
    history_mb: Vec<f64>,
}

impl ArticleMonitor {
    fn log_memory(&mut self, allocated_mb: f64) {
        self.history_mb.push(allocated_mb);
    }

    fn detect_leak(&self, threshold_mb: f64) -> bool {
        if self.history_mb.len() < 2 {
            return false;
        }
        let recent = &self.history_mb[self.history_mb.len().saturating_sub(5)..];
        recent[recent.len() - 1] - recent[0] > threshold_mb
    }
}

/// `torch.cuda.memory_allocated()` on CUDA; on the CPU, where libtorch keeps
/// no statistics, the exact hook stands in for it.
fn allocated_mb(device: Device, tracker: &Tracker) -> f64 {
    let bytes = match device {
        Device::Cuda(i) => probe::cuda::allocator_stats(i).unwrap().allocated_bytes.current as f64,
        _ => tracker.live_bytes(device) as f64,
    };
    bytes / (1024.0 * 1024.0)
}

/// Row 1's leak over 1,000 steps, sampled every step (the article samples
/// every 200): the heuristic never fires, the harness fails the test.
fn row9_article_detect_leak_misses_row1_that_the_harness_catches(device: &str) {
    let device = match device {
        "cpu" => Device::Cpu,
        _ => Device::Cuda(0),
    };
    // The article's monitor reads torch.cuda.memory_allocated(), which
    // counts nothing with caching switched off.
    let monitor_sees = device == Device::Cpu || !common::uncached();
    let tracker = Tracker::new();
    let hook = tracker.enter().unwrap();
    let unused_mark = LineMark::default();
    let mut training_step = training_loop_keeping_losses(device, &unused_mark);
    let mut monitor = ArticleMonitor { history_mb: Vec::new() };
    let mut fired = 0;
    let mut after_first_step = 0.0;
    for step in 0..1000 {
        training_step();
        monitor.log_memory(allocated_mb(device, &tracker));
        fired += monitor.detect_leak(500.0) as u32;
        if step == 0 {
            // The first step allocates the gradients: state, not the leak.
            after_first_step = allocated_mb(device, &tracker);
        }
    }
    let grew_mb = allocated_mb(device, &tracker) - after_first_step;
    println!(
        "row 9 on {device:?}: steps 2 to 1,000 leaked {grew_mb:.4} MB; the article's detect_leak(500) fired {fired} \
         times (at this rate it would fire only with samples about {:.0} million steps apart)\n",
        500.0 / (grew_mb / 999.0) / 4.0 / 1e6
    );
    assert_eq!(fired, 0, "the heuristic is blind to slow leaks");
    assert!(grew_mb > 0.0 || !monitor_sees);
    drop(training_step);
    drop(hook);

    // The same loop through the harness fails at once, naming the line.
    let dev = if device == Device::Cpu { "cpu" } else { "cuda" };
    let mark = &LineMark::default();
    let report =
        harness("row9_same_loop_in_the_harness", dev).run_with_setup(|device| training_loop_keeping_losses(device, mark)).unwrap();
    show(&report);
    assert_keeps_graph_nodes(&report, allocated_size(dev, 4));
}

on_each_device!(
    row1_keeping_losses_after_backward_leaks_a_scalar_per_step,
    row1_keeping_losses_without_backward_keeps_the_graph,
    row1_fixed_keeping_plain_numbers_passes,
    row2_caching_outputs_keeps_output_and_saved_input,
    row2_caching_detached_outputs_still_grows_by_the_output,
    row2_fixed_not_caching_passes,
    row3_evaluation_without_no_grad_does_not_grow_but_peaks_higher,
    row4_global_buffer_is_one_time_retention,
    row4_fixed_scoped_output_is_clean,
    row5_gradients_without_zero_grad_accumulate_in_place,
    row6_empty_cache_does_not_hide_a_leak,
    row6_empty_cache_lowers_reserved_not_allocated,
    row7_resetting_peak_statistics_frees_nothing,
    row8_article_trainer_is_clean_at_threshold_zero,
    row9_article_detect_leak_misses_row1_that_the_harness_catches,
);
