//! The report of one leak test: what was measured, the verdict, and where
//! retained memory was allocated. Its `Display` is the panic message.
pub mod files;
mod format;
pub mod json;
pub mod svg;
mod text;

pub use files::ReportFiles;
pub use format::{bytes, consecutive_runs, device_name, signed_bytes, thousands};
pub use json::JsonReport;

use crate::attribution::Attribution;
use crate::probe::Snapshot;
use crate::verdict::{Phase, Verdict};
use std::time::Duration;
use tch::Device;

/// The settings a run used, after attribute, environment and defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSettings {
    pub warmup: u32,
    pub iterations: u32,
    pub threshold_bytes: u64,
    pub peak_budget_bytes: Option<u64>,
    pub attribution_iterations: u32,
}

/// One sample, taken after an iteration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub phase: Phase,
    /// 1-based within its phase.
    pub iteration: u32,
    /// Exact live bytes on the device the verdict is about
    /// ([`Report::verdict_device`]).
    pub live_bytes: i64,
    pub allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    pub driver_used_bytes: Option<u64>,
}

impl Sample {
    pub fn from_snapshot(phase: Phase, iteration: u32, snapshot: &Snapshot) -> Sample {
        Sample {
            phase,
            iteration,
            live_bytes: snapshot.hook.live_bytes,
            allocated_bytes: snapshot.allocator.map(|a| a.allocated_bytes.current),
            reserved_bytes: snapshot.allocator.map(|a| a.reserved_bytes.current),
            driver_used_bytes: snapshot.driver.map(|d| d.used_bytes()),
        }
    }
}

/// One judged device: its own verdict and its exact live bytes at each
/// sample.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceResult {
    pub device: Device,
    pub verdict: Verdict,
    /// Live bytes after each sample, aligned with [`Report::samples`].
    pub levels: Vec<i64>,
    /// In thread scope: bytes per iteration the process-wide count grew by
    /// beyond what the counted threads explain, where it grew like a leak.
    pub unexplained_bytes_per_iteration: Option<f64>,
}

/// Everything one leak test measured and concluded.
#[derive(Debug, Clone)]
pub struct Report {
    /// The test's name (as the test harness names it).
    pub test: String,
    /// `file:line` of the test function, relative to its crate.
    pub location: Option<String>,
    /// Where the body ran, and whose allocator and driver views are shown.
    pub device: Device,
    /// The device the verdict is about: a failing one where any failed.
    pub verdict_device: Device,
    /// `"thread"` or `"process"`: whose allocations were counted.
    pub scope: &'static str,
    pub settings: RunSettings,
    pub verdict: Verdict,
    /// Live bytes after setup, relative to before it (the setup form).
    pub setup_bytes: i64,
    /// What the warm-up iterations kept (one-time state: optimizer moments,
    /// workspaces, caches).
    pub warmup_retained_bytes: i64,
    /// Highest live bytes since the harness started (setup included).
    pub peak_bytes: i64,
    /// One sample after setup and after every iteration.
    pub samples: Vec<Sample>,
    /// All views right before the first measured iteration.
    pub before: Option<Snapshot>,
    /// All views after the last measured iteration.
    pub after: Option<Snapshot>,
    /// Present when the verdict failed on retained memory.
    pub attribution: Option<Attribution>,
    /// The retained tensors that roots named with [`crate::watch`] hold.
    pub references: Vec<crate::refs::Reference>,
    /// The files written for this report, once written.
    pub files: Option<ReportFiles>,
    /// Every judged device (host memory always, and each CUDA device that
    /// saw allocations), with its own verdict.
    pub devices: Vec<DeviceResult>,
    /// Allocations and frees per iteration on the measured device (setup's
    /// included, so an upper estimate).
    pub events_per_iteration: f64,
    /// Advice for known patterns.
    pub hints: Vec<String>,
    /// What the scope could and could not see.
    pub notes: Vec<String>,
    pub elapsed: Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        !self.verdict.is_failure()
    }

    /// Panics with the report as the message when the verdict failed.
    #[track_caller]
    pub fn assert_passed(&self) {
        if !self.passed() {
            panic!("{self}");
        }
    }

    /// One line for a passing test that names its real verdict (the
    /// harness prints it; shown with `--nocapture`).
    pub fn summary_line(&self) -> String {
        text::passing_line(self)
    }

    /// Retained growth over the measured iterations (after minus before).
    pub fn retained_growth_bytes(&self) -> i64 {
        match (&self.before, &self.after) {
            (Some(before), Some(after)) => after.hook.live_bytes - before.hook.live_bytes,
            _ => 0,
        }
    }

    /// The biggest allocation site, if attribution ran and found survivors.
    pub fn top_site(&self) -> Option<&crate::attribution::Site> {
        self.attribution.as_ref().and_then(|a| a.sites.first())
    }
}
