//! What `#[gpu_leak_test]` expands into: resolve settings and device, skip
//! or fail where the device is missing, run the protocol, and panic with the
//! report when the verdict fails. Reached through `__private`.
use crate::config::{self, Overrides};
use crate::device;
use crate::protocol::LeakTest;
use crate::report::Report;
use crate::verdict::Verdict;
use crate::Error;
use std::io::Write;
use tch::Device;

/// Where the test is, filled in by the macro.
#[derive(Debug, Clone, Copy)]
pub struct TestInfo {
    pub name: &'static str,
    pub module: &'static str,
    pub file: &'static str,
    pub line: u32,
    pub manifest_dir: &'static str,
}

impl TestInfo {
    /// The name the test harness shows: libtest names each test's thread
    /// after the test (rstest cases included); otherwise the module path.
    fn display_name(&self) -> String {
        match std::thread::current().name() {
            Some(thread) if thread.contains(self.name) => thread.to_string(),
            _ => {
                let module = self.module.split_once("::").map(|(_, rest)| rest).unwrap_or("");
                if module.is_empty() {
                    self.name.to_string()
                } else {
                    format!("{module}::{}", self.name)
                }
            }
        }
    }

    fn leak_test(&self, overrides: Overrides) -> LeakTest {
        LeakTest::with_overrides(self.display_name(), overrides)
            .location(format!("{}:{}", self.file, self.line), self.manifest_dir)
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

/// Decides what a setup error means: a skip (returns `None`) or a failure.
fn resolve_or_skip(test: &LeakTest) -> Option<(config::Settings, Device)> {
    match test.resolve() {
        Ok(resolved) => Some(resolved),
        Err(error) if device::is_missing_device(&error) => {
            let asked = test.settings().map(|s| s.device.to_string()).unwrap_or_else(|_| "?".into());
            skip_or_fail(test.name(), &asked, &error);
            None
        }
        Err(error) => panic!("{}: {error}", test.name()),
    }
}

/// Writes the JSON report (and plot, and index) where the settings say; a
/// failure to write is a warning and never changes the verdict.
fn write_files(report: &mut Report, settings: &config::Settings) {
    let dir = settings.report_dir.clone().unwrap_or_else(crate::report::files::default_report_dir);
    match crate::report::files::write_report(report, &dir, settings.plots) {
        Ok(files) => report.files = Some(files),
        Err(why) => notice(&format!(
            "gpu-leak-test: warning: {}: the report was not written ({why}); the verdict stands. \
             Set GPU_LEAK_TEST_REPORT_DIR to a writable folder.",
            report.test
        )),
    }
}

fn conclude(mut report: Report, settings: &config::Settings) {
    write_files(&mut report, settings);
    if !report.passed() {
        panic!("{report}");
    }
    // Passing tests say one line (shown with --nocapture or on failure),
    // and any hint, such as growth that threads outside the test explain.
    println!("{}", report.summary_line());
    for hint in &report.hints {
        println!("  hint: {hint}");
    }
}

/// The per-iteration form: `body` runs once per iteration.
pub fn run_body(info: TestInfo, overrides: Overrides, mut body: impl FnMut(Device)) {
    let test = info.leak_test(overrides);
    let Some((settings, device)) = resolve_or_skip(&test) else { return };
    let report = test.execute_setup_form(&settings, device, move |device| move || body(device));
    conclude(report, &settings);
}

/// The setup form: `setup` runs once and returns the iteration.
pub fn run_setup<I: FnMut()>(info: TestInfo, overrides: Overrides, setup: impl FnOnce(Device) -> I) {
    let test = info.leak_test(overrides);
    let Some((settings, device)) = resolve_or_skip(&test) else { return };
    let report = test.execute_setup_form(&settings, device, setup);
    conclude(report, &settings);
}

/// The per-iteration form for tests returning `Result`: the first `Err`
/// ends the test and is returned, after the report is printed.
pub fn run_fallible<E: std::fmt::Debug>(
    info: TestInfo,
    overrides: Overrides,
    mut body: impl FnMut(Device) -> Result<(), E>,
) -> Result<(), E> {
    let test = info.leak_test(overrides);
    let Some((settings, device)) = resolve_or_skip(&test) else { return Ok(()) };
    let mut first_error = None;
    let first_error_slot = &mut first_error;
    let report = test.execute(&settings, device, |device| {
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
        write_files(&mut report, &settings);
        notice(&report.to_string());
        return Err(error);
    }
    conclude(report, &settings);
    Ok(())
}
