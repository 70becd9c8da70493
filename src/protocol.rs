//! The measurement protocol: warm-up, measured iterations with a sample after
//! each, a verdict from the exact hook, and attribution only when it fails.
use crate::attribution::{self, Attribution};
use crate::config::{Overrides, Settings};
use crate::device;
use crate::error::Result;
use crate::probe::{Snapshot, Tracker};
use crate::report::{Report, RunSettings, Sample};
use crate::verdict::{self, Growth, Phase, RetainedDuring, Series, Verdict};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Instant;
use tch::Device;

/// A leak test, configured with a builder and run with [`LeakTest::run`]
/// (body once per iteration) or [`LeakTest::run_with_setup`] (setup once,
/// then an iteration closure).
///
/// ```no_run
/// use gpu_leak_test::LeakTest;
/// use tch::{Kind, Tensor};
///
/// let mut kept = Vec::new();
/// let report = LeakTest::new("keeps_tensors")
///     .device("cpu")
///     .iterations(5)
///     .run(|device| kept.push(Tensor::zeros([256], (Kind::Float, device))))
///     .unwrap();
/// assert!(!report.passed());
/// ```
#[derive(Debug, Clone)]
pub struct LeakTest {
    name: String,
    location: Option<String>,
    root: Option<PathBuf>,
    overrides: Overrides,
    require_cuda: bool,
}

impl LeakTest {
    pub fn new(name: impl Into<String>) -> Self {
        LeakTest { name: name.into(), location: None, root: None, overrides: Overrides::default(), require_cuda: false }
    }

    /// Builds from attribute-style overrides (what the macro passes).
    pub fn with_overrides(name: impl Into<String>, overrides: Overrides) -> Self {
        LeakTest { overrides, ..Self::new(name) }
    }

    /// `"auto"`, `"cpu"`, `"cuda"` or `"cuda:N"`; checked when the test runs.
    pub fn device(mut self, device: impl Into<String>) -> Self {
        self.overrides.device = Some(device.into());
        self
    }

    pub fn warmup(mut self, iterations: u32) -> Self {
        self.overrides.warmup = Some(iterations);
        self
    }

    pub fn iterations(mut self, iterations: u32) -> Self {
        self.overrides.iterations = Some(iterations);
        self
    }

    /// Retained growth over the measured iterations that still passes, in MiB.
    pub fn threshold_mb(mut self, mb: f64) -> Self {
        self.overrides.threshold_mb = Some(mb);
        self
    }

    /// Budget for the highest live bytes, in MiB.
    pub fn peak_mb(mut self, mb: f64) -> Self {
        self.overrides.peak_mb = Some(mb);
        self
    }

    pub fn attribution_iterations(mut self, iterations: u32) -> Self {
        self.overrides.attribution_iterations = Some(iterations);
        self
    }

    /// Where the test is (`file:line`) and the crate root its paths are
    /// shown relative to.
    pub fn location(mut self, location: impl Into<String>, crate_root: impl Into<PathBuf>) -> Self {
        self.location = Some(location.into());
        self.root = Some(crate_root.into());
        self
    }

    /// Fail instead of falling back to the CPU when `device = "auto"` finds
    /// no CUDA (GPU_LEAK_TEST_REQUIRE_CUDA=1 does the same).
    pub fn require_cuda(mut self, required: bool) -> Self {
        self.require_cuda = required;
        self
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings after attribute, environment, config file and defaults.
    pub fn settings(&self) -> Result<Settings> {
        Settings::resolve(&self.overrides, &self.name, self.crate_root().as_deref())
    }

    /// The folder of the crate under test, where `gpu-leak-test.yaml` lives:
    /// the one given to [`LeakTest::location`] where it exists, else
    /// CARGO_MANIFEST_DIR at run time, which cargo and nextest set (nextest
    /// remaps it when it runs an archive on a machine where the build-time
    /// path does not exist).
    pub fn crate_root(&self) -> Option<PathBuf> {
        let runtime = || std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).filter(|p| p.is_dir());
        self.root.clone().filter(|root| root.is_dir()).or_else(runtime)
    }

    /// Resolves settings (attribute, environment, defaults) and the device.
    pub fn resolve(&self) -> Result<(Settings, Device)> {
        let settings = self.settings()?;
        let require_cuda = self.require_cuda || crate::config::cuda_required()?;
        let device = settings.device.resolve(require_cuda)?;
        Ok((settings, device))
    }

