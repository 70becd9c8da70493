//! The machine-readable report. Its schema is documented in
//! docs/report-schema.md; `schema_version` changes whenever a field changes
//! meaning or goes away (adding fields keeps the version).
use super::format::device_name;
use super::Report;
use crate::probe::Snapshot;
use crate::verdict::{RetainedDuring, Verdict};
use serde::{Deserialize, Serialize};

pub const SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonReport {
    pub schema_version: u32,
    pub test: String,
    pub location: Option<String>,
    pub device: String,
    pub passed: bool,
    pub verdict: JsonVerdict,
    pub settings: JsonSettings,
    pub setup_bytes: i64,
    pub warmup_retained_bytes: i64,
    pub peak_bytes: i64,
    pub retained_growth_bytes: i64,
    pub samples: Vec<JsonSample>,
    pub before: Option<JsonViews>,
    pub after: Option<JsonViews>,
    pub sites: Vec<JsonSite>,
    pub references: Vec<JsonReference>,
    pub hints: Vec<String>,
    /// The device the verdict is about (`device` is where the body ran).
    #[serde(default)]
    pub verdict_device: Option<String>,
    /// "thread" or "process": whose allocations were counted.
    #[serde(default)]
    pub scope: Option<String>,
    /// Every judged device with its own verdict and levels.
    #[serde(default)]
    pub devices: Vec<JsonDevice>,
    /// What the scope could and could not see.
    #[serde(default)]
    pub notes: Vec<String>,
    pub elapsed_seconds: f64,
    /// File name of the SVG timeline beside this file, if one was written.
    pub plot: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonDevice {
    pub device: String,
    pub verdict: JsonVerdict,
    /// Live bytes at each sample, aligned with `samples`.
    pub levels: Vec<i64>,
    pub unexplained_bytes_per_iteration: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JsonVerdict {
    /// clean, one_time_retention, plateau, within_threshold, bounded, leak,
    /// suppressed, peak_over_budget, panicked, out_of_memory, error
    pub kind: String,
    /// Bounded: the sawtooth's period; leak: the period of its exact growth.
    #[serde(default)]
    pub period: Option<u32>,
    /// Plateau: the measured iteration it settled after.
    #[serde(default)]
    pub settled_at: Option<u32>,
    pub retained_bytes: Option<i64>,
    pub bytes_per_iteration: Option<f64>,
    pub growing_iterations: Vec<u32>,
    /// For one-time retention: "warm-up" or "iteration N".
    pub retained_during: Option<String>,
    pub peak_bytes: Option<i64>,
    pub budget_bytes: Option<u64>,
    pub phase: Option<String>,
    pub iteration: Option<u32>,
    pub message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSettings {
    pub warmup: u32,
    pub iterations: u32,
    pub threshold_bytes: u64,
    pub peak_budget_bytes: Option<u64>,
    pub attribution_iterations: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSample {
    pub phase: String,
    pub iteration: u32,
    pub live_bytes: i64,
    pub allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    pub driver_used_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonViews {
    pub live_bytes: i64,
    pub peak_live_bytes: i64,
    pub allocated_bytes: Option<u64>,
    pub reserved_bytes: Option<u64>,
    pub active_bytes: Option<u64>,
    pub driver_used_bytes: Option<u64>,
    pub driver_total_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSite {
    pub location: Option<String>,
    pub function: Option<String>,
    pub called_from: Option<String>,
    pub description: String,
    pub allocations: usize,
    pub bytes: u64,
    pub bytes_per_iteration: f64,
    pub iterations: Vec<u32>,
    pub inside_backward: bool,
    pub on_other_thread: bool,
    #[serde(default)]
    pub device: Option<String>,
    #[serde(default)]
    pub thread: Option<String>,
    pub suppressed_by: Option<String>,
    pub stack: Vec<JsonFrame>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonReference {
    /// Where in the test's state the tensors are held, e.g. `cache[0..100]`.
    pub held_by: String,
    pub tensors: usize,
    pub shape: Vec<i64>,
    pub dtype: String,
    pub device: String,
    pub bytes: u64,
    pub allocated_at: Option<String>,
}

fn views(snapshot: &Snapshot) -> JsonViews {
    JsonViews {
        live_bytes: snapshot.hook.live_bytes,
        peak_live_bytes: snapshot.hook.peak_bytes,
        allocated_bytes: snapshot.allocator.map(|a| a.allocated_bytes.current),
        reserved_bytes: snapshot.allocator.map(|a| a.reserved_bytes.current),
        active_bytes: snapshot.allocator.map(|a| a.active_bytes.current),
        driver_used_bytes: snapshot.driver.map(|d| d.used_bytes()),
        driver_total_bytes: snapshot.driver.map(|d| d.total_bytes),
    }
}

fn verdict(verdict: &Verdict) -> JsonVerdict {
    let mut out = JsonVerdict { kind: verdict.label().into(), ..Default::default() };
    match verdict {
        Verdict::Clean => {}
        Verdict::OneTimeRetention { bytes, during } => {
            out.retained_bytes = Some(*bytes);
            out.retained_during = Some(match during {
                RetainedDuring::WarmUp => "warm-up".into(),
                RetainedDuring::Iteration(i) => format!("iteration {i}"),
            });
        }
        Verdict::Plateau { bytes, settled_at } => {
            out.retained_bytes = Some(*bytes);
            out.settled_at = Some(*settled_at);
        }
        Verdict::WithinThreshold { retained_bytes, bytes_per_iteration } => {
            out.retained_bytes = Some(*retained_bytes);
            out.bytes_per_iteration = Some(*bytes_per_iteration);
        }
        Verdict::Leak(leak) => {
            out.retained_bytes = Some(leak.retained_bytes);
            out.bytes_per_iteration = Some(leak.bytes_per_iteration);
            out.growing_iterations = leak.growing_iterations.clone();
            out.period = leak.drift.map(|(period, _)| period);
        }
        Verdict::Bounded { retained_bytes, period } => {
            out.retained_bytes = Some(*retained_bytes);
            out.period = *period;
        }
        Verdict::Suppressed { retained_bytes, bytes_per_iteration } => {
            out.retained_bytes = Some(*retained_bytes);
            out.bytes_per_iteration = Some(*bytes_per_iteration);
        }
        Verdict::PeakOverBudget { peak_bytes, budget_bytes } => {
            out.peak_bytes = Some(*peak_bytes);
            out.budget_bytes = Some(*budget_bytes);
        }
        Verdict::Panicked { phase, iteration, message }
        | Verdict::OutOfMemory { phase, iteration, message }
        | Verdict::BodyError { phase, iteration, message } => {
            out.phase = Some(phase.to_string());
            out.iteration = Some(*iteration);
            out.message = Some(message.clone());
        }
    }
    out
}

impl JsonReport {
    pub fn from_report(report: &Report, plot: Option<String>) -> JsonReport {
        let s = &report.settings;
        JsonReport {
            schema_version: SCHEMA_VERSION,
            test: report.test.clone(),
            location: report.location.clone(),
            device: device_name(report.device),
            passed: report.passed(),
            verdict: verdict(&report.verdict),
            settings: JsonSettings {
                warmup: s.warmup,
                iterations: s.iterations,
                threshold_bytes: s.threshold_bytes,
                peak_budget_bytes: s.peak_budget_bytes,
                attribution_iterations: s.attribution_iterations,
            },
            setup_bytes: report.setup_bytes,
            warmup_retained_bytes: report.warmup_retained_bytes,
            peak_bytes: report.peak_bytes,
            retained_growth_bytes: report.retained_growth_bytes(),
            samples: report
                .samples
                .iter()
                .map(|s| JsonSample {
                    phase: s.phase.to_string(),
                    iteration: s.iteration,
                    live_bytes: s.live_bytes,
                    allocated_bytes: s.allocated_bytes,
                    reserved_bytes: s.reserved_bytes,
                    driver_used_bytes: s.driver_used_bytes,
                })
                .collect(),
            before: report.before.as_ref().map(views),
            after: report.after.as_ref().map(views),
            sites: report
                .attribution
                .iter()
                .flat_map(|a| a.sites.iter())
                .map(|site| JsonSite {
                    location: site.location.clone(),
                    function: site.function.clone(),
                    called_from: site.called_from.clone(),
                    description: site.description.clone(),
                    allocations: site.allocations,
                    bytes: site.bytes,
                    bytes_per_iteration: site.bytes_per_iteration,
                    iterations: site.iterations.clone(),
                    inside_backward: site.inside_backward,
                    on_other_thread: site.on_other_thread,
                    device: Some(device_name(site.device)),
                    thread: site.thread.clone(),
                    suppressed_by: site.suppressed_by.clone(),
                    stack: site
                        .stack
                        .iter()
                        .map(|f| JsonFrame { function: f.function.clone(), file: f.file.clone(), line: f.line })
                        .collect(),
                })
                .collect(),
            references: report
                .references
                .iter()
                .map(|r| JsonReference {
                    held_by: r.held_by.clone(),
                    tensors: r.tensors,
                    shape: r.shape.clone(),
                    dtype: r.dtype.clone(),
                    device: device_name(r.device),
                    bytes: r.bytes,
                    allocated_at: r.allocated_at.clone(),
                })
                .collect(),
            hints: report.hints.clone(),
            verdict_device: Some(device_name(report.verdict_device)),
            scope: Some(report.scope.to_string()),
            devices: report
                .devices
                .iter()
                .map(|d| JsonDevice {
                    device: device_name(d.device),
                    verdict: verdict(&d.verdict),
                    levels: d.levels.clone(),
                    unexplained_bytes_per_iteration: d.unexplained_bytes_per_iteration,
                })
                .collect(),
            notes: report.notes.clone(),
            elapsed_seconds: report.elapsed.as_secs_f64(),
            plot,
        }
    }
}
