//! [`LeakTest`]: the one way into the runtime. The `#[gpu_leak_test]`
//! attribute expands into the same builder calls a hand-written test makes.
use crate::config::{self, Options, Settings};
use crate::device;
use crate::error::{Error, Result};
use crate::isolation::{self, ChildOutcome};
use crate::protocol::{Started, TestIdentity};
use crate::scope::Runner;
use crate::report::Report;
use crate::verdict::Verdict;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;
use tch::Device;

/// A leak test, configured with a builder.
///
/// Two ways to run it:
/// - [`LeakTest::check`], [`LeakTest::check_with_setup`] and
///   [`LeakTest::try_check`] do what `#[gpu_leak_test]` does: skip (or fail,
///   with `GPU_LEAK_TEST_REQUIRE_CUDA=1`) where the device is missing, run,
///   write the report files, and panic with the report when it fails;
/// - [`LeakTest::run`], [`LeakTest::run_with_setup`] and
///   [`LeakTest::try_run`] return the [`Report`] for you to inspect.
///
/// ```no_run
/// use gpu_leak_test::LeakTest;
/// use tch::{Device, Kind, Tensor};
///
/// let mut kept = Vec::new();
/// let report = LeakTest::new("keeps_tensors")
///     .device(Device::Cpu)
///     .iterations(5)
///     .run(|device| kept.push(Tensor::zeros([256], (Kind::Float, device))))
///     .unwrap();
/// assert!(!report.passed());
/// ```
#[derive(Debug, Clone)]
pub struct LeakTest {
    pub(crate) name: String,
    pub(crate) location: Option<String>,
    pub(crate) root: Option<PathBuf>,
    pub(crate) options: Options,
    require_cuda: bool,
    /// Made by [`LeakTest::for_test_function`], as the attribute does.
    test_function: bool,
    /// The test's name as libtest runs it (its thread's name), where this
    /// check is the whole test: it can then run in a process of its own.
    libtest_name: Option<String>,
    pub(crate) expected_failure: bool,
}

impl LeakTest {
    /// A leak test named `name` (the name reports and file names use).
    pub fn new(name: impl Into<String>) -> Self {
        LeakTest {
            name: name.into(),
            location: None,
            root: None,
            options: Options::default(),
            require_cuda: false,
            test_function: false,
            libtest_name: None,
            expected_failure: false,
        }
    }

    /// A leak test that is the whole of the test function `name` in
    /// `module` (what the attribute passes: `stringify!(name)`,
    /// `module_path!()`). It is named as the test harness names it: libtest
    /// names each test's thread after the test (rstest cases included), else
    /// the module path is used.
    ///
    /// Under `cargo test` (libtest, any number of test threads) its `check*`
    /// re-runs this one test in a process of its own, as cargo nextest runs
    /// every test, so every thread it starts is counted and nothing another
    /// test does is (see the README, "One verdict under every runner").
    /// That is why it must be the whole test: the child runs the whole
    /// function again.
    pub fn for_test_function(name: &str, module: &str) -> Self {
        let thread = std::thread::current().name().filter(|thread| thread.contains(name)).map(str::to_string);
        let display = match &thread {
            Some(thread) => thread.clone(),
            None => match module.split_once("::").map(|(_, rest)| rest).unwrap_or("") {
                "" => name.to_string(),
                module => format!("{module}::{name}"),
            },
        };
        LeakTest { test_function: true, libtest_name: thread, ..Self::new(display) }
    }

    /// Sets every option given in `options` (an attribute's values, say);
    /// the ones left `None` keep what the builder had.
    pub fn options(mut self, options: Options) -> Self {
        self.options = options.or(self.options);
        self
    }

    /// Where the body runs: a `tch::Device` (`Device::Cpu`,
    /// `Device::Cuda(1)`) or [`DeviceChoice::Auto`](crate::device::DeviceChoice)
    /// (the default). Every device the test touches is judged.
    pub fn device(mut self, device: impl Into<crate::device::DeviceChoice>) -> Self {
        self.options.device = Some(device.into());
        self
    }

