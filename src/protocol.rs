//! The measurement protocol: warm-up, measured iterations with a sample after
//! each, a verdict from the exact hook, and attribution only when it fails.
use crate::attribution::{self, Attribution};
use crate::baseline::{self, BaselineMode, BaselineOutcome, BaselineStatus, DeviceKind, Figures};
use crate::config::Settings;
use crate::device;
use crate::layer::Layer;
use crate::probe::process::{Coverage, Observation};
use crate::probe::sources::{self, Source};
use crate::probe::{Snapshot, Tracker};
use crate::report::{DeviceResult, HarnessTime, MemoryViews, Report, RunSettings, Sample};
use crate::scope::{ResolvedScope, Runner};
use crate::threads::TestThreads;
use crate::verdict::{self, Confirmation, Phase, Series, Verdict};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};
use tch::Device;

/// When a leak test began (before its settings and device were resolved,
/// which can start CUDA), for [`HarnessTime`].
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
    /// The crate the test belongs to, where sites are named relative to.
    pub(crate) root: Option<std::path::PathBuf>,
    pub(crate) expected_failure: bool,
}

impl TestIdentity {
    /// The crate's folder, where it exists here; else CARGO_MANIFEST_DIR at
    /// run time (see `LeakTest::crate_root`).
    pub(crate) fn crate_root(&self) -> Option<std::path::PathBuf> {
        let runtime = || std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from).filter(|p| p.is_dir());
        self.root.clone().filter(|root| root.is_dir()).or_else(runtime)
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
    let scope = settings.scope.resolve(Runner::detect());
    // Lock order: scope, then device, for every leak test.
    let locking = Instant::now();
    let _scope_lock = crate::scope::lock(scope);
    let _device_lock = device::lock_device(device);
    let waiting = locking.elapsed();
    // Before anything calls into libtorch's classes: a libtorch other than
    // the one the shim was built against is read wrongly, or crashes.
    if let Err(message) = crate::probe::libtorch::check_loaded() {
        let run = Run::new(test, settings, device, scope, Tracker::new(), None, &Coverage::default());
        return run.stop(Verdict::Panicked { phase: Phase::Setup, iteration: 0, message }, started);
    }
    if let Device::Cuda(index) = device {
        // Best effort: a failure here shows up again, with context, in
        // the test's own first CUDA call.
        let _ = crate::probe::cuda::prewarm(index);
    }
    // Process scope counts through the process-wide sources alone;
    // thread scope counts through the hook and reads the process-wide
    // sources as the device-global view.
    let observation = Observation::open(scope.is_process());
    let (tracker, global) = match (scope, &observation) {
        (ResolvedScope::Process { .. }, Ok(observation)) => (observation.tracker().clone(), None),
        (ResolvedScope::Process { .. }, Err(e)) => {
            let run = Run::new(test, settings, device, scope, Tracker::new(), None, &Coverage::default());
            let message = format!("process scope is not available here: {e}; use scope = \"thread\"");
            return run.stop(Verdict::Panicked { phase: Phase::Setup, iteration: 0, message }, started);
        }
        (ResolvedScope::Thread, Ok(observation)) => (Tracker::new(), Some(observation.tracker().clone())),
        (ResolvedScope::Thread, Err(_)) => (Tracker::new(), None),
    };
    let coverage = observation.as_ref().map(|o| o.coverage().clone()).unwrap_or_default();
    let mut run = Run::new(test, settings, device, scope, tracker.clone(), global, &coverage);
    run.notes = coverage_notes(device, scope, &coverage, &run.layers, &run.sources);
    let hook = match scope {
        ResolvedScope::Thread => match tracker.enter() {
            Ok(hook) => Some(hook),
            Err(e) => {
                let message = e.to_string();
                return run.stop(Verdict::Panicked { phase: Phase::Setup, iteration: 0, message }, started);
            }
        },
        ResolvedScope::Process { .. } => None,
    };
    // No verdict from a blind source: the host's layers, and the body's
    // device's, must see a canary first (see probe::sources).
    for (index, &on) in run.layers.iter().enumerate() {
        if on.device() != Device::Cpu && on.device() != device {
            continue;
        }
        let source = run.sources[index];
        match sources::prove(source, on, device, scope.is_process(), &run.tracker, &coverage) {
            Ok(proved) => {
                run.sources[index] = proved.source;
                if on == Layer::HostObjects {
                    run.records_per_tensor = proved.added;
                }
            }
            Err(reason) => {
                drop(hook);
                return run.stop_on(index, source.cannot_measure(on, reason), started);
            }
        }
    }
    run.start = run.levels_now();
    run.time.waiting = waiting;
    run.time.prewarm = started.elapsed().saturating_sub(waiting);
    // In process scope every thread is counted, so the threads the test
    // starts and leaves running can be named with what they hold.
    run.threads_at_start = scope.is_process().then(crate::threads::alive);
    let threads = TestThreads::new(if scope.is_process() { None } else { Some(tracker) }, &test.name);
    let current = threads.set_current();
    let outcome = run.measure(setup);
    drop(current);
    drop(hook);
    match outcome {
        Ok(()) => run.finish(started),
        Err(stopped) => run.stop(stopped, started),
    }
}

/// What the report says about the scope and what it could see.
fn coverage_notes(body: Device, scope: ResolvedScope, coverage: &Coverage, layers: &[Layer], sources: &[Source]) -> Vec<String> {
    let mut notes = Vec::new();
    if body.is_cuda() && !layers.contains(&Layer::OutsideLibtorch(body)) {
        notes.push(format!(
            "memory allocated through the CUDA driver outside libtorch's allocators (a custom kernel's cuMemAlloc, a \
             library's cudaHostAlloc) was not judged: {}=0 switches counting it off",
            crate::probe::driver::DRIVER_CALLS_VAR
        ));
    }
    if let ResolvedScope::Process { alongside_other_tests: true } = scope {
        notes.push(
            "process scope under `cargo test`'s parallel threads: leak tests run one at a time, but other tests \
             running meanwhile are counted too. Run with `--test-threads=1` or under `cargo nextest run` if a site \
             below is not this test's."
                .to_string(),
        );
    }
    if scope.is_process() {
        if !coverage.cpu {
            notes.push("the counting CPU allocator could not be installed: host memory was not counted".into());
        }
        for (layer, source) in layers.iter().zip(sources) {
            if let (Source::CudaStatistics, Err(why)) = (source, &coverage.cuda) {
                notes.push(format!(
                    "{layer} was counted from the CUDA allocator's statistics (exact bytes for the whole process): its \
                     trace tracker could not attach ({why}), so no sites can be named there"
                ));
            }
        }
    }
    notes
}

