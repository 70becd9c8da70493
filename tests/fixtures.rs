//! Data-driven scenarios: each `fixtures/scenarios/*.yaml` describes a model,
//! what one iteration does, what it keeps, and the verdict, call site and
//! bytes per iteration to expect. Each file is one trial (libtest-mimic:
//! libtest-compatible output, name filtering, `--list`).
//!
//! A malformed file becomes a failing trial whose message names the file,
//! line and field; the other trials still run. `fixtures/invalid/` holds such
//! files, each with the message it must produce; the trials `invalid::*`
//! check that.
mod common;

use gpu_leak_test::{report::Layer, LeakTest, Report, Verdict};
use libtest_mimic::{Arguments, Failed, Trial};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use tch::nn::{self, Module, OptimizerConfig};
use tch::{Device, Kind, Tensor};

const SOURCE: &str = "tests/fixtures.rs";

/// One scenario file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    /// `fixtures/scenarios/<file>.yaml:<line>`, where the scenario begins:
    /// the location its report names (set by `load`).
    #[serde(skip)]
    location: String,
    description: String,
    /// `cpu`, `cuda`, or `each` (the CPU, and CUDA where present).
    #[serde(default = "each")]
    device: String,
    model: Model,
    /// What one iteration does, in order.
    steps: Vec<Step>,
    /// What the iteration keeps across iterations.
    #[serde(default)]
    retain: Option<Retain>,
    #[serde(default)]
    settings: ScenarioSettings,
    expect: Expect,
}

