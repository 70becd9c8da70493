//! The measurement protocol, as stages that hand typed values on:
//!
//! 1. wiring ([`probes`]): one counting state per followed layer, each
//!    proved by its canary before the body runs;
//! 2. executing ([`execute`]): setup, warm-up, measured and confirmation
//!    iterations, a sample after each into the store ([`samples`]);
//! 3. judging ([`judge`]): every layer's verdict by rules in a written
//!    order, on the samples, the baseline and what attribution found;
//! 4. attributing ([`attribute`]): stack capture over a few more iterations
//!    where a verdict needs sites;
//! 5. assembling ([`assemble`]): the report, which decides nothing.
//!
//! This file dispatches them: locks, probes, the body's run, the stages in
//! order.
mod assemble;
mod attribute;
mod execute;
mod judge;
mod probes;
mod samples;

use crate::config::Settings;
use crate::probe::process::Observation;
use crate::probe::Tracker;
use crate::report::{Findings, PrewarmParts, Report};
use crate::scope::{ResolvedScope, Runner};
use crate::threads::TestThreads;
use crate::verdict::{Phase, Verdict};
use execute::{Executor, Iteration};
use judge::{AttributionEvidence, Judge, Rules};
use probes::Probes;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tch::Device;

/// When a leak test began (before its settings and device were resolved,
/// which can start CUDA), for the report's `HarnessTime`.
#[derive(Clone, Copy)]
pub(crate) struct Started {
    at: Instant,
    cuda_startup: Duration,
}

impl Started {
    pub(crate) fn now() -> Started {
        Started { at: Instant::now(), cuda_startup: crate::probe::cuda::startup_time() }
    }

    /// Wall time since the test began.
    pub(crate) fn elapsed(&self) -> Duration {
        self.at.elapsed()
    }
}

/// What the protocol needs to know of the test it measures: who it is and
/// where, not how it was configured (that is `Settings`).
#[derive(Debug, Clone)]
pub(crate) struct TestIdentity {
    pub(crate) name: String,
    pub(crate) location: Option<String>,
    /// The crate's folder, resolved once ([`crate_folder`]): where its
    /// config file and baselines are, and what reports name as its root.
    pub(crate) crate_folder: Option<PathBuf>,
    /// The crate's folder as the build saw it (the attribute's build-time
    /// CARGO_MANIFEST_DIR), which the binary's debug info names source
    /// files under: sites are named relative to it, whether or not it
    /// exists where the test runs (an archive on a GPU runner).
    pub(crate) build_folder: Option<PathBuf>,
    pub(crate) expected_failure: bool,
}

/// The folder of the crate under test, resolved the one way every part of
/// a leak test uses: the folder the test gave (the attribute gives its
/// build-time CARGO_MANIFEST_DIR) where it exists, unless CARGO_MANIFEST_DIR
/// at run time names another checkout of the same crate (nextest remaps it
/// when it runs an archive elsewhere, and the build's checkout may still
/// exist beside it): the checkout the test runs from is the one its user
/// reads. Else CARGO_MANIFEST_DIR at run time.
pub(crate) fn crate_folder(given: Option<&Path>) -> Option<PathBuf> {
    let at_run_time = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).filter(|p| p.is_dir());
    let given = given.filter(|p| p.is_dir());
    let manifest = |dir: &Path| std::fs::read(dir.join("Cargo.toml")).ok();
    let same_crate = |given: &Path, run: &Path| given != run && manifest(given).is_some_and(|m| Some(m) == manifest(run));
    match (given, at_run_time) {
        (Some(given), Some(run)) if same_crate(given, &run) => Some(run),
        (Some(given), _) => Some(given.to_path_buf()),
        (None, run) => run,
    }
}