    /// Warm-up iterations (default 2): one-time state lands here.
    pub fn warmup(mut self, iterations: u32) -> Self {
        self.options.warmup = Some(iterations);
        self
    }

    /// Measured iterations (default 5).
    pub fn iterations(mut self, iterations: u32) -> Self {
        self.options.iterations = Some(iterations);
        self
    }

    /// Retained growth over the measured iterations that still passes, in MiB.
    pub fn threshold_mb(mut self, mb: f64) -> Self {
        self.options.threshold_mb = Some(mb);
        self
    }

    /// Budget for the highest live bytes, in MiB.
    pub fn peak_mb(mut self, mb: f64) -> Self {
        self.options.peak_mb = Some(mb);
        self
    }

    /// Whose allocations count: [`Scope::Auto`](crate::scope::Scope) (default),
    /// `Thread` or `Process`.
    pub fn scope(mut self, scope: crate::scope::Scope) -> Self {
        self.options.scope = Some(scope);
        self
    }

    /// Iterations with stack capture after a failing verdict (default 3).
    pub fn attribution_iterations(mut self, iterations: u32) -> Self {
        self.options.attribution_iterations = Some(iterations);
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

    /// The test expects to fail (`#[should_panic]`, which the attribute
    /// passes on): reports and the index show its failure as expected.
    pub fn expect_failure(mut self, expected: bool) -> Self {
        self.expected_failure = expected;
        self
    }

    /// The test's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The settings after attribute, environment, config file and defaults.
    pub fn settings(&self) -> Result<Settings> {
        Settings::resolve(&self.options, &self.name, self.crate_root().as_deref())
    }

    /// The folder of the crate under test, where `gpu-leak-test.yaml` and
    /// the baselines live: the one given to [`LeakTest::location`] where it
    /// exists, unless CARGO_MANIFEST_DIR at run time is another checkout of
    /// the same crate (nextest remaps it when it runs an archive elsewhere);
    /// else CARGO_MANIFEST_DIR at run time, which cargo and nextest set.
    pub fn crate_root(&self) -> Option<PathBuf> {
        crate::protocol::crate_folder(self.root.as_deref())
    }

    /// Who the protocol measures.
    fn identity(&self) -> TestIdentity {
        TestIdentity {
            name: self.name.clone(),
            location: self.location.clone(),
            crate_folder: self.crate_root(),
            build_folder: self.root.clone(),
            expected_failure: self.expected_failure,
        }
    }

    /// Resolves settings (attribute, environment, defaults) and the device.
    /// Inside another leak test's body (on its thread, or a thread brought
    /// into it) it is [`Error::NestedLeakTest`]: the outer test holds the
    /// locks this one would wait for.
    pub fn resolve(&self) -> Result<(Settings, Device)> {
        if let Some(outer) = crate::threads::current_test() {
            return Err(Error::NestedLeakTest { outer: outer.test_name().to_string(), inner: self.name.clone() });
        }
        let settings = self.settings()?;
        let require_cuda = self.require_cuda || config::cuda_required()?;
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
        let started = Started::now();
        let (settings, device) = self.resolve()?;
        Ok(self.measure_setup_form(&settings, device, started, setup))
    }

    /// Like [`LeakTest::run`] for a body that returns `Result`: an `Err`
    /// stops the test with [`Verdict::BodyError`].
    pub fn try_run<E: std::fmt::Debug>(&self, mut body: impl FnMut(Device) -> std::result::Result<(), E>) -> Result<Report> {
        let started = Started::now();
        let (settings, device) = self.resolve()?;
        Ok(crate::protocol::measure(&self.identity(), &settings, device, started, move |device| {
            Ok(move || body(device).map_err(|e| format!("{e:?}")))
        }))
    }

    fn measure_setup_form<I: FnMut()>(&self, settings: &Settings, device: Device, started: Started, setup: impl FnOnce(Device) -> I) -> Report {
        crate::protocol::measure(&self.identity(), settings, device, started, |device| {
            let mut iteration = setup(device);
            Ok(move || {
                iteration();
                Ok(())
            })
        })
    }

    /// What `#[gpu_leak_test]` does with a body that is one iteration: skip
    /// or fail where the device is missing, run, write the report files,
    /// print the passing verdict, and panic with the report on a failure.
    #[track_caller]
    pub fn check(self, mut body: impl FnMut(Device)) {
        self.check_with_setup(move |device| move || body(device))
    }

    /// [`LeakTest::check`] for the setup form: `setup` runs once and returns
    /// the iteration.
    #[track_caller]
    pub fn check_with_setup<I: FnMut()>(self, setup: impl FnOnce(Device) -> I) {
        let started = Started::now();
        let test = self.located_at_caller();
        test.refuse_a_second_registration();
        if test.ran_in_a_child() {
            return;
        }
        let Some((settings, device)) = test.resolve_or_skip() else {
            isolation::finish_child(&ChildOutcome::Passed);
            return;
        };
        let report = test.measure_setup_form(&settings, device, started, setup);
        conclude(report, &settings, started);
    }

    /// [`LeakTest::check`] for a body that returns `Result`: the first `Err`
    /// ends the test and is returned, after the report is printed.
    #[track_caller]
    pub fn try_check<E: std::fmt::Debug>(self, mut body: impl FnMut(Device) -> std::result::Result<(), E>) -> std::result::Result<(), E> {
        let started = Started::now();
        let test = self.located_at_caller();
        test.refuse_a_second_registration();
        if test.ran_in_a_child() {
            return Ok(());
        }
        let Some((settings, device)) = test.resolve_or_skip() else {
            isolation::finish_child(&ChildOutcome::Passed);
            return Ok(());
        };
        let mut first_error = None;
        let first_error_slot = &mut first_error;
        let report = crate::protocol::measure(&test.identity(), &settings, device, started, |device| {
            Ok(move || {
                body(device).map_err(|e| {
                    let message = format!("{e:?}");
                    *first_error_slot = Some(e);
                    message
                })
            })
        });
        if let (Verdict::BodyError { .. }, Some(error)) = (&report.verdict, first_error) {
            let mut report = report;
            write_files_timed(&mut report, &settings, started);
            crate::report::ci::show(&report);
            notice(&report.to_string());
            isolation::finish_child(&ChildOutcome::Failed(format!("the test returned an error: {error:?}")));
            return Err(error);
        }
        conclude(report, &settings, started);
        Ok(())
    }

    /// Where this check moves into a process of its own (see
    /// [`LeakTest::for_test_function`]): runs it there, relays its output
    /// and returns true, or panics with its report where it failed. False
    /// where the check runs here.
    #[track_caller]
    fn ran_in_a_child(&self) -> bool {
        // In a child: what the test starts does not inherit the verdict's pipe.
        isolation::keep_verdict_descriptor_to_this_process();
        // Settings only: resolving the device here would start CUDA in a
        // process that measures nothing. A settings error shows up below.
        let Ok(settings) = self.settings() else { return false };
        let thread_scope = settings.scope == crate::scope::Scope::Thread;
        let Some(name) = isolation::child_test_name(self.libtest_name.as_deref(), Runner::detect(), thread_scope) else {
            return false;
        };
        match isolation::run_in_child(&name, settings.device.may_start_cuda()) {
            Ok(Some(ChildOutcome::Passed)) => true,
            Ok(Some(ChildOutcome::Failed(report))) => panic!("{report}"),
            // Not a libtest test of this binary after all (a custom
            // harness, a thread named like the test): run it here.
            Ok(None) => false,
            Err(why) => panic!("{}: {why}", self.name),
        }
    }

    /// `#[test]` or `#[rstest]` written above `#[gpu_leak_test]` registers
    /// the test twice (the attribute adds `#[test]` itself), and the two
    /// copies run under one name. The attribute cannot see attributes above
    /// it, so the second copy to start says so here.
    fn refuse_a_second_registration(&self) {
        static STARTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        if !self.test_function {
            return;
        }
        let key = format!("{}@{}", self.name, self.location.as_deref().unwrap_or_default());
        let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
        if started.contains(&key) {
            panic!(
                "{}: this test is registered twice: `#[test]` or `#[rstest]` is written above `#[gpu_leak_test]`, \
                 which adds `#[test]` itself. Put `#[gpu_leak_test]` first (above `#[rstest]`), or drop `#[test]`.",
                self.name
            );
        }
        started.push(key);
    }

    /// The caller's `file:line` where no location was given.
    #[track_caller]
    fn located_at_caller(self) -> Self {
        if self.location.is_some() {
            return self;
        }
        let caller = std::panic::Location::caller();
        let root = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_default();
        self.location(format!("{}:{}", caller.file(), caller.line()), root)
    }

    /// Decides what a setup error means: a skip (returns `None`) or a failure.
    fn resolve_or_skip(&self) -> Option<(Settings, Device)> {
        match self.resolve() {
            Ok(resolved) => Some(resolved),
            Err(error) if device::is_missing_device(&error) => {
                let asked = self.settings().map(|s| s.device.to_string()).unwrap_or_else(|_| "?".into());
                skip_or_fail(&self.name, &asked, &error);
                None
            }
            Err(error) => panic!("{}: {error}", self.name),
        }
    }
}

/// Writes past libtest's output capture, so a skip is seen in a normal run.
fn notice(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A missing CUDA device: prints the skip line and returns, or panics when
/// GPU_LEAK_TEST_REQUIRE_CUDA asks for CUDA.
fn skip_or_fail(test: &str, asked: &str, error: &Error) {
    let required = config::cuda_required().unwrap_or_else(|e| panic!("{test}: {e}"));
    if required {
        panic!(
            "{test}: device = \"{asked}\" cannot run here: {error}\n(GPU_LEAK_TEST_REQUIRE_CUDA is set, so a \
             missing CUDA device fails the test instead of skipping it)"
        );
    }
    let what = match error {
        Error::NoSuchCudaDevice { index, count } => format!("no CUDA device cuda:{index} (this machine has {count})"),
        _ => "no CUDA device".to_string(),
    };
    notice(&format!("skipped {test}: {what}; set GPU_LEAK_TEST_REQUIRE_CUDA=1 to fail instead"));
}

/// For plain tests that need CUDA: the first device's index, or `None`
/// after printing `skipped <test>: no CUDA device; ...`. With
/// GPU_LEAK_TEST_REQUIRE_CUDA=1 a missing device panics instead.
pub fn cuda_device_or_skip(test: &str) -> Option<usize> {
    match crate::probe::cuda::check_device(0) {
        Ok(_) => Some(0),
        Err(error) => {
            skip_or_fail(test, "cuda", &error);
            None
        }
    }
}
/// The report's files (`report::files::write_or_warn`), then the timing
/// line where GPU_LEAK_TEST_TIMINGS asks for one; `started` is when
/// `check*` began.
fn write_files_timed(report: &mut Report, settings: &Settings, started: Started) {
    let writing = Instant::now();
    crate::report::files::write_or_warn(report, settings);
    if let Some(file) = config::timings_file() {
        crate::report::files::append_timing(&file, report, writing.elapsed(), started.elapsed());
    }
}

/// Panics (at the test that called `check*`, through `#[track_caller]`)
/// with the report when it failed.
#[track_caller]
fn conclude(mut report: Report, settings: &Settings, started: Started) {
    write_files_timed(&mut report, settings, started);
    if !report.passed() {
        crate::report::ci::show(&report);
        isolation::finish_child(&ChildOutcome::Failed(report.to_string()));
        panic!("{report}");
    }
    // Passing tests say one line (shown with --nocapture or on failure),
    // and any hint, such as growth that threads outside the test explain.
    println!("{}", report.summary_line());
    for hint in &report.findings.hints {
        println!("  hint: {hint}");
    }
    isolation::finish_child(&ChildOutcome::Passed);
}