fn each() -> String {
    "each".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Model {
    /// Layer widths of an MLP with ReLU between layers: [input, hidden.., output].
    sizes: Vec<i64>,
    batch: i64,
    #[serde(default)]
    optimizer: Optimizer,
}

#[derive(Debug, Deserialize, Default, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Optimizer {
    #[default]
    None,
    Sgd,
    Adam,
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Step {
    /// output = model(input), building the autograd graph.
    Forward,
    /// output = model(input) under no_grad.
    ForwardNoGrad,
    /// loss = output.sum()
    Loss,
    Backward,
    /// The optimizer applies the gradients (`optimizer_step` in the YAML).
    #[serde(rename = "optimizer_step")]
    OptimizerUpdate,
    ZeroGrad,
    /// Allocates a 4 MiB tensor and drops it at once (raises the peak only).
    Transient,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Retain {
    what: Kept,
    /// Keep on every k-th iteration only.
    #[serde(default = "one")]
    every: u32,
    /// Keep only the latest (a bounded buffer) instead of all.
    #[serde(default)]
    last_only: bool,
    /// For `what: tensor`: elements of the fresh f32 tensor.
    #[serde(default)]
    elements: i64,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "snake_case")]
enum Kept {
    Loss,
    Output,
    DetachedOutput,
    OutputOnCpu,
    LossValue,
    Gradient,
    Tensor,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ScenarioSettings {
    warmup: Option<u32>,
    iterations: Option<u32>,
    threshold_mb: Option<f64>,
    peak_mb: Option<f64>,
}

/// A value that may differ between the CPU and CUDA.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
enum PerDevice<T> {
    Same(T),
    Each { cpu: T, cuda: T },
}

impl<T: Clone> PerDevice<T> {
    fn on(&self, device: Device) -> T {
        match (self, device) {
            (PerDevice::Same(v), _) => v.clone(),
            (PerDevice::Each { cpu, .. }, Device::Cpu) => cpu.clone(),
            (PerDevice::Each { cuda, .. }, _) => cuda.clone(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    /// clean, one_time_retention, plateau, within_threshold, bounded, leak, peak_over_budget
    verdict: PerDevice<String>,
    /// The step or retained value whose line the top site names:
    /// forward, loss, retain, gradient.
    #[serde(default)]
    site: Option<String>,
    /// Exact bytes per iteration of the body's device's tensors.
    #[serde(default)]
    bytes_per_iteration: Option<PerDevice<u64>>,
    /// The layer the verdict is about, where it is not the body's device's
    /// tensors: `host-objects` (libtorch's C++ heap).
    #[serde(default)]
    layer: Option<String>,
}

/// Lines of the executor below that allocate, so `expect.site` can name them.
#[derive(Default)]
struct Sites {
    forward: common::LineMark,
    loss: common::LineMark,
    retain: common::LineMark,
    gradient: common::LineMark,
}

impl Sites {
    fn location(&self, name: &str) -> Result<String, String> {
        let mark = match name {
            "forward" => &self.forward,
            "loss" => &self.loss,
            "retain" => &self.retain,
            "gradient" => &self.gradient,
            other => return Err(format!("expect.site: unknown site {other:?}; use forward, loss, retain or gradient")),
        };
        Ok(mark.location(SOURCE))
    }
}

fn mlp(vs: &nn::VarStore, sizes: &[i64]) -> nn::Sequential {
    let mut model = nn::seq();
    for (i, pair) in sizes.windows(2).enumerate() {
        if i > 0 {
            model = model.add_fn(|x| x.relu());
        }
        model = model.add(nn::linear(vs.root() / format!("l{i}"), pair[0], pair[1], Default::default()));
    }
    model
}

/// Runs one scenario on one device through the harness.
fn run(scenario: &Scenario, name: &str, device: &str, sites: &Sites) -> Result<Report, String> {
    // The build-time root: attribution shows the binary's (build-time) file
    // paths relative to it.
    let device: gpu_leak_test::settings::DeviceChoice = device.parse().map_err(|why: gpu_leak_test::settings::InvalidValue| why.to_string())?;
    let mut test = LeakTest::new(name).device(device).location(&scenario.location, env!("CARGO_MANIFEST_DIR"));
    let s = &scenario.settings;
    if let Some(v) = s.warmup {
        test = test.warmup(v);
    }
    if let Some(v) = s.iterations {
        test = test.iterations(v);
    }
    if let Some(v) = s.threshold_mb {
        test = test.threshold_mb(v);
    }
    if let Some(v) = s.peak_mb {
        test = test.peak_mb(v);
    }
    let model_spec = &scenario.model;
    let steps = scenario.steps.clone();
    let retain = scenario.retain.as_ref();
    test.run_with_setup(|device| {
        let vs = nn::VarStore::new(device);
        let model = mlp(&vs, &model_spec.sizes);
        let mut optimizer = match model_spec.optimizer {
            Optimizer::None => None,
            Optimizer::Sgd => Some(nn::Sgd::default().build(&vs, 0.01).unwrap()),
            Optimizer::Adam => Some(nn::Adam::default().build(&vs, 1e-3).unwrap()),
        };
        let first_weight = vs.variables()["l0.weight"].shallow_clone();
        let mut kept_tensors: Vec<Tensor> = Vec::new();
        let mut kept_numbers: Vec<f64> = Vec::new();
        let mut iteration = 0u32;
        move || {
            iteration += 1;
            let input = Tensor::randn([model_spec.batch, model_spec.sizes[0]], (Kind::Float, device));
            let mut output: Option<Tensor> = None;
            let mut loss: Option<Tensor> = None;
            for step in &steps {
                match step {
                    Step::Forward => {
                        sites.forward.set(line!()); output = Some(model.forward(&input));
                    }
                    Step::ForwardNoGrad => output = Some(tch::no_grad(|| model.forward(&input))),
                    Step::Loss => {
                        let out = output.as_ref().expect("`loss` needs `forward` before it");
                        sites.loss.set(line!()); loss = Some(out.sum(Kind::Float));
                    }
                    Step::Backward => loss.as_ref().expect("`backward` needs `loss` before it").backward(),
                    Step::OptimizerUpdate => optimizer.as_mut().expect("`optimizer_step` needs model.optimizer").step(),
                    Step::ZeroGrad => optimizer.as_mut().expect("`zero_grad` needs model.optimizer").zero_grad(),
                    Step::Transient => drop(Tensor::zeros([1 << 20], (Kind::Float, device))),
                }
            }
            let Some(retain) = retain else { return };
            if iteration % retain.every != 0 {
                return;
            }
            if retain.last_only {
                kept_tensors.clear();
            }
            let value = match retain.what {
                Kept::Loss => loss.take(),
                Kept::Output => output.take(),
                Kept::DetachedOutput => output.as_ref().map(|o| o.detach()),
                Kept::OutputOnCpu => output.as_ref().map(|o| o.to_device(Device::Cpu).copy()),
                Kept::LossValue => {
                    kept_numbers.push(loss.as_ref().map(|l| l.double_value(&[])).unwrap_or_default());
                    None
                }
                Kept::Gradient => {
                    sites.gradient.set(line!()); Some(first_weight.grad().copy())
                }
                Kept::Tensor => {
                    sites.retain.set(line!()); Some(Tensor::zeros([retain.elements], (Kind::Float, device)))
                }
            };
            kept_tensors.extend(value);
        }
    })
    .map_err(|e| e.to_string())
}

/// Runs a scenario and compares the report with `expect`.
fn check(scenario: &Scenario, name: &str, device: &str) -> Result<(), String> {
    let sites = Sites::default();
    let report = run(scenario, name, device, &sites)?;
    println!("{}\n  ({})\n{report}\n", name, scenario.description);
    if report.context.location.as_deref() != Some(scenario.location.as_str()) {
        return Err(format!("the report names {:?}, not the scenario's file {}\n{report}", report.context.location, scenario.location));
    }
    let expected = scenario.expect.verdict.on(report.device);
    let found = report.verdict.label();
    if found != expected {
        return Err(format!("expected verdict {expected}, found {found}\n{report}"));
    }
    // The verdict is about tensors (on whichever device they grew) unless
    // the scenario names another layer.
    let expected_layer = match scenario.expect.layer.as_deref() {
        None => Layer::Tensors(report.verdict_device),
        Some(name) => Layer::from_name(name).ok_or_else(|| format!("expect.layer: {name:?} is not a layer; use host-objects"))?,
    };
    if report.verdict_layer != expected_layer {
        return Err(format!("expected the verdict in layer {expected_layer}, found it in {}\n{report}", report.verdict_layer));
    }
    if let Some(bytes) = &scenario.expect.bytes_per_iteration {
        // Exact bytes of the tensors that grew: on the verdict's device, or
        // the body's beside a verdict about libtorch's host objects.
        // A scenario's CUDA figure counts the caching allocator's 512-byte
        // blocks; where each tensor is its own driver allocation instead,
        // the exact figure is the CPU's.
        let sized_as = if common::cuda_tensors_are_cached_blocks() { report.device } else { Device::Cpu };
        let expected = bytes.on(sized_as) as f64;
        let grown = if expected_layer == Layer::HostObjects { report.device } else { report.verdict_device };
        let tensors = report.judged(Layer::Tensors(grown)).map(|d| &d.verdict);
        let found = match tensors {
            Some(Verdict::Leak(leak)) => leak.bytes_per_iteration,
            _ => report.retained_growth_bytes() as f64 / report.settings.iterations as f64,
        };
        if found != expected {
            return Err(format!("expected {expected} B per iteration, found {found}\n{report}"));
        }
    }
    if let Some(site) = scenario.expect.site.as_ref().filter(|_| common::sites_can_be_named(&report)) {
        let expected = sites.location(site)?;
        let top = report.top_site().ok_or_else(|| format!("expected site {site} ({expected}), found no attribution\n{report}"))?;
        if top.location.as_deref() != Some(expected.as_str()) {
            return Err(format!("expected top site {site} at {expected}, found {:?}\n{report}", top.location));
        }
    }
    Ok(())
}

/// Loads a scenario; errors name the file, line, column and field.
fn load(path: &Path) -> Result<Scenario, String> {
    let root = common::manifest_dir();
    let display = path.strip_prefix(&root).unwrap_or(path).display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| format!("{display}: cannot read: {e}"))?;
    let mut scenario: Scenario = serde_yaml::from_str(&text).map_err(|e| match e.location() {
        Some(at) => {
            // serde_yaml ends its message with the location we put in front.
            let message = e.to_string();
            let suffix = format!(" at line {} column {}", at.line(), at.column());
            format!("{display}:{}:{}: {}", at.line(), at.column(), message.strip_suffix(&suffix).unwrap_or(&message))
        }
        None => format!("{display}: {e}"),
    })?;
    let valid_verdicts = ["clean", "one_time_retention", "plateau", "within_threshold", "bounded", "leak", "peak_over_budget"];
    let verdicts = match &scenario.expect.verdict {
        PerDevice::Same(v) => vec![v.clone()],
        PerDevice::Each { cpu, cuda } => vec![cpu.clone(), cuda.clone()],
    };
    for verdict in verdicts {
        if !valid_verdicts.contains(&verdict.as_str()) {
            let line = text
                .lines()
                .position(|l| !l.trim_start().starts_with('#') && l.contains("verdict:"))
                .map(|i| i + 1)
                .unwrap_or(0);
            return Err(format!("{display}:{line}: expect.verdict: unknown verdict {verdict:?}; use one of {valid_verdicts:?}"));
        }
    }
    if !["cpu", "cuda", "each"].contains(&scenario.device.as_str()) {
        return Err(format!("{display}: device: {:?} is not cpu, cuda or each", scenario.device));
    }
    let first = text.lines().position(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')).unwrap_or(0);
    scenario.location = format!("{display}:{}", first + 1);
    Ok(scenario)
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    files
}

fn stem(path: &Path) -> String {
    path.file_stem().unwrap().to_string_lossy().into_owned()
}

/// One trial per scenario file and device. A file that does not load is a
/// failing trial of its own.
fn scenario_trials(dir: &Path) -> Vec<Trial> {
    let mut trials = Vec::new();
    for path in yaml_files(dir) {
        let name = stem(&path);
        match load(&path) {
            Err(message) => trials.push(Trial::test(format!("scenario::{name}"), move || Err(message.into()))),
            Ok(scenario) => {
                let scenario = std::sync::Arc::new(scenario);
                let devices: &[&str] = match scenario.device.as_str() {
                    "each" => &["cpu", "cuda"],
                    "cpu" => &["cpu"],
                    _ => &["cuda"],
                };
                for &device in devices {
                    let scenario = scenario.clone();
                    let trial_name = format!("scenario::{name}::{device}");
                    let test_name = trial_name.clone();
                    trials.push(Trial::test(trial_name, move || {
                        if device == "cuda" && common::cuda_device_or_skip(&test_name).is_none() {
                            return Ok(());
                        }
                        check(&scenario, &test_name, device).map_err(Failed::from)
                    }));
                }
            }
        }
    }
    trials
}

/// Each file in fixtures/invalid/ must fail to load with the message on its
/// first line (`# expect-error: ...`).
fn invalid_trials(dir: &Path) -> Vec<Trial> {
    yaml_files(dir)
        .into_iter()
        .map(|path| {
            Trial::test(format!("invalid::{}", stem(&path)), move || {
                let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
                let expected = text
                    .lines()
                    .next()
                    .and_then(|l| l.strip_prefix("# expect-error: "))
                    .ok_or("the first line must be `# expect-error: <message>`")?;
                match load(&path) {
                    Ok(_) => Err(format!("{} loaded, but it should fail with: {expected}", path.display()).into()),
                    Err(message) if message.contains(expected) => Ok(()),
                    Err(message) => Err(format!("expected an error containing\n  {expected}\nfound\n  {message}").into()),
                }
            })
        })
        .collect()
}

/// The rule that one bad file fails only its own trial: a folder with one
/// valid and one malformed file gives one passing and one failing trial.
fn isolation_trial(root: PathBuf) -> Trial {
    Trial::test("harness::a_malformed_file_fails_only_its_own_trial", move || {
        let dir = std::env::temp_dir().join(format!("gpu-leak-test-fixtures-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::copy(root.join("scenarios/keeps_number.yaml"), dir.join("good.yaml")).map_err(|e| e.to_string())?;
        std::fs::copy(root.join("invalid/misspelled_field.yaml"), dir.join("bad.yaml")).map_err(|e| e.to_string())?;
        let names: Vec<String> = scenario_trials(&dir).iter().map(|t| t.name().to_string()).collect();
        std::fs::remove_dir_all(&dir).ok();
        let expected = ["scenario::bad", "scenario::good::cpu", "scenario::good::cuda"];
        if names != expected {
            return Err(format!("expected trials {expected:?}, found {names:?}").into());
        }
        Ok(())
    })
}

fn main() {
    let args = Arguments::from_args();
    let root = common::manifest_dir().join("fixtures");
    let mut trials = scenario_trials(&root.join("scenarios"));
    trials.extend(invalid_trials(&root.join("invalid")));
    trials.push(isolation_trial(root));
    libtest_mimic::run(&args, trials).exit();
}