    /// Runs `body` once per iteration. Leaks come through what outlives an
    /// iteration: statics, caches, captured collections, leaked boxes.
    pub fn run(&self, mut body: impl FnMut(Device)) -> Result<Report> {
        self.run_with_setup(move |device| move || body(device))
    }

    /// Runs `setup` once, then the closure it returns once per iteration.
    /// Leaks come through state the closure owns, as in a training loop
    /// that keeps every loss.
    pub fn run_with_setup<I: FnMut()>(&self, setup: impl FnOnce(Device) -> I) -> Result<Report> {
        let (settings, device) = self.resolve()?;
        Ok(self.execute_setup_form(&settings, device, setup))
    }

    /// [`LeakTest::run_with_setup`] on resolved settings and device.
    pub(crate) fn execute_setup_form<I: FnMut()>(
        &self,
        settings: &Settings,
        device: Device,
        setup: impl FnOnce(Device) -> I,
    ) -> Report {
        self.execute(settings, device, |device| {
            let mut iteration = setup(device);
            Ok(move || {
                iteration();
                Ok(())
            })
        })
    }

    /// Like [`LeakTest::run`] for a body that returns `Result`: an `Err`
    /// stops the test with [`Verdict::BodyError`].
    pub fn try_run<E: std::fmt::Debug>(&self, mut body: impl FnMut(Device) -> std::result::Result<(), E>) -> Result<Report> {
        let (settings, device) = self.resolve()?;
        Ok(self.execute(&settings, device, move |device| Ok(move || body(device).map_err(|e| format!("{e:?}")))))
    }

    /// The protocol, on a resolved device. `setup` returns the iteration.
    pub(crate) fn execute<I>(
        &self,
        settings: &Settings,
        device: Device,
        setup: impl FnOnce(Device) -> std::result::Result<I, String>,
    ) -> Report
    where
        I: FnMut() -> std::result::Result<(), String>,
    {
        let started = Instant::now();
        let _device_lock = device::lock_device(device);
        if let Device::Cuda(index) = device {
            // Best effort: a failure here shows up again, with context, in
            // the test's own first CUDA call.
            let _ = crate::probe::cuda::prewarm(index);
        }
        let tracker = Tracker::new();
        let mut run = Run {
            test: self,
            settings,
            device,
            tracker: &tracker,
            series: Series::default(),
            samples: Vec::new(),
            before: None,
            after: None,
            peak_bytes: 0,
            references: Vec::new(),
        };
        let hook = match tracker.enter() {
            Ok(hook) => hook,
            Err(e) => {
                return run.finish(
                    Verdict::Panicked { phase: Phase::Setup, iteration: 0, message: e.to_string() },
                    None,
                    started,
                )
            }
        };
        let outcome = run.measure(setup);
        drop(hook);
        let (verdict, attribution) = match outcome {
            Ok(found) => found,
            Err(stopped) => (stopped, None),
        };
        run.finish(verdict, attribution, started)
    }
}

/// State of one run of the protocol.
struct Run<'a> {
    test: &'a LeakTest,
    settings: &'a Settings,
    device: Device,
    tracker: &'a Tracker,
    series: Series,
    samples: Vec<Sample>,
    before: Option<Snapshot>,
    after: Option<Snapshot>,
    /// Highest live bytes over setup, warm-up and measured iterations.
    peak_bytes: i64,
    references: Vec<crate::refs::Reference>,
}

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