/// The protocol, on a resolved device. `setup` returns the iteration.
pub(crate) fn measure<I>(
    test: &TestIdentity,
    settings: &Settings,
    device: Device,
    started: Started,
    setup: impl FnOnce(Device) -> std::result::Result<I, String>,
) -> Report
where
    I: FnMut() -> std::result::Result<(), String>,
{
    let mut parts = PrewarmParts { settings: started.elapsed(), ..PrewarmParts::default() };
    // Everything the harness allocates on this thread from here on is its
    // own, not the Rust heap's growth; the body's calls are the test's.
    let _harness = crate::layer::rust_heap::harness();
    let scope = settings.scope.resolve(Runner::detect());
    // Lock order: scope, then device, for every leak test.
    let locking = Instant::now();
    let _scope_lock = crate::scope::lock(scope);
    let _device_lock = crate::device::lock_device(device);
    let waiting = locking.elapsed();
    let stop_in_setup = |probes: Probes, message: String| {
        let (exec, mut judge) = stages(test, settings, probes);
        judge.stopped(judge.body(), Verdict::Panicked { phase: Phase::Setup, iteration: 0, message });
        assemble::report(exec, &judge, Findings::default(), started)
    };
    let unwired = || Probes::wire(device, scope, Tracker::new(), None, Default::default());
    if let Err(message) = prewarm(device, scope, &mut parts) {
        return stop_in_setup(unwired(), message);
    }
    let part = Instant::now();
    let observation = Observation::open(scope.is_process());
    // The observation took CUPTI's subscription over, or never will.
    crate::probe::driver::release_unused();
    let probes = match wire(device, scope, &observation) {
        Ok(probes) => probes,
        Err(message) => return stop_in_setup(unwired(), message),
    };
    let tracker = probes.tracker.clone();
    let hook = match scope {
        ResolvedScope::Thread => match tracker.enter() {
            Ok(hook) => Some(hook),
            Err(e) => return stop_in_setup(probes, e.to_string()),
        },
        ResolvedScope::Process { .. } => None,
    };
    let (mut exec, mut judge) = stages(test, settings, probes);
    exec.notes = exec.probes.coverage_notes();
    parts.sources = part.elapsed();
    let part = Instant::now();
    let records_per_tensor = match exec.probes.prove(&mut parts.canaries_by_layer) {
        Ok(records) => records,
        Err((d, verdict)) => {
            drop(hook);
            judge.stopped(d, verdict);
            return assemble::report(exec, &judge, Findings::default(), started);
        }
    };
    parts.canaries = part.elapsed();
    exec.samples = samples::Samples::new(exec.probes.levels_now());
    exec.time.waiting = waiting;
    exec.time.prewarm = started.elapsed().saturating_sub(waiting);
    exec.time.prewarm_parts = parts;
    // In process scope every thread is counted, so the threads the test
    // starts and leaves running can be named with what they hold.
    let threads_at_start = scope.is_process().then(crate::threads::alive);
    let threads = TestThreads::new(if scope.is_process() { None } else { Some(tracker.clone()) }, &test.name);
    let current = threads.set_current();
    let mut findings = Findings::default();
    if let Err(stopped) = run(&mut exec, &mut judge, &mut findings, records_per_tensor, setup) {
        exec.update_used(&mut judge);
        judge.stopped(judge.body(), stopped);
    }
    drop(current);
    drop(hook);
    findings.threads_left_running =
        threads_at_start.map(|at_start| crate::threads::left_running(&at_start, &tracker)).unwrap_or_default();
    assemble::report(exec, &judge, findings, started)
}

/// Checks the libtorch loaded, then readies libtorch's one-time state
/// outside the measurement, timing each: in thread scope its table of
/// profiled CPU blocks, on CUDA the device's. `Err` is a libtorch other
/// than the one the shim was built against: checked before anything calls
/// into libtorch's classes, which it would read wrongly, or crash in.
fn prewarm(device: Device, scope: ResolvedScope, parts: &mut PrewarmParts) -> Result<(), String> {
    let part = Instant::now();
    crate::probe::libtorch::check_loaded()?;
    parts.libtorch_check = part.elapsed();
    let part = Instant::now();
    if !scope.is_process() {
        crate::layer::host_objects::grow_cpu_size_table_once();
    }
    parts.cpu_size_table = part.elapsed();
    let part = Instant::now();
    if let Device::Cuda(index) = device {
        // NVML's and CUPTI's start-ups, which the first reading of the
        // process's device memory and the sources pay once per process,
        // run while CUDA starts here.
        let ahead = std::thread::Builder::new().name("gpu-leak-test-ahead".into()).spawn(move || {
            let _harness = crate::layer::rust_heap::harness();
            let started = Instant::now();
            let _ = crate::probe::cuda::process_memory(index);
            crate::probe::driver::subscribe_ahead();
            started.elapsed()
        });
        // Best effort: a failure here shows up again, with context, in
        // the test's own first CUDA call.
        parts.cuda_state_by_part = crate::probe::cuda::prewarm(index).unwrap_or_default();
        // Joined before anything is counted: the thread and what it
        // allocated are gone by then.
        if let Ok(ahead) = ahead {
            parts.nvml_and_cupti = ahead.join().unwrap_or_default();
        }
    }
    parts.cuda_state = part.elapsed();
    Ok(())
}