/// State of one run of the protocol.
struct Run<'a> {
    test: &'a TestIdentity,
    settings: &'a Settings,
    /// Where the body runs.
    device: Device,
    scope: ResolvedScope,
    tracker: Tracker,
    /// The device-global view in thread scope.
    global: Option<Tracker>,
    /// The layers whose memory is followed: the CPU's tensors, libtorch's
    /// host objects, and every CUDA device's tensors.
    layers: Vec<Layer>,
    /// What counts each of them.
    sources: Vec<Source>,
    /// Live bytes per layer before setup.
    start: Vec<i64>,
    samples: Vec<Sample>,
    /// Live bytes per layer (as in `layers`) at each sample.
    levels: Vec<Vec<i64>>,
    global_levels: Vec<Vec<i64>>,
    before: Option<Snapshot>,
    after: Option<Snapshot>,
    /// Highest live bytes on the body's device over setup, warm-up and
    /// measured iterations.
    peak_bytes: i64,
    verdicts: Vec<Verdict>,
    attribution: Option<Attribution>,
    /// Per sample, each followed layer's repeatable peak during the
    /// iteration before it (see `sources::repeatable_peak`), above the
    /// level before that iteration (0 for host objects, whose count keeps
    /// no peak): what memory baselines keep.
    iteration_peaks: Vec<Vec<i64>>,
    /// Each followed layer's highest live bytes above `start` over setup,
    /// warm-up, measured and confirmation iterations: what `peak_mb`
    /// bounds.
    test_peaks: Vec<i64>,
    /// The figures against the test's baseline, where it keeps one.
    baseline: Option<BaselineOutcome>,
    /// Where a peak over its baseline is reached: the allocations alive at
    /// the peak of each attribution iteration, by site.
    peak_sites: Option<Attribution>,
    references: Vec<crate::refs::Reference>,
    notes: Vec<String>,
    /// How attribution stopped, where the body failed during it.
    attribution_stopped: Option<Verdict>,
    /// Where the time went so far.
    time: HarnessTime,
    /// The process's threads when the body first ran (process scope).
    threads_at_start: Option<std::collections::BTreeSet<u32>>,
    /// One CPU tensor's records in libtorch's host objects, as the canary
    /// measured them.
    records_per_tensor: i64,
    /// When the run last said it is alive (see [`PROGRESS_EVERY`]).
    last_progress: Instant,
    /// What was free where a layer lives when last read, by layer: when,
    /// the bytes, and the layer's level then (see [`FREE_MEMORY_EVERY`]).
    free_memory: std::collections::HashMap<usize, (Instant, u64, i64)>,
}

/// How often a long run says on stderr where it is.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// A long confirmation reads what is free (`/proc/meminfo`, the driver) at
/// most this often per layer; in between, what the layer grew since is
/// taken off the last reading.
const FREE_MEMORY_EVERY: Duration = Duration::from_millis(20);
/// Confirmation asks the layers' shapes about this many times per doubling
/// of the iterations run, once past this many (see the confirmation loop).
const SHAPE_CHECKS: u32 = 64;

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

/// libtorch's messages for failed allocations, CUDA and CPU.
fn is_out_of_memory(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("out of memory") || m.contains("defaultcpuallocator: can't allocate memory")
}

/// The CPU's tensors and libtorch's host objects first, then every CUDA
/// device of the machine where CUDA is loaded (nothing can allocate on CUDA
/// otherwise; see `cuda::is_loaded`).
fn followed_layers(body: Device) -> Vec<Layer> {
    let mut layers = vec![Layer::Tensors(Device::Cpu), Layer::HostObjects];
    layers.extend((0..crate::probe::cuda::loaded_device_count()).map(|i| Layer::Tensors(Device::Cuda(i))));
    if !layers.contains(&Layer::Tensors(body)) {
        layers.push(Layer::Tensors(body));
    }
    // What the body's CUDA device gets from the driver outside libtorch,
    // and pinned host memory likewise (a CPU body has neither in a process
    // without CUDA, so it follows them on no runner). Where the variable
    // that turns them on is not a boolean, they are followed, and their
    // proof says why they cannot be counted.
    if body.is_cuda() && crate::probe::driver::enabled().unwrap_or(true) {
        layers.extend([Layer::OutsideLibtorch(body), Layer::OutsideLibtorch(Device::Cpu)]);
    }
    layers
}