impl Run<'_> {
    fn sample(&mut self, phase: Phase, iteration: u32) -> Snapshot {
        let snapshot = Snapshot::take(self.device, self.tracker);
        self.samples.push(Sample::from_snapshot(phase, iteration, &snapshot));
        snapshot
    }

    /// Runs one call of user code, turning a panic or an error into the
    /// verdict that stops the test.
    fn call<T>(&mut self, phase: Phase, iteration: u32, f: impl FnOnce() -> std::result::Result<T, String>) -> std::result::Result<T, Verdict> {
        let ooms_before = self.tracker.out_of_memory().0;
        match crate::probe::stacks::stop_walks_here(|| catch_unwind(AssertUnwindSafe(f))) {
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

    fn measure<I>(
        &mut self,
        setup: impl FnOnce(Device) -> std::result::Result<I, String>,
    ) -> std::result::Result<(Verdict, Option<Attribution>), Verdict>
    where
        I: FnMut() -> std::result::Result<(), String>,
    {
        let settings = self.settings;
        self.series.start = self.tracker.live_bytes(self.device);
        let device = self.device;
        let mut iteration = self.call(Phase::Setup, 0, || setup(device))?;
        self.series.after_setup = self.sample(Phase::Setup, 0).hook.live_bytes;

        for i in 1..=settings.warmup {
            self.call(Phase::WarmUp, i, &mut iteration)?;
            let live = self.sample(Phase::WarmUp, i).hook.live_bytes;
            self.series.warmup.push(live);
        }
        self.before = Some(Snapshot::take(self.device, self.tracker));

        for i in 1..=settings.iterations {
            self.call(Phase::Measure, i, &mut iteration)?;
            let live = self.sample(Phase::Measure, i).hook.live_bytes;
            self.series.measured.push(live);
        }
        // Growth to a new high in only one iteration is one-time retention,
        // unless more iterations show it again (a leak every k-th iteration
        // with k close to the window).
        let threshold = settings.threshold_bytes();
        if matches!(verdict::growth(self.series.baseline(), &self.series.measured, threshold), Growth::Once { .. }) {
            for i in 1..=settings.iterations {
                let n = settings.iterations + i;
                self.call(Phase::Confirm, n, &mut iteration)?;
                let live = self.sample(Phase::Confirm, n).hook.live_bytes;
                self.series.measured.push(live);
            }
        }
        self.after = Some(Snapshot::take(self.device, self.tracker));

        let peak = self.tracker.view(self.device).peak_bytes - self.series.start;
        self.peak_bytes = peak;
        let verdict = verdict::decide(&self.series, threshold, settings.peak_budget_bytes().map(|b| (peak, b)));
        let (verdict, attribution) = match verdict {
            Verdict::Leak(leak) => {
                // Enough iterations that a leak every k-th iteration leaves a
                // survivor before the last one.
                let widest_gap = leak.growing_iterations.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(1);
                let count = settings.attribution_iterations.max(widest_gap + 1).max(1);
                let mut attribution = self.attribute(&mut iteration, count)?;
                let suppressed = attribution.apply_suppressions(&settings.suppressions);
                let unsuppressed = leak.retained_bytes as f64 - suppressed * leak.iterations as f64;
                let verdict = if !attribution.kept_across_iterations() && !self.rose_every_iteration() {
                    // Everything still alive comes from the latest iteration and
                    // the level wanders: state replaced every iteration (a
                    // buffer whose size varies), which new highs alone cannot
                    // tell from a leak.
                    Verdict::Bounded { retained_bytes: leak.retained_bytes }
                } else if suppressed > 0.0 && unsuppressed <= threshold as f64 {
                    Verdict::Suppressed { retained_bytes: leak.retained_bytes, bytes_per_iteration: leak.bytes_per_iteration }
                } else {
                    Verdict::Leak(leak)
                };
                (verdict, Some(attribution))
            }
            other => (other, None),
        };
        Ok((verdict, attribution))
    }

    /// True when live bytes rose after every measured and attribution
    /// iteration: growth that replaces one ever-bigger tensor (a history
    /// kept with `cat`) leaves survivors from the last iteration only, yet
    /// grows without bound.
    fn rose_every_iteration(&self) -> bool {
        let levels: Vec<i64> = std::iter::once(self.series.baseline())
            .chain(
                self.samples
                    .iter()
                    .filter(|s| matches!(s.phase, Phase::Measure | Phase::Confirm | Phase::Attribution))
                    .map(|s| s.live_bytes),
            )
            .collect();
        levels.windows(2).all(|w| w[1] > w[0])
    }

    /// Runs `count` attribution iterations with stack capture on and groups
    /// the allocations that survive them.
    fn attribute(
        &mut self,
        iteration: &mut impl FnMut() -> std::result::Result<(), String>,
        count: u32,
    ) -> std::result::Result<Attribution, Verdict> {
        self.tracker.clear_recorded();
        let watching = crate::refs::Watching::start();
        self.tracker.start_recording(1);
        for i in 1..=count {
            self.tracker.set_tag(i);
            let result = self.call(Phase::Attribution, i, &mut *iteration);
            if let Err(stopped) = result {
                self.tracker.stop_recording();
                return Err(stopped);
            }
            self.sample(Phase::Attribution, i);
        }
        self.tracker.stop_recording();
        let survivors = self.tracker.recorded_survivors();
        self.tracker.clear_recorded();
        let root = self.test.root.clone().unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
        let attribution = attribution::attribute(&survivors, self.device, count, &root);
        self.references = watching.finish(&survivors, &attribution);
        Ok(attribution)
    }

    fn finish(self, verdict: Verdict, attribution: Option<Attribution>, started: Instant) -> Report {
        let view = self.tracker.view(self.device);
        let settings = self.settings;
        let iterations_run = self.samples.iter().filter(|s| s.phase != Phase::Setup).count().max(1) as f64;
        let mut report = Report {
            test: self.test.name.clone(),
            location: self.test.location.clone(),
            device: self.device,
            settings: RunSettings {
                warmup: settings.warmup,
                iterations: settings.iterations,
                threshold_bytes: settings.threshold_bytes(),
                peak_budget_bytes: settings.peak_budget_bytes(),
                attribution_iterations: attribution.as_ref().map(|a| a.iterations).unwrap_or(settings.attribution_iterations),
            },
            setup_bytes: self.series.after_setup - self.series.start,
            warmup_retained_bytes: if self.series.warmup.is_empty() { 0 } else { self.series.warmup_retained() },
            // A run stopped early has not stored its peak yet.
            peak_bytes: if self.peak_bytes != 0 { self.peak_bytes } else { view.peak_bytes - self.series.start },
            samples: self.samples,
            before: self.before,
            after: self.after,
            attribution,
            references: self.references,
            files: None,
            other_devices: self.tracker.other_devices(self.device),
            // Setup's events are spread over the iterations too: an estimate.
            events_per_iteration: (view.allocations + view.frees) as f64 / iterations_run,
            hints: Vec::new(),
            elapsed: started.elapsed(),
            verdict,
        };
        report.hints = hints(&report);
        report
    }
}

/// Advice for the patterns people meet most.
fn hints(report: &Report) -> Vec<String> {
    let mut hints = Vec::new();
    match &report.verdict {
        Verdict::Leak(_) => {
            let sites = report.attribution.as_ref().map(|a| a.sites.as_slice()).unwrap_or_default();
            if sites.iter().any(|s| s.inside_backward || s.on_other_thread) {
                hints.push(
                    "some survivors were allocated inside backward(): a tensor you keep still holds its autograd \
                     graph or gradients. Keep plain numbers (`loss.double_value(&[])`), or `detach()` / copy to the \
                     CPU before keeping a tensor."
                        .into(),
                );
            }
            if let Some(top) = sites.first() {
                let place = top.location.as_deref().unwrap_or("the site above");
                hints.push(format!(
                    "the tensors allocated at {place} outlive each iteration: something kept across iterations (a Vec, \
                     a static, state captured by the closure, a leaked Box) holds them. Drop them at the end of the \
                     iteration, keep plain numbers instead, or keep them under `tch::no_grad` / `detach()` if they \
                     must stay."
                ));
            }
        }
        Verdict::PeakOverBudget { .. } => hints.push(
            "the peak counts every tensor alive at once, activations saved for backward included. Evaluation without \
             `tch::no_grad(|| ...)` keeps activations alive until the output drops; smaller batches or freeing \
             intermediates early lowers it too."
                .into(),
        ),
        Verdict::OutOfMemory { .. } => hints.push(
            "the views show what the device held at the failure: if `tensors alive` is small but reserved is large, \
             the allocator's cache is fragmented (try `cuda::empty_cache()` before the test or smaller batches); \
             if `tensors alive` is large, memory grew inside the test."
                .into(),
        ),
        Verdict::OneTimeRetention { during: RetainedDuring::WarmUp, .. } => hints.push(
            "warm-up kept memory once (optimizer state, cuBLAS workspaces, caches), then stayed flat: that is \
             state, not a leak."
                .into(),
        ),
        _ => {}
    }
    if let (Some(before), Some(after)) = (&report.before, &report.after) {
        if let (Some(b), Some(a)) = (before.allocator, after.allocator) {
            let reserved_growth = a.reserved_bytes.current as i64 - b.reserved_bytes.current as i64;
            if reserved_growth > 0 && after.hook.live_bytes <= before.hook.live_bytes {
                hints.push(
                    "reserved memory grew while tensors did not: the caching allocator keeps freed blocks for reuse. \
                     nvidia-smi shows this too; it is not a leak."
                        .into(),
                );
            }
        }
    }
    hints
}