/// The probes of one run. Process scope counts through the process-wide
/// sources alone; thread scope counts through the hook and reads the
/// process-wide sources as the device-global view.
fn wire(device: Device, scope: ResolvedScope, observation: &crate::Result<Observation>) -> Result<Probes, String> {
    let coverage = observation.as_ref().map(|o| o.coverage().clone()).unwrap_or_default();
    let (tracker, global) = match (scope, observation) {
        (ResolvedScope::Process { .. }, Ok(observation)) => (observation.tracker().clone(), None),
        (ResolvedScope::Process { .. }, Err(e)) => {
            return Err(format!("process scope is not available here: {e}; use scope = \"thread\""));
        }
        (ResolvedScope::Thread, Ok(observation)) => (Tracker::new(), Some(observation.tracker().clone())),
        (ResolvedScope::Thread, Err(_)) => (Tracker::new(), None),
    };
    Ok(Probes::wire(device, scope, tracker, global, coverage))
}

/// The executor and the judge of one run, over its probes.
fn stages<'a>(test: &'a TestIdentity, settings: &'a Settings, probes: Probes) -> (Executor<'a>, Judge) {
    let rules = Rules {
        window: settings.iterations,
        threshold_bytes: settings.threshold_bytes(),
        peak_budget_bytes: settings.peak_budget_bytes(),
    };
    let judge = Judge::new(probes.layers(), probes.body, rules);
    (Executor::new(test, settings, probes), judge)
}

/// The body's run and the stages after it. `Err` is how the body failed
/// before a verdict was reached.
fn run<I>(
    exec: &mut Executor<'_>,
    judge: &mut Judge,
    findings: &mut Findings,
    records_per_tensor: i64,
    setup: impl FnOnce(Device) -> std::result::Result<I, String>,
) -> std::result::Result<(), Verdict>
where
    I: FnMut() -> std::result::Result<(), String>,
{
    let device = exec.probes.device;
    exec.probes.reset_peaks();
    let mut owned = exec.call(Phase::Setup, 0, || setup(device))?;
    let judged = judge_run(exec, judge, findings, records_per_tensor, &mut owned);
    // What the body keeps is freed as the test's, as it was allocated.
    crate::layer::rust_heap::as_test(|| drop(owned));
    judged
}

/// The measured window, confirmation, the baseline and attribution, over
/// the iteration setup returned.
fn judge_run(
    exec: &mut Executor<'_>,
    judge: &mut Judge,
    findings: &mut Findings,
    records_per_tensor: i64,
    iteration: &mut Iteration<'_>,
) -> std::result::Result<(), Verdict> {
    exec.sample(Phase::Setup, 0);
    exec.run_window(iteration, judge)?;
    exec.samples.after = Some(exec.snapshot_now());
    exec.update_used(judge);
    judge.decide_window(&exec.samples);
    findings.baseline = check_baseline(exec, judge);
    match judge.attribution_iterations_needed(exec.settings.attribution_iterations) {
        Some(count) => attribute_and_judge(exec, judge, findings, records_per_tensor, iteration, count),
        None => {
            if let Some(d) = judge.peak_over_baseline() {
                findings.peak_sites = Some(attribute::peak_sites(exec, iteration, d));
            }
        }
    }
    Ok(())
}