impl<'a> Run<'a> {
    fn new(
        test: &'a TestIdentity,
        settings: &'a Settings,
        device: Device,
        scope: ResolvedScope,
        tracker: Tracker,
        global: Option<Tracker>,
        coverage: &Coverage,
    ) -> Run<'a> {
        let layers = followed_layers(device);
        let start_len = layers.len();
        let sources: Vec<Source> = layers.iter().map(|&l| sources::choose(l, scope.is_process(), coverage)).collect();
        let start = layers.iter().zip(&sources).map(|(&l, &source)| sources::level(source, l, &tracker)).collect();
        Run {
            test,
            settings,
            device,
            scope,
            tracker,
            global,
            layers,
            sources,
            start,
            samples: Vec::new(),
            levels: Vec::new(),
            global_levels: Vec::new(),
            before: None,
            after: None,
            peak_bytes: 0,
            verdicts: Vec::new(),
            attribution: None,
            iteration_peaks: Vec::new(),
            test_peaks: vec![0; start_len],
            baseline: None,
            peak_sites: None,
            references: Vec::new(),
            notes: Vec::new(),
            attribution_stopped: None,
            time: HarnessTime::default(),
            threads_at_start: None,
            records_per_tensor: 0,
            last_progress: Instant::now(),
            free_memory: std::collections::HashMap::new(),
        }
    }

    fn sample(&mut self, phase: Phase, iteration: u32) -> Snapshot {
        let started = Instant::now();
        let snapshot = self.take_snapshot(self.reads_host_heap(phase, iteration));
        self.samples.push(Sample::from_snapshot(phase, iteration, &snapshot));
        let levels = self.levels_now();
        self.follow_peaks(phase, &levels);
        if self.last_progress.elapsed() >= PROGRESS_EVERY {
            self.last_progress = Instant::now();
            eprintln!(
                "gpu-leak-test: `{}` still running: {phase} iteration {iteration}, {} live on {}",
                self.test.name,
                crate::report::bytes(levels[self.body()].max(0) as u64),
                crate::layer::device_name(self.device)
            );
        }
        self.levels.push(levels);
        if let Some(global) = &self.global {
            // The process-wide view of each layer: the observation's
            // tracker, and the shim's own count of the C++ heap. A layer
            // counted from the allocator's driver calls on the test's
            // threads is compared with those calls on every thread.
            let level = |(&l, &source): (&Layer, &Source)| match l {
                Layer::HostObjects => crate::probe::process::host_objects().0,
                Layer::Tensors(_) | Layer::OutsideLibtorch(_) => sources::view(source, l, global).live_bytes,
            };
            self.global_levels.push(self.layers.iter().zip(&self.sources).map(level).collect());
        }
        self.time.sampling += started.elapsed();
        snapshot
    }

    /// Reads each tensor layer's peak since the sample before, relative to
    /// the level then, and starts the next iteration's window.
    fn follow_peaks(&mut self, phase: Phase, levels: &[i64]) {
        let before = self.levels.last().unwrap_or(&self.start);
        let mut rises = vec![0; self.layers.len()];
        for (d, (&layer, &source)) in self.layers.iter().zip(&self.sources).enumerate() {
            if !matches!(layer, Layer::Tensors(_)) {
                continue;
            }
            let peak = sources::peak(source, layer, &self.tracker).max(levels[d]);
            let repeatable = sources::repeatable_peak(source, layer, &self.tracker).max(levels[d]);
            sources::reset_peak(source, layer, &self.tracker);
            rises[d] = repeatable - before[d];
            if phase != Phase::Attribution {
                self.test_peaks[d] = self.test_peaks[d].max(peak - self.start[d]);
            }
        }
        self.iteration_peaks.push(rises);
    }

    /// Each followed layer's live bytes now, as its source counts them.
    fn levels_now(&self) -> Vec<i64> {
        self.layers.iter().zip(&self.sources).map(|(&l, &source)| sources::level(source, l, &self.tracker)).collect()
    }

    /// The index of the body's device's tensors in `layers`.
    fn body(&self) -> usize {
        self.layers.iter().position(|&l| l == Layer::Tensors(self.device)).expect("the body's device is followed")
    }

    /// Every view of the body's device, its exact count as its source
    /// counts it (the allocator's statistics, where they are the source).
    fn take_snapshot(&self, host_heap: bool) -> Snapshot {
        let mut snapshot = Snapshot::take_reading_host_heap(self.device, &self.tracker, host_heap);
        let body = self.body();
        match (self.sources[body], snapshot.allocator) {
            // The snapshot read the allocator's statistics already.
            (Source::CudaStatistics, Some(allocator)) => {
                snapshot.hook.live_bytes = allocator.allocated_bytes.current as i64;
                snapshot.hook.peak_bytes = allocator.allocated_bytes.peak as i64;
            }
            (Source::CudaAllocatorCalls, _) => {
                snapshot.hook = sources::view(Source::CudaAllocatorCalls, self.layers[body], &self.tracker);
            }
            _ => {}
        }
        snapshot
    }

    /// Every view of the body's device now, timed as sampling.
    fn snapshot_now(&mut self) -> Snapshot {
        let started = Instant::now();
        let snapshot = self.take_snapshot(true).with_process_memory();
        self.time.sampling += started.elapsed();
        snapshot
    }

    /// The exact series of one followed layer, from the samples so far.
    fn series(&self, index: usize) -> Series {
        let at = |phases: &[Phase]| -> Vec<i64> { self.levels_in(index, phases).collect() };
        Series {
            start: self.start[index],
            after_setup: at(&[Phase::Setup]).first().copied().unwrap_or(self.start[index]),
            warmup: at(&[Phase::WarmUp]),
            measured: at(&[Phase::Measure, Phase::Confirm]),
        }
    }

    /// Layer `index`'s level after each sample taken in one of `phases`.
    fn levels_in<'s>(&'s self, index: usize, phases: &'s [Phase]) -> impl Iterator<Item = i64> + 's {
        self.samples.iter().zip(&self.levels).filter(|(s, _)| phases.contains(&s.phase)).map(move |(_, l)| l[index])
    }

    /// One value before the first measured iteration (at the last warm-up or
    /// setup sample, the series' baseline) and after each measured and
    /// confirmation iteration, `value` reading it by sample index; `None`
    /// where any is missing. Every measured-window comparison (the devices'
    /// exact levels, the device-global view, the host heap) reads this way.
    fn measured_window(&self, value: impl Fn(usize) -> Option<i64>) -> Option<Vec<i64>> {
        let baseline = self.samples.iter().rposition(|s| matches!(s.phase, Phase::WarmUp | Phase::Setup))?;
        let measured = (0..self.samples.len()).filter(|&i| matches!(self.samples[i].phase, Phase::Measure | Phase::Confirm));
        std::iter::once(baseline).chain(measured).map(value).collect()
    }

    /// The layers judged: the body's device's, and every layer that saw an
    /// allocation or a free during the test.
    fn judged(&self) -> Vec<usize> {
        (0..self.layers.len())
            .filter(|&i| {
                let events = sources::events(self.sources[i], self.layers[i], &self.tracker);
                // Statistics give no events: a level that moved is the sign.
                let moved = self.sources[i] == Source::CudaStatistics && self.levels.iter().any(|l| l[i] != self.start[i]);
                let failed = self.verdicts.get(i).is_some_and(Verdict::is_failure);
                self.layers[i] == Layer::Tensors(self.device) || events > 0 || moved || failed
            })
            .collect()
    }

    /// Runs one call of user code, turning a panic or an error into the
    /// verdict that stops the test.
    fn call<T>(&mut self, phase: Phase, iteration: u32, f: impl FnOnce() -> std::result::Result<T, String>) -> std::result::Result<T, Verdict> {
        let ooms_before = self.tracker.out_of_memory().0;
        let started = Instant::now();
        let outcome = crate::probe::stacks::stop_walks_here(|| catch_unwind(AssertUnwindSafe(f)));
        if phase != Phase::Attribution {
            self.time.body += started.elapsed();
        }
        match outcome {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(message)) => Err(Verdict::BodyError { phase, iteration, message }),
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                // The views at the moment of failure go into the report.
                let snapshot = self.sample(phase, iteration);
                self.after = Some(snapshot);
                if is_out_of_memory(&message) || self.tracker.out_of_memory().0 > ooms_before {
                    Err(Verdict::OutOfMemory { phase, iteration, message })
                } else {
                    Err(Verdict::Panicked { phase, iteration, message })
                }
            }
        }
    }

    fn measure<I>(&mut self, setup: impl FnOnce(Device) -> std::result::Result<I, String>) -> std::result::Result<(), Verdict>
    where
        I: FnMut() -> std::result::Result<(), String>,
    {
        let device = self.device;
        // The peaks start with the test: the sources' canaries came before.
        for (&layer, &source) in self.layers.iter().zip(&self.sources) {
            if let Layer::Tensors(_) = layer {
                sources::reset_peak(source, layer, &self.tracker);
            }
        }
        let mut iteration = self.call(Phase::Setup, 0, || setup(device))?;
        self.sample(Phase::Setup, 0);
        self.run_window(&mut iteration)?;
        self.decide_window();
        self.judge_baseline();
        match self.attribution_iterations_needed() {
            Some(count) => self.attribute_and_judge(&mut iteration, count),
            None => {
                self.attribute_peak_over_baseline(&mut iteration);
                Ok(())
            }
        }
    }

    /// The crate's folder, where the annotated files and the baselines are:
    /// the checkout the test runs from (nextest remaps CARGO_MANIFEST_DIR
    /// for an archive, and the build's folder may still exist beside it),
    /// else the build's.
    fn crate_folder(&self) -> Option<std::path::PathBuf> {
        std::env::var_os("CARGO_MANIFEST_DIR")
            .map(std::path::PathBuf::from)
            .filter(|root| root.is_dir())
            .or_else(|| self.test.crate_root())
    }

    /// Each judged tensor layer's figures for its baseline, by layer name,
    /// from repeatable peaks (see `sources::repeatable_peak`). libtorch's
    /// host objects have none: their count keeps no peak.
    fn baseline_figures(&self) -> std::collections::BTreeMap<String, Figures> {
        let phase = |i: usize| self.samples[i].phase;
        let measured: Vec<usize> = (0..self.samples.len()).filter(|&i| phase(i) == Phase::Measure).collect();
        let before = |i: usize, d: usize| if i == 0 { self.start[d] } else { self.levels[i - 1][d] };
        self.judged()
            .into_iter()
            .filter(|&d| matches!(self.layers[d], Layer::Tensors(_)))
            .map(|d| {
                let test_peak = (0..self.samples.len())
                    .filter(|&i| phase(i) != Phase::Attribution)
                    .map(|i| before(i, d) + self.iteration_peaks[i][d] - self.start[d])
                    .max()
                    .unwrap_or(0);
                let figures = Figures {
                    iteration_peak_bytes: measured.iter().map(|&i| self.iteration_peaks[i][d]).max().unwrap_or(0),
                    after_warmup_bytes: self.series(d).baseline() - self.start[d],
                    test_peak_bytes: test_peak.max(0),
                };
                (self.layers[d].name(), figures)
            })
            .collect()
    }

    /// Compares the figures with the test's baseline, or writes it
    /// (`GPU_LEAK_TEST_BASELINES=update`). A figure over its baseline
    /// becomes its device's verdict unless that already fails; a baseline
    /// that is required and missing, or cannot be read or written, fails
    /// the body's device.
    fn judge_baseline(&mut self) {
        let settings = self.settings;
        if !settings.baseline {
            return;
        }
        let body = self.body();
        let kind = match DeviceKind::of(self.device) {
            Ok(kind) => kind,
            Err(why) => {
                self.fail_baseline(body, "(none)".into(), format!("the device's kind, which names the baseline, is unknown: {why}"));
                return;
            }
        };
        let binary = crate::test_binary::TestBinary::current();
        let owner = baseline::Owner { test: &self.test.name, binary: &binary };
        let name = baseline::file_name(owner, &kind);
        let crate_folder = self.crate_folder();
        let Some(folder) = settings.baseline_dir.clone().or_else(|| crate_folder.as_ref().map(|c| c.join(baseline::FOLDER))) else {
            let reason = "the crate's folder is unknown here (no CARGO_MANIFEST_DIR); set baseline_dir".into();
            self.fail_baseline(body, format!("{}/{name}", baseline::FOLDER), reason);
            return;
        };
        let path = folder.join(&name);
        // Shown relative to the crate, as the pull request's diff shows it.
        let file = crate_folder
            .and_then(|c| path.strip_prefix(c).ok().map(|p| p.display().to_string()))
            .unwrap_or_else(|| path.display().to_string());
        let mut outcome = BaselineOutcome::new(file.clone(), &kind, settings.baseline_tolerance_pct, self.baseline_figures());
        match settings.baselines {
            BaselineMode::Update => match baseline::write(&path, owner, &kind, &outcome.measured) {
                Ok(()) => outcome.status = BaselineStatus::Written,
                Err(why) => return self.fail_baseline(body, file, why),
            },
            mode => match baseline::read(&path, owner, &kind) {
                Err(why) => return self.fail_baseline(body, file, why),
                Ok(None) if mode == BaselineMode::Require => {
                    let reason = format!(
                        "there is none, and {}=require asks for one. Write it with `{}`, review it and commit it",
                        baseline::MODE_VAR,
                        baseline::update_command(&self.test.name)
                    );
                    outcome.status = BaselineStatus::Missing;
                    self.baseline = Some(outcome);
                    return self.fail_baseline(body, file, reason);
                }
                Ok(None) => outcome.status = BaselineStatus::Pending,
                Ok(Some(recorded)) => {
                    let (over, lower) = baseline::compare(&outcome.measured, &recorded, settings.baseline_tolerance_pct);
                    outcome.status = if over.is_empty() { BaselineStatus::Within } else { BaselineStatus::Over };
                    // The biggest rise on each device is its verdict.
                    for change in &over {
                        let Some(d) = self.layers.iter().position(|l| l.name() == change.device) else { continue };
                        if !self.verdicts[d].is_failure() {
                            self.verdicts[d] = Verdict::PeakOverBaseline {
                                figure: change.figure.clone(),
                                baseline_bytes: change.baseline_bytes,
                                measured_bytes: change.measured_bytes,
                                tolerance_pct: settings.baseline_tolerance_pct,
                            };
                        }
                    }
                    (outcome.baseline, outcome.over, outcome.lower) = (Some(recorded), over, lower);
                }
            },
        }
        self.baseline = Some(outcome);
    }

    /// Fails device `d` for a baseline that cannot be used, where nothing
    /// fails it already.
    fn fail_baseline(&mut self, d: usize, file: String, reason: String) {
        if !self.verdicts[d].is_failure() {
            self.verdicts[d] = Verdict::NoBaseline { file, reason };
        }
    }

    /// Where a peak rose over its baseline on a device, runs the
    /// attribution iterations again with stack capture and takes the
    /// allocations alive at each one's peak on that device: the sites where
    /// the new peak is reached. (The level after warm-up is setup's and
    /// warm-up's state, which the iterations do not allocate again.)
    fn attribute_peak_over_baseline(&mut self, iteration: &mut impl FnMut() -> std::result::Result<(), String>) {
        let peak_rose = |v: &Verdict| matches!(v, Verdict::PeakOverBaseline { figure, .. } if figure != "after_warmup_bytes");
        let Some(d) = self.judged().into_iter().find(|&d| peak_rose(&self.verdicts[d])) else { return };
        let (layer, source) = (self.layers[d], self.sources[d]);
        let count = self.settings.attribution_iterations;
        let (started, sampling_before) = (Instant::now(), self.time.sampling);
        self.tracker.clear_recorded();
        self.tracker.start_recording(1);
        self.tracker.watch_peak(layer, source == Source::CudaAllocatorCalls);
        let mut alive_at_peaks = Vec::new();
        for i in 1..=count {
            self.tracker.set_tag(i);
            if let Err(stopped) = self.call(Phase::Attribution, i, &mut *iteration) {
                self.notes.push(format!(
                    "finding where the peak is reached stopped: the body failed ({}) in attribution iteration {i}",
                    stopped.label()
                ));
                break;
            }
            self.sample(Phase::Attribution, i);
            alive_at_peaks.extend(self.tracker.take_alive_at_peak());
        }
        self.tracker.stop_watching_peak();
        self.tracker.stop_recording();
        self.tracker.clear_recorded();
        let root = self.test.root.clone().unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
        self.peak_sites = Some(attribution::attribute(&alive_at_peaks, count, &root));
        self.time.attribution = started.elapsed();
        self.time.sampling = sampling_before;
    }

    /// Warm-up, the measured iterations, and the confirmation iterations
    /// where the window cannot tell a leak from growth that stops.
    fn run_window(&mut self, iteration: &mut impl FnMut() -> std::result::Result<(), String>) -> std::result::Result<(), Verdict> {
        let settings = self.settings;
        for i in 1..=settings.warmup {
            self.call(Phase::WarmUp, i, &mut *iteration)?;
            self.sample(Phase::WarmUp, i);
        }
        self.before = Some(self.snapshot_now());
        for i in 1..=settings.iterations {
            self.call(Phase::Measure, i, &mut *iteration)?;
            self.sample(Phase::Measure, i);
        }
        // Where the window cannot tell a leak from growth that stops,
        // confirmation iterations run until it can, up to the bound.
        let threshold = settings.threshold_bytes();
        let mut n = settings.iterations;
        let bound = verdict::confirmation_bound(settings.iterations);
        loop {
            // Asking reads each layer's whole history, so once the run is
            // past SHAPE_CHECKS iterations it asks only every
            // n / SHAPE_CHECKS-th: a long window's confirmation costs the
            // same per iteration as a short one's, for at most that share
            // of iterations more (the memory budget is still asked every
            // iteration).
            let stride = (n / SHAPE_CHECKS).max(1);
            if (n - settings.iterations) % stride == 0 || n >= bound {
                // Once a layer is a certain leak the test fails whatever
                // else grows, so confirmation stops: more would only pile
                // up more of the leak (a runaway one until the machine runs
                // out). The other layers are decided on the iterations run.
                let asks: Vec<Confirmation> = self
                    .judged()
                    .into_iter()
                    .map(|d| verdict::confirmation(&self.series(d), settings.iterations, threshold))
                    .collect();
                if asks.contains(&Confirmation::CertainLeak) || !asks.contains(&Confirmation::NeedsMore) {
                    break;
                }
            }
            if let Some(why) = self.next_iteration_could_exhaust() {
                self.notes.push(format!("confirmation stopped after {} iterations: {why}", n - settings.iterations));
                break;
            }
            n += 1;
            self.call(Phase::Confirm, n, &mut *iteration)?;
            self.sample(Phase::Confirm, n);
        }
        Ok(())
    }

    /// Every layer's verdict on the window, and the body's peak.
    fn decide_window(&mut self) {
        let settings = self.settings;
        let threshold = settings.threshold_bytes();
        self.after = Some(self.snapshot_now());
        let body = self.body();
        self.peak_bytes = self.test_peaks[body];
        let peak = settings.peak_budget_bytes().map(|budget| (self.peak_bytes, budget));
        self.verdicts = (0..self.layers.len())
            .map(|d| verdict::decide(&self.series(d), settings.iterations, threshold, peak.filter(|_| d == body)))
            .collect();
    }

    /// How many attribution iterations a leak in the window needs to name
    /// its sites and back its verdict; `None` where nothing leaks.
    fn attribution_iterations_needed(&self) -> Option<u32> {
        let settings = self.settings;
        let leaking: Vec<usize> = self.judged().into_iter().filter(|&d| matches!(self.verdicts[d], Verdict::Leak(_))).collect();
        if leaking.is_empty() {
            return None;
        }
        // Beside a tensor leak, host objects that grow are usually the kept
        // tensors' records, with libtorch's own bookkeeping of live blocks
        // (a map that rehashes now and then): they set no iteration count.
        let host = self.layers.iter().position(|&l| l == Layer::HostObjects);
        let tensors_leak = leaking.iter().any(|&d| Some(d) != host);
        let leaks: Vec<&verdict::Leak> = leaking
            .iter()
            .filter(|&&d| !(tensors_leak && Some(d) == host))
            .filter_map(|&d| if let Verdict::Leak(l) = &self.verdicts[d] { Some(l) } else { None })
            .collect();
        // Enough iterations that a leak every k-th iteration leaves a
        // survivor before the last one.
        let widest_gap = leaks
            .iter()
            .flat_map(|leak| leak.growing_iterations.windows(2).map(|w| w[1] - w[0]))
            .chain(leaks.iter().filter_map(|leak| leak.drift.map(|(period, _)| period)))
            .max()
            .unwrap_or(1);
        let mut count = settings.attribution_iterations.max(widest_gap + 1);
        let host_objects_leak = !tensors_leak && host.is_some_and(|h| matches!(self.verdicts[h], Verdict::Leak(_)));
        if host_objects_leak || leaks.iter().any(|leak| leak.drift.is_none()) {
            // Growth with no exact pattern, or host objects (whose patterns
            // attribution must back): enough iterations to follow each site
            // (see verdict::growth_evidence).
            count = count.max(verdict::REPLACED_STATE_ITERATIONS);
        }
        Some(count)
    }

    /// Runs attribution and judges each leak again on what it found.
    fn attribute_and_judge(
        &mut self,
        iteration: &mut impl FnMut() -> std::result::Result<(), String>,
        count: u32,
    ) -> std::result::Result<(), Verdict> {
        let settings = self.settings;
        let threshold = settings.threshold_bytes();
        // Attribution's samples count as attribution, not as sampling.
        let (attribution_started, sampling_before) = (Instant::now(), self.time.sampling);
        let attributed = self.attribute(iteration, count);
        self.time.attribution = attribution_started.elapsed();
        self.time.sampling = sampling_before;
        let site_levels = match attributed {
            Ok(levels) => levels,
            Err(stopped) => {
                // The leak was found before attribution ran: it stands, and
                // the report says where attribution stopped.
                let (phase, iteration, message) = match &stopped {
                    Verdict::Panicked { phase, iteration, message }
                    | Verdict::OutOfMemory { phase, iteration, message }
                    | Verdict::BodyError { phase, iteration, message } => (*phase, *iteration, message.as_str()),
                    _ => (Phase::Attribution, 0, ""),
                };
                self.notes.push(format!(
                    "attribution stopped: the body failed ({}) in {phase} iteration {iteration}: {message}; the leak \
                     verdict above was reached before it, and the sites are unknown",
                    stopped.label()
                ));
                let host_objects_leak = self
                    .judged()
                    .into_iter()
                    .find_map(|d| match &self.verdicts[d] {
                        Verdict::Leak(leak) if self.layers[d] == Layer::HostObjects => Some(leak.bytes_per_iteration),
                        _ => None,
                    });
                if let (Some(rate), true) = (host_objects_leak, self.a_tensor_layer_leaks(&self.judged())) {
                    self.notes.push(format!(
                        "libtorch's host objects grew {} per iteration beside the tensors' leak; attribution stopped \
                         before it could tell whether that is the kept tensors' own records (TensorImpl, StorageImpl) or \
                         something more (a kept graph), so the tensors' leak is the verdict",
                        crate::report::bytes(rate.round().max(0.0) as u64)
                    ));
                }
                self.attribution_stopped = Some(stopped);
                return Ok(());
            }
        };
        let judged = self.judged();
        let trough_rose: Vec<bool> = (0..self.layers.len()).map(|d| self.trough_rose_during_attribution(d)).collect();
        let attribution = self.attribution.as_mut().expect("attribute sets it");
        for d in judged {
            let Verdict::Leak(leak) = &self.verdicts[d] else { continue };
            let on = self.layers[d];
            let suppressed = attribution.apply_suppressions(on, &settings.suppressions);
            let levels: Vec<Vec<u64>> = site_levels.iter().filter(|(layer, _)| *layer == on).map(|(_, l)| l.clone()).collect();
            let source = self.sources[d];
            if !source.attributable() && leak.drift.is_none() {
                // Growth with no exact pattern is judged by the sites that
                // grow, and this source names none: neither a pass nor a leak
                // can be backed.
                let reason = format!(
                    "the levels grew {} per iteration with no exact pattern (sizes that vary), and {} names no \
                     allocation sites, so state replaced every iteration cannot be told from a leak. Run this test \
                     with the native allocator backend (no backend:cudaMallocAsync in PYTORCH_CUDA_ALLOC_CONF) to \
                     decide it",
                    crate::report::bytes(leak.bytes_per_iteration.round().max(0.0) as u64),
                    source.name()
                );
                self.verdicts[d] = source.cannot_measure(on, reason);
                continue;
            }
            let evidence = verdict::growth_evidence(attribution.kept_across_iterations(on), &levels);
            let replaced = evidence.is_none();
            self.verdicts[d] = match on {
                Layer::HostObjects => {
                    verdict::host_objects_after_attribution(
                        leak,
                        replaced,
                        trough_rose[d],
                        suppressed,
                        settings.iterations,
                        threshold,
                    )
                }
                Layer::Tensors(_) | Layer::OutsideLibtorch(_) => {
                    verdict::after_attribution(leak, replaced, suppressed, settings.iterations, threshold)
                }
            };
            // A random body's verdict says which evidence decided it.
            if let (Verdict::Leak(verdict::Leak { drift: None, .. }), Some(evidence)) = (&self.verdicts[d], evidence) {
                self.notes.push(format!("{on}: {}", evidence.describe()));
            }
        }
        self.judge_host_objects_beside_kept_tensors();
        Ok(())
    }

    /// Why one more iteration could run the machine out of memory, if it
    /// could: a judged layer whose latest iteration grew by more than a
    /// share of what is free where it lives (the device, or the host).
    fn next_iteration_could_exhaust(&mut self) -> Option<String> {
        let [.., before, last] = &self.levels[..] else { return None };
        let (before, last) = (before.clone(), last.clone());
        self.judged().into_iter().find_map(|d| {
            let growth = last[d] - before[d];
            if growth <= 0 {
                return None;
            }
            let layer = self.layers[d];
            let free = match self.free_memory.get(&d) {
                Some(&(read_at, free, level)) if read_at.elapsed() < FREE_MEMORY_EVERY => {
                    free.saturating_sub((last[d] - level).max(0) as u64)
                }
                _ => {
                    let free = match layer.device() {
                        Device::Cuda(index) => crate::probe::cuda::driver_memory(index).ok().map(|m| m.free_bytes),
                        _ => crate::probe::host::available_bytes(),
                    }?;
                    self.free_memory.insert(d, (Instant::now(), free, last[d]));
                    free
                }
            };
            verdict::next_iteration_could_exhaust(growth, free).then(|| {
                format!(
                    "{layer} grew {} in its latest iteration, and {} is free there; the verdict stands on the \
                     iterations run",
                    crate::report::bytes(growth as u64),
                    crate::report::bytes(free)
                )
            })
        })
    }

    /// Whether layer `index`'s trough rose: its lowest level over
    /// attribution's iterations is above its lowest over the measured and
    /// confirmation ones. A block that comes and goes (another thread's
    /// cache, a library's scratch) leaves the trough where it was; something
    /// kept every iteration lifts it.
    fn trough_rose_during_attribution(&self, index: usize) -> bool {
        let lowest = |phases: &[Phase]| self.levels_in(index, phases).min();
        match (lowest(&[Phase::Measure, Phase::Confirm]), lowest(&[Phase::Attribution])) {
            (Some(before), Some(during)) => during > before,
            _ => false,
        }
    }

    /// A kept tensor keeps its records in libtorch's host objects too: where
    /// those grew by no more than the records of the tensors kept across
    /// attribution's iterations (by a leak, a suppressed one, or a cache
    /// filling up), they are part of that, not a second cause.
    fn judge_host_objects_beside_kept_tensors(&mut self) {
        let Some(host) = self.layers.iter().position(|&l| l == Layer::HostObjects) else { return };
        let Verdict::Leak(leak) = &self.verdicts[host] else { return };
        let Some(attribution) = &self.attribution else { return };
        let kept_blocks: usize = attribution
            .sites
            .iter()
            .filter(|s| s.layer != Layer::HostObjects && !s.only_last_iteration(attribution.iterations))
            .map(|s| s.allocations)
            .sum();
        let tensors_per_iteration = kept_blocks as f64 / attribution.iterations.max(1) as f64;
        let series = self.series(host);
        let typical = verdict::typical_rise(series.baseline(), &series.measured);
        if verdict::records_of_kept_tensors(typical, tensors_per_iteration, self.records_per_tensor) {
            self.verdicts[host] =
                Verdict::RecordsOfKeptTensors { retained_bytes: leak.retained_bytes, bytes_per_iteration: leak.bytes_per_iteration };
        }
    }

    /// Runs `count` attribution iterations with stack capture on and groups
    /// the allocations that survive them. Returns each site's live bytes
    /// after every attribution iteration, by layer.
    fn attribute(
        &mut self,
        iteration: &mut impl FnMut() -> std::result::Result<(), String>,
        count: u32,
    ) -> std::result::Result<Vec<(Layer, Vec<u64>)>, Verdict> {
        self.tracker.clear_recorded();
        let watching = crate::refs::Watching::start();
        // In process scope the C++ heap reaches the tracker only to be
        // recorded.
        let feed_host_objects = self.sources.contains(&Source::OperatorNew);
        crate::probe::process::record_host_object_sites(feed_host_objects);
        self.tracker.start_recording(1);
        let mut by_stack_each_iteration = Vec::new();
        for i in 1..=count {
            self.tracker.set_tag(i);
            let result = self.call(Phase::Attribution, i, &mut *iteration);
            if let Err(stopped) = result {
                self.tracker.stop_recording();
                crate::probe::process::record_host_object_sites(false);
                return Err(stopped);
            }
            self.sample(Phase::Attribution, i);
            by_stack_each_iteration.push(self.tracker.recorded_bytes_by_stack());
        }
        self.tracker.stop_recording();
        crate::probe::process::record_host_object_sites(false);
        let survivors = self.tracker.recorded_survivors();
        self.tracker.clear_recorded();
        let root = self.test.root.clone().unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
        let attribution = attribution::attribute(&survivors, count, &root);
        self.references = watching.finish(&survivors, &attribution);
        self.attribution = Some(attribution);
        let sites: std::collections::HashSet<&(Layer, Vec<usize>)> =
            by_stack_each_iteration.iter().flat_map(|m| m.keys()).collect();
        Ok(sites
            .into_iter()
            .map(|key| (key.0, by_stack_each_iteration.iter().map(|m| m.get(key).copied().unwrap_or(0)).collect()))
            .collect())
    }

    /// A run stopped by a panic, an error or a failed start.
    fn stop(self, verdict: Verdict, started: Started) -> Report {
        let body = self.body();
        self.stop_on(body, verdict, started)
    }

    /// A run stopped before its body ran, by a verdict about one device.
    fn stop_on(mut self, index: usize, verdict: Verdict, started: Started) -> Report {
        self.verdicts = vec![Verdict::Clean; self.layers.len()];
        self.verdicts[index] = verdict;
        self.finish(started)
    }

    /// Whether any of the `judged` tensor layers is a leak.
    fn a_tensor_layer_leaks(&self, judged: &[usize]) -> bool {
        judged.iter().any(|&d| matches!(self.layers[d], Layer::Tensors(_)) && matches!(self.verdicts[d], Verdict::Leak(_)))
    }

    /// The layer whose verdict the test gets: a failure in any judged layer
    /// (the biggest leak first), else the body's device's.
    ///
    /// Host objects that grew beside a tensor leak are often the kept
    /// tensors' own records, which only attribution tells apart from a kept
    /// graph (`judge_host_objects_beside_kept_tensors`). Where attribution
    /// stopped, the tensors' leak, which needs no attribution, is the verdict.
    fn verdict_layer(&self, judged: &[usize]) -> usize {
        let unexplained_host_objects = self.attribution_stopped.is_some() && self.a_tensor_layer_leaks(judged);
        let rank = |d: usize| match &self.verdicts[d] {
            Verdict::Leak(_) if unexplained_host_objects && self.layers[d] == Layer::HostObjects => (2, 0.0),
            Verdict::Leak(leak) => (3, leak.bytes_per_iteration),
            v if v.is_failure() => (2, 0.0),
            _ => (0, 0.0),
        };
        judged
            .iter()
            .copied()
            .filter(|&d| self.verdicts[d].is_failure())
            .max_by(|&a, &b| rank(a).partial_cmp(&rank(b)).unwrap_or(std::cmp::Ordering::Equal).then(b.cmp(&a)))
            .unwrap_or(self.body())
    }

    /// Each judged layer's verdict and levels, and in thread scope the
    /// growth the counted threads do not explain.
    fn device_results(&self, judged: &[usize]) -> Vec<DeviceResult> {
        let settings = self.settings;
        judged
            .iter()
            .map(|&d| {
                let counted = self.measured_window(|i| Some(self.levels[i][d]));
                let global = self.measured_window(|i| self.global_levels.get(i).map(|l| l[d]));
                let unexplained = counted
                    .clone()
                    .zip(global)
                    .and_then(|(counted, global)| verdict::unexplained_growth(&counted, &global, settings.iterations));
                let retained_growth_bytes = counted.as_ref().map_or(0, |levels| levels[levels.len() - 1] - levels[0]);
                DeviceResult {
                    device: self.layers[d].device(),
                    layer: self.layers[d],
                    source: self.sources[d].name().to_string(),
                    verdict: self.verdicts.get(d).cloned().unwrap_or(Verdict::Clean),
                    levels: self.levels.iter().map(|l| l[d] - self.start[d]).collect(),
                    retained_growth_bytes,
                    peak_bytes: self.exact_peak(d),
                    unexplained_bytes_per_iteration: unexplained,
                }
            })
            .collect()
    }

    /// Whether the sample after `iteration` of `phase` reads the host heap:
    /// the measured window's baseline (the last warm-up, or setup) and every
    /// [`verdict::host_heap_spacing`]-th iteration of the window and of
    /// confirmation; attribution's few, always.
    fn reads_host_heap(&self, phase: Phase, iteration: u32) -> bool {
        let spacing = verdict::host_heap_spacing(self.settings.iterations);
        match phase {
            Phase::WarmUp => iteration == self.settings.warmup || iteration % spacing == 0,
            Phase::Measure | Phase::Confirm => iteration % spacing == 0,
            _ => true,
        }
    }

    /// The host heap's growth per iteration, a view shown only where the
    /// judged layers explain none.
    fn host_heap_growth(&self, judged: &[usize]) -> Option<f64> {
        // A graph kept by a `total += loss`, or a Rust collection, grows
        // it while every judged device stays flat over the measured window.
        let judged_layers_flat = judged.iter().all(|&d| {
            self.measured_window(|i| Some(self.levels[i][d])).is_some_and(|levels| levels.iter().all(|&l| l == levels[0]))
        });
        if judged_layers_flat && self.verdicts.iter().all(|v| !v.is_failure()) {
            // The baseline, then the iterations that read it, evenly spaced.
            let baseline = self.samples.iter().rposition(|s| matches!(s.phase, Phase::WarmUp | Phase::Setup))?;
            let mut read = (baseline..self.samples.len())
                .filter(|&i| i == baseline || matches!(self.samples[i].phase, Phase::Measure | Phase::Confirm))
                .map(|i| self.samples[i].host_heap_bytes.map(|b| b as i64));
            let before = read.next().flatten()?;
            let levels: Vec<i64> = std::iter::once(before).chain(read.flatten()).collect();
            verdict::host_heap_growth(&levels, verdict::host_heap_spacing(self.settings.iterations))
        } else {
            None
        }
    }

    /// Layer `index`'s peak since the test began, where its source keeps
    /// one: tensor layers (see `follow_peaks`).
    fn exact_peak(&self, index: usize) -> Option<i64> {
        matches!(self.layers[index], Layer::Tensors(_)).then(|| self.test_peaks[index])
    }

    fn finish(self, started: Started) -> Report {
        let settings = self.settings;
        let judged = self.judged();
        let body = self.body();
        let chosen = self.verdict_layer(&judged);
        let devices = self.device_results(&judged);
        let series = self.series(chosen);
        let host_heap_growth = self.host_heap_growth(&judged);
        let crate_root = self.crate_folder().map(|root| root.display().to_string());
        let peak_bytes = self.exact_peak(chosen);
        let mut samples = self.samples;
        for (sample, levels) in samples.iter_mut().zip(&self.levels) {
            sample.live_bytes = levels[chosen] - self.start[chosen];
        }
        let threads_left_running =
            self.threads_at_start.as_ref().map(|at_start| crate::threads::left_running(at_start, &self.tracker)).unwrap_or_default();
        let events = sources::events(self.sources[body], self.layers[body], &self.tracker);
        let iterations_run = samples.iter().filter(|s| s.phase != Phase::Setup).count().max(1) as f64;
        let mut report = Report {
            test: self.test.name.clone(),
            location: self.test.location.clone(),
            crate_root,
            device: self.device,
            verdict_device: self.layers[chosen].device(),
            verdict_layer: self.layers[chosen],
            expected_failure: self.test.expected_failure,
            scope: self.scope.name().to_string(),
            settings: RunSettings {
                warmup: settings.warmup,
                iterations: settings.iterations,
                threshold_bytes: settings.threshold_bytes(),
                peak_budget_bytes: settings.peak_budget_bytes(),
                attribution_iterations: self.attribution.as_ref().map(|a| a.iterations).unwrap_or(settings.attribution_iterations),
            },
            setup_bytes: series.after_setup - series.start,
            warmup_retained_bytes: if series.warmup.is_empty() { 0 } else { series.warmup_retained() },
            peak_bytes,
            samples,
            thinned: None,
            before: self.before.as_ref().map(MemoryViews::from_snapshot),
            after: self.after.as_ref().map(MemoryViews::from_snapshot),
            attribution: self.attribution,
            baseline: self.baseline,
            peak_sites: self.peak_sites,
            attribution_failure: self.attribution_stopped,
            references: self.references,
            files: None,
            devices,
            // Setup's events are spread over the iterations too: an estimate.
            events_per_iteration: events as f64 / iterations_run,
            hints: Vec::new(),
            notes: self.notes,
            host_heap_growth_per_iteration: host_heap_growth,
            threads_left_running,
            elapsed: Duration::ZERO,
            harness_time: self.time,
            verdict: self.verdicts[chosen].clone(),
        };
        report.hints = crate::report::hints::for_report(&report);
        crate::report::series::thin(&mut report);
        report.elapsed = started.elapsed();
        report.harness_time.total = report.elapsed;
        report.harness_time.cuda_startup = crate::probe::cuda::startup_time().saturating_sub(started.cuda_startup);
        report
    }
}