/// Compares the judged layers' figures with the test's baseline, where it
/// keeps one (see `baseline::check`), and tells the judge.
fn check_baseline(exec: &Executor<'_>, judge: &mut Judge) -> Option<crate::baseline::BaselineOutcome> {
    let settings = exec.settings;
    if !settings.baselines.keep {
        return None;
    }
    // libtorch's host objects have none: their count keeps no peak.
    let figures = judge
        .judged()
        .into_iter()
        .filter(|&d| exec.probes.layer(d).keeps_peak())
        .map(|d| (exec.probes.layer(d).name(), exec.samples.baseline_figures(d)))
        .collect();
    let check = crate::baseline::Check {
        test: &exec.test.name,
        device: exec.probes.device,
        crate_folder: exec.test.crate_folder.as_deref(),
        settings: &settings.baselines,
    };
    let checked = crate::baseline::check(&check, figures);
    match (&checked.outcome, checked.unusable) {
        (_, Some(unusable)) => judge.no_baseline(unusable.file, unusable.reason),
        (Some(outcome), None) => judge.over_baseline(&outcome.over, settings.baselines.tolerance_pct),
        (None, None) => {}
    }
    checked.outcome
}

/// Runs attribution and judges each leak again on what it found. Host
/// objects get stacks only where they are attributed: where they leak
/// alone, or beside a tensor leak whose kept tensors' records (rule 4) do
/// not explain their growth; then attribution runs again with them, and
/// the first pass is forgotten.
fn attribute_and_judge(
    exec: &mut Executor<'_>,
    judge: &mut Judge,
    findings: &mut Findings,
    records_per_tensor: i64,
    iteration: &mut Iteration<'_>,
    count: u32,
) {
    let (tensors_leak, host_objects_leak) = (judge.a_tensor_layer_leaks(), judge.host_objects_leak());
    let (window_verdicts, samples, notes) = (judge.verdicts.clone(), exec.samples.len(), exec.notes.len());
    let rust_heap = judge.leaks(crate::layer::Layer::RustHeap);
    let recorded = attribute::Recorded { host_objects: host_objects_leak && !tensors_leak, rust_heap };
    let pass = Pass { records_per_tensor, count, recorded };
    attribute_once(exec, judge, findings, iteration, pass);
    if tensors_leak && judge.host_objects_leak() && findings.attribution_failure.is_none() {
        judge.verdicts = window_verdicts;
        exec.samples.truncate(samples);
        exec.notes.truncate(notes);
        let recorded = attribute::Recorded { host_objects: true, ..recorded };
        let count = judge.iterations_with_host_objects_beside(count);
        attribute_once(exec, judge, findings, iteration, Pass { recorded, count, ..pass });
    }
}

/// One attribution pass: how many iterations, and which layers counted
/// outside the tracker get stacks.
#[derive(Clone, Copy)]
struct Pass {
    records_per_tensor: i64,
    count: u32,
    recorded: attribute::Recorded,
}

/// Where the body fails during attribution, the leak found before stands,
/// and the report says where attribution stopped.
fn attribute_once(exec: &mut Executor<'_>, judge: &mut Judge, findings: &mut Findings, iteration: &mut Iteration<'_>, pass: Pass) {
    let mut found = match attribute::survivors(exec, iteration, pass.count, pass.recorded) {
        Ok(found) => found,
        Err(stopped) => {
            exec.notes.push(attribute::stopped_note(&stopped));
            exec.update_used(judge);
            exec.notes.extend(judge.host_objects_unexplained());
            findings.attribution_failure = Some(stopped);
            return;
        }
    };
    exec.update_used(judge);
    let counted = &exec.probes.counted;
    let cannot_measure = |d: usize, bytes_per_iteration: f64| {
        counted[d].cannot_measure(format!(
            "the levels grew {} per iteration with no exact pattern (sizes that vary), and {} names no allocation \
             sites, so state replaced every iteration cannot be told from a leak. Run this test with the native \
             allocator backend (no backend:cudaMallocAsync in PYTORCH_CUDA_ALLOC_CONF) to decide it",
            crate::report::bytes(bytes_per_iteration.round().max(0.0) as u64),
            counted[d].source_name()
        ))
    };
    let evidence = AttributionEvidence {
        samples: &exec.samples,
        suppressions: &exec.settings.suppressions,
        attributable: counted.iter().map(|c| c.attributable()).collect(),
        host_objects_recorded: pass.recorded.host_objects,
        cannot_measure: &cannot_measure,
    };
    let notes = judge.after_attribution(&mut found.attribution, &found.site_levels, &evidence);
    exec.notes.extend(notes);
    judge.records_of_kept_tensors(&found.attribution, &exec.samples, pass.records_per_tensor);
    findings.attribution = Some(found.attribution);
    findings.references = found.references;
}
