//! The report of one leak test: what was measured, the verdict, and where
//! retained memory was allocated. Its `Display` is the panic message.
pub mod ci;
pub mod files;
mod format;
pub mod index;
pub(crate) mod hints;
pub(crate) mod notes;
pub mod page;
pub mod json;
pub(crate) mod series;
/// Public for the suite, which checks the colours the plots are drawn in.
#[doc(hidden)]
pub mod svg;
pub(crate) mod text;

// What a report is made of, wherever it is decided.
pub use crate::attribution::{AllocatedBy, Attribution, Site, Survivors};
pub use crate::baseline::{BaselineOutcome, BaselineStatus, FigureChange, Figures};
pub use crate::layer::Layer;
pub use crate::probe::cuda::CudaStateTimes;
pub use crate::probe::Frame;
pub use crate::refs::{GraphRetention, Reference};
pub use crate::verdict::{Leak, LeakRate, Phase, RetainedDuring};
pub use files::ReportFiles;
pub use series::Thinned;
pub use format::{bytes, signed_bytes, thousands};
use crate::layer::device_serde;
pub use json::ReportFile;

use crate::probe::Snapshot;
use crate::verdict::Verdict;
use std::time::Duration;
use tch::Device;

/// Reports written before layers were named judged tensors only.
pub(crate) fn tensors_on_cpu() -> crate::layer::Layer {
    crate::layer::Layer::Tensors(Device::Cpu)
}

/// The settings a run used, after attribute, environment and defaults.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct RunSettings {
    /// Warm-up iterations.
    pub warmup: u32,
    /// Measured iterations asked for (confirmation iterations come on top).
    pub iterations: u32,
    /// `threshold_mb` in bytes.
    pub threshold_bytes: u64,
    /// `peak_mb` in bytes.
    pub peak_budget_bytes: Option<u64>,
    /// Attribution iterations run (or that would run).
    pub attribution_iterations: u32,
}

/// One sample, taken after an iteration.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Sample {
    /// The phase of the iteration it followed.
    pub phase: Phase,
    /// 1-based within its phase.
    pub iteration: u32,
    /// Exact live bytes in the layer the verdict is about
    /// ([`Report::verdict_layer`]), above its level when the test began.
    pub live_bytes: i64,
    /// The caching allocator's allocated bytes on the body's device.
    pub allocated_bytes: Option<u64>,
    /// The caching allocator's reserved bytes on the body's device.
    pub reserved_bytes: Option<u64>,
    /// The host heap in use, whole process (glibc's `mallinfo2`); read
    /// after every iteration of a window up to 128 iterations, and after
    /// every n/128-th of a longer one.
    #[serde(default)]
    pub host_heap_bytes: Option<u64>,
}

impl Sample {
    pub(crate) fn from_snapshot(phase: Phase, iteration: u32, snapshot: &Snapshot) -> Sample {
        Sample {
            phase,
            iteration,
            live_bytes: snapshot.hook.live_bytes,
            allocated_bytes: snapshot.allocator.map(|a| a.allocated_bytes.current),
            reserved_bytes: snapshot.allocator.map(|a| a.reserved_bytes.current),
            host_heap_bytes: snapshot.host_heap,
        }
    }
}

/// Every view of the body's device at one moment, as the report shows them
/// (and the JSON writes them): the exact count, the caching allocator's
/// statistics and the driver's. The allocator and driver views are `None`
/// on the CPU, where libtorch keeps no statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct MemoryViews {
    /// Exact live bytes (allocated and not freed since the test began).
    pub live_bytes: i64,
    /// The highest exact live bytes so far.
    pub peak_live_bytes: i64,
    /// `torch.cuda.memory_allocated`: bytes in blocks handed out to tensors.
    pub allocated_bytes: Option<u64>,
    /// `torch.cuda.memory_reserved`: bytes the allocator holds, cached too.
    pub reserved_bytes: Option<u64>,
    /// Bytes in active blocks: allocated, or freed but still used by a stream.
    pub active_bytes: Option<u64>,
    /// What the driver says is used on the device, by every process.
    pub driver_used_bytes: Option<u64>,
    /// The device's total memory, as the driver reports it.
    pub driver_total_bytes: Option<u64>,
    /// The host heap in use, whole process (glibc's `mallinfo2`).
    #[serde(default)]
    pub host_heap_bytes: Option<u64>,
    /// What this process holds on the device, as the driver counts it per
    /// process (NVML, `nvidia-smi`'s figure), where NVML gives one.
    #[serde(default)]
    pub driver_process_bytes: Option<u64>,
}

impl MemoryViews {
    pub(crate) fn from_snapshot(snapshot: &Snapshot) -> MemoryViews {
        MemoryViews {
            live_bytes: snapshot.hook.live_bytes,
            peak_live_bytes: snapshot.hook.peak_bytes,
            allocated_bytes: snapshot.allocator.map(|a| a.allocated_bytes.current),
            reserved_bytes: snapshot.allocator.map(|a| a.reserved_bytes.current),
            active_bytes: snapshot.allocator.map(|a| a.active_bytes.current),
            driver_used_bytes: snapshot.driver.map(|d| d.used_bytes()),
            driver_total_bytes: snapshot.driver.map(|d| d.total_bytes),
            host_heap_bytes: snapshot.host_heap,
            driver_process_bytes: snapshot.process,
        }
    }

    /// The allocator's two views' labels, shared with the timeline's lines.
    pub(crate) const ALLOCATED_LABEL: &'static str = "allocator allocated (whole process)";
    pub(crate) const RESERVED_LABEL: &'static str = "allocator reserved (cached too)";

    /// The before/after table every renderer draws, one label per figure,
    /// so the text report and the page name each view alike. A row whose
    /// figure is missing on either side is left out.
    pub(crate) fn rows(before: &MemoryViews, after: &MemoryViews) -> Vec<(&'static str, i64, i64)> {
        let signed = |v: Option<u64>| v.map(|v| v as i64);
        [
            ("tensors alive (exact)", Some(before.live_bytes), Some(after.live_bytes)),
            (Self::ALLOCATED_LABEL, signed(before.allocated_bytes), signed(after.allocated_bytes)),
            (Self::RESERVED_LABEL, signed(before.reserved_bytes), signed(after.reserved_bytes)),
            ("driver used (all processes)", signed(before.driver_used_bytes), signed(after.driver_used_bytes)),
            ("driver used by this process (NVML)", signed(before.driver_process_bytes), signed(after.driver_process_bytes)),
            ("host heap in use (whole process)", signed(before.host_heap_bytes), signed(after.host_heap_bytes)),
        ]
        .into_iter()
        .filter_map(|(name, b, a)| Some((name, b?, a?)))
        .collect()
    }
}

/// One judged device: its own verdict and its exact live bytes at each
/// sample.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DeviceResult {
    /// The device whose memory was judged (the CPU for libtorch's host
    /// objects).
    #[serde(with = "device_serde")]
    pub device: Device,
    /// The layer judged: the device's tensors, or libtorch's host objects.
    #[serde(default = "crate::report::tensors_on_cpu")]
    pub layer: crate::layer::Layer,
    /// What counted it (`the counting CPU allocator`, `the CUDA caching
    /// allocator's trace`, ...), after a canary allocation proved that it
    /// sees there.
    #[serde(default)]
    pub source: String,
    /// Its own verdict.
    pub verdict: Verdict,
    /// Live bytes after each sample, above the level when the test began,
    /// aligned with [`Report::samples`].
    pub levels: Vec<i64>,
    /// Its level after the last measured (or confirmation) iteration minus
    /// before the first.
    #[serde(default)]
    pub retained_growth_bytes: i64,
    /// The most live bytes at once since the test began, where its source
    /// keeps a peak (tensor layers).
    #[serde(default)]
    pub peak_bytes: Option<i64>,
    /// In thread scope: bytes per iteration the process-wide count grew by
    /// beyond what the counted threads explain, where it grew like a leak.
    pub unexplained_bytes_per_iteration: Option<f64>,
}

/// Where one leak test's time went: the body's, and the harness's around it.
/// Every part is wall time on the test's thread; `total` less the parts is
/// what the harness spent deciding and building the report. Writing the
/// report files comes after the report is complete, so it is not in here:
/// `GPU_LEAK_TEST_TIMINGS` logs it with the rest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct HarnessTime {
    /// From the start of the protocol to the finished report.
    pub total: Duration,
    /// Your code: setup and every warm-up, measured and confirmation
    /// iteration (attribution's are under `attribution`).
    pub body: Duration,
    /// Waiting for other leak tests of the process to release the scope and
    /// device locks (tests under `cargo test` queue there; under nextest
    /// none do).
    pub waiting: Duration,
    /// Preparing the device and the sources: resolving the settings and the
    /// device, CUDA's one-time state (context, cuBLAS workspaces) outside the
    /// measurement, the counting allocator, the trace tracker, the hook.
    pub prewarm: Duration,
    /// Of `prewarm`, CUDA's own start-up where this test paid it: loading
    /// libtorch's CUDA library, initialising the driver, creating the
    /// device's context. Any CUDA code pays it once per process (the body
    /// would in its first iteration); a test on the CPU never does.
    pub cuda_startup: Duration,
    /// `prewarm`, part by part.
    #[serde(default)]
    pub prewarm_parts: PrewarmParts,
    /// Synchronising the device, settling the layers (a CUDA test's
    /// autograd wake-ups drained) and reading every view after each
    /// iteration.
    pub sampling: Duration,
    /// `sampling`, part by part, where a part can wait on something
    /// outside the process.
    #[serde(default)]
    pub sampling_parts: SamplingParts,
    /// Attribution, where it ran: its iterations with a stack captured for
    /// every allocation, then grouping and symbolising the survivors.
    pub attribution: Duration,
    /// Of `attribution`, grouping the survivors by site and naming their
    /// frames (the rest is its iterations).
    #[serde(default)]
    pub attribution_naming: Duration,
}

/// The parts of a leak test's prewarm, each wall time on the test's thread.
/// Their sum, less `cuda_startup`, is nearly all of `prewarm` (the rest is
/// the scope and device locks' bookkeeping).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct PrewarmParts {
    /// Resolving the settings (attribute, environment, config file) and
    /// the device, which loads CUDA where the test asks for it.
    pub settings: Duration,
    /// Checking that the libtorch loaded is the one built against (once
    /// per process).
    pub libtorch_check: Duration,
    /// Growing libtorch's table of the CPU blocks hooked threads allocate
    /// (once per process, in thread scope): see the host-objects layer.
    #[serde(default)]
    pub cpu_size_table: Duration,
    /// CUDA's one-time state outside the measurement: the device's context,
    /// cuBLAS handles and workspace, autograd's device thread and its
    /// ready queue, and the calling thread's own; NVML's start-up and
    /// CUPTI's subscription run beside them.
    pub cuda_state: Duration,
    /// Of `cuda_state`, the parts on the test's side of it: where driver
    /// calls wait on other processes (many starting CUDA at once), these
    /// say which.
    #[serde(default)]
    pub cuda_state_by_part: CudaStateTimes,
    /// NVML's and CUPTI's start-ups, on a thread of their own while CUDA
    /// starts and the rest of `cuda_state` runs; `cuda_state` waits for
    /// them, so where they take longer, they are what it is.
    #[serde(default)]
    pub nvml_and_cupti: Duration,
    /// Opening the sources: the counting CPU allocator, the CUDA trace
    /// tracker, CUPTI's callbacks on the driver (subscribed here where the
    /// one-time state did not), the per-thread hook.
    pub sources: Duration,
    /// Every layer's canary.
    pub canaries: Duration,
    /// Of `canaries`, each layer's: where driver calls wait on other
    /// processes (many starting CUDA at once), these say whose.
    #[serde(default)]
    pub canaries_by_layer: CanaryTimes,
}

/// The parts of a leak test's sampling that can wait on the device, the
/// driver or the heap's size, summed over its samples ([`HarnessTime`]).
/// The rest of `sampling` is reading the counts, which waits on nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct SamplingParts {
    /// Settling the layers: a CUDA test's autograd wake-ups drained (a
    /// backward on the CPU).
    pub settle: Duration,
    /// Synchronising the device.
    pub synchronize: Duration,
    /// Asking the driver for its views before and after the window: the
    /// device's free memory and this process's share (`cudaMemGetInfo`,
    /// NVML).
    pub driver: Duration,
    /// glibc's count of the host heap in use, where read.
    pub host_heap: Duration,
}

/// The canaries' wall times, one per kind of layer: [`PrewarmParts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct CanaryTimes {
    /// Tensors on the CPU and on the body's device: a tensor each, and
    /// libtorch's pinned host allocator emptied around a block of it.
    pub tensors: Duration,
    /// libtorch's C++ heap: a CPU tensor's records.
    pub host_objects: Duration,
    /// Memory outside libtorch: a block straight from the CUDA driver.
    pub outside_libtorch: Duration,
    /// The Rust heap: a block from Rust's global allocator.
    pub rust_heap: Duration,
}

impl CanaryTimes {
    /// Adds the time `layer`'s canary took.
    pub(crate) fn add(&mut self, layer: Layer, took: Duration) {
        let part = match layer {
            Layer::Tensors(_) => &mut self.tensors,
            Layer::HostObjects => &mut self.host_objects,
            Layer::OutsideLibtorch(_) => &mut self.outside_libtorch,
            Layer::RustHeap => &mut self.rust_heap,
        };
        *part += took;
    }
}

impl HarnessTime {
    /// The harness's own share: `total` less the body's time, the time
    /// spent waiting for other tests, and CUDA's start-up.
    pub fn own(&self) -> Duration {
        self.total.saturating_sub(self.body).saturating_sub(self.waiting).saturating_sub(self.cuda_startup)
    }
}

/// Everything one leak test measured and concluded. Its `Display` is the
/// panic message; its serde form is the JSON report (see
/// `docs/report-schema.md`), with `schema_version`, `passed` and `plot`
/// beside its fields. The groups (`context`, `figures`, `findings`) are
/// flattened there: their fields are the report's own in the JSON.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// The test's name (as the test harness names it).
    pub test: String,
    /// Where the body ran, and whose allocator and driver views are shown.
    #[serde(with = "device_serde")]
    pub device: Device,
    /// The verdict (on [`Report::verdict_device`]).
    pub verdict: Verdict,
    /// The layer the verdict is about, on that device.
    #[serde(default = "crate::report::tensors_on_cpu")]
    pub verdict_layer: crate::layer::Layer,
    /// The device the verdict is about: a failing one where any failed.
    #[serde(with = "device_serde")]
    pub verdict_device: Device,
    /// The settings it ran with.
    pub settings: RunSettings,
    /// One sample after setup and after every iteration; at most
    /// 1,000 of them, where [`VerdictFigures::thinned`] says so.
    pub samples: Vec<Sample>,
    /// Every judged device (host memory always, and each CUDA device that
    /// saw allocations), with its own verdict.
    pub devices: Vec<DeviceResult>,
    /// Where and how the test ran, and where its time went.
    #[serde(flatten)]
    pub context: RunContext,
    /// The verdict's layer's figures, and the body's device's views.
    #[serde(flatten)]
    pub figures: VerdictFigures,
    /// What attribution, the baseline and the threads showed, with hints
    /// and notes.
    #[serde(flatten)]
    pub findings: Findings,
    /// The files written for this report, once written (not in the JSON).
    #[serde(skip)]
    pub files: Option<ReportFiles>,
}

/// Where and how a leak test ran.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct RunContext {
    /// `file:line` of the test function, relative to its crate.
    pub location: Option<String>,
    /// The crate's folder where the test ran: what `location` and the
    /// sites' relative paths are relative to (for CI annotations, which
    /// name paths from the repository's root).
    #[serde(default)]
    pub crate_root: Option<String>,
    /// `"thread"` or `"process"`: whose allocations were counted.
    pub scope: String,
    /// The test expects to fail (`#[should_panic]`): the index shows a
    /// failure as expected, not red.
    #[serde(default)]
    pub expected_failure: bool,
    /// The test's wall time.
    pub elapsed: Duration,
    /// Where that time went: the body, and the harness's own parts.
    #[serde(default)]
    pub harness_time: HarnessTime,
}

/// The verdict's layer's figures, and the body's device's views around
/// the measured window.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct VerdictFigures {
    /// In the verdict's layer: live bytes after setup, relative to before
    /// it (the setup form).
    pub setup_bytes: i64,
    /// In the verdict's layer: what the warm-up iterations kept (one-time
    /// state: optimizer moments, workspaces, caches).
    pub warmup_retained_bytes: i64,
    /// In the verdict's layer: the most live bytes at once since the test
    /// began (setup included), where its source keeps a peak (tensor
    /// layers); `None` for layers counted by level alone.
    pub peak_bytes: Option<i64>,
    /// Allocations and frees per iteration on the measured device (setup's
    /// included, so an upper estimate).
    pub events_per_iteration: f64,
    /// Bytes per iteration the host heap grew by while every tensor count
    /// passed: a graph or a Rust collection kept across iterations.
    #[serde(default)]
    pub host_heap_growth_per_iteration: Option<f64>,
    /// Where the samples were thinned to keep the report small: how many
    /// were taken, and the CSV file beside the report that has them all.
    #[serde(default)]
    pub thinned: Option<Thinned>,
    /// All views right before the first measured iteration.
    pub before: Option<MemoryViews>,
    /// All views after the last measured iteration.
    pub after: Option<MemoryViews>,
}

/// What a leak test found beside its verdict.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Findings {
    /// Present when the verdict failed on retained memory.
    pub attribution: Option<Attribution>,
    /// The figures against the test's memory baseline, where it keeps one
    /// (`baseline = true`).
    #[serde(default)]
    pub baseline: Option<crate::baseline::BaselineOutcome>,
    /// Where a figure rose over its baseline: the allocations alive at the
    /// peak of each attribution iteration on that device, by site.
    #[serde(default)]
    pub peak_sites: Option<Attribution>,
    /// How the body failed during attribution, where it did: the leak
    /// verdict stands, and this says in which phase and iteration.
    #[serde(default)]
    pub attribution_failure: Option<Verdict>,
    /// The retained tensors that roots named with [`crate::watch`] hold.
    pub references: Vec<crate::refs::Reference>,
    /// Threads the test started that were still running at its end, holding
    /// memory they allocated during it (process scope, which sees them).
    #[serde(default)]
    pub threads_left_running: Vec<crate::threads::ThreadLeftRunning>,
    /// Advice for known patterns.
    pub hints: Vec<String>,
    /// What the scope could and could not see.
    pub notes: Vec<String>,
}

impl Report {
    /// The verdict passed.
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

    /// Writes the report's files as `LeakTest::check*` does: where
    /// `GPU_LEAK_TEST_REPORT_DIR`, `gpu-leak-test.yaml` (in the crate's
    /// folder, resolved as the test resolved it) or the default say. A failure to write
    /// is a warning on stderr; [`Report::files`] says what was written.
    pub fn write_files(&mut self) {
        let given = self.context.crate_root.as_deref().map(std::path::Path::new);
        let root = crate::protocol::crate_folder(given);
        match crate::config::Settings::resolve(&crate::Options::default(), &self.test, root.as_deref()) {
            Ok(settings) => files::write_or_warn(self, &settings),
            Err(why) => eprintln!("gpu-leak-test: warning: {}: the report was not written ({why})", self.test),
        }
    }

    /// One line for a passing test that names its real verdict (the
    /// harness prints it; shown with `--nocapture`).
    pub fn summary_line(&self) -> String {
        text::passing_line(self)
    }

    /// Retained growth in the verdict's layer over the judged window: its
    /// level after the last measured (or confirmation) iteration minus
    /// before the first.
    pub fn retained_growth_bytes(&self) -> i64 {
        self.judged(self.verdict_layer).map_or(0, |d| d.retained_growth_bytes)
    }

    /// The iterations the verdict judged: measured, then confirmation.
    /// Read from the last sample of each phase, which a thinned report
    /// keeps, not from how many samples it kept.
    pub fn window(&self) -> (u32, u32) {
        let last = |phase: Phase| self.samples.iter().filter(|s| s.phase == phase).map(|s| s.iteration).max();
        let measured = last(Phase::Measure).unwrap_or(0);
        (measured, last(Phase::Confirm).map_or(0, |n| n.saturating_sub(measured)))
    }

    /// The biggest allocation site in the verdict's layer, if attribution
    /// ran and found survivors there; for a peak over its baseline, the
    /// biggest site alive at the peak.
    pub fn top_site(&self) -> Option<&crate::attribution::Site> {
        let sites = match &self.verdict {
            Verdict::PeakOverBaseline { .. } => self.findings.peak_sites.as_ref()?,
            _ => self.findings.attribution.as_ref()?,
        };
        sites.sites.iter().find(|s| s.layer == self.verdict_layer)
    }

    /// What was judged in `layer`, where it was judged.
    pub fn judged(&self, layer: crate::layer::Layer) -> Option<&DeviceResult> {
        self.devices.iter().find(|d| d.layer == layer)
    }
}

#[cfg(test)]
mod tests {
    use super::MemoryViews;

    fn views(live: i64, allocator: Option<u64>, host_heap: Option<u64>) -> MemoryViews {
        MemoryViews {
            live_bytes: live,
            peak_live_bytes: live,
            allocated_bytes: allocator,
            reserved_bytes: allocator,
            active_bytes: allocator,
            driver_used_bytes: allocator,
            driver_total_bytes: allocator,
            host_heap_bytes: host_heap,
            driver_process_bytes: allocator,
        }
    }

    #[test]
    fn every_view_a_report_holds_has_one_row_with_its_own_name() {
        let rows = MemoryViews::rows(&views(1, Some(2), Some(3)), &views(4, Some(5), Some(6)));
        assert_eq!(rows.len(), 6, "{rows:?}");
        let mut names: Vec<_> = rows.iter().map(|r| r.0).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 6, "{rows:?}");
        assert_eq!(rows[0], ("tensors alive (exact)", 1, 4));
    }

    #[test]
    fn a_view_missing_on_either_side_has_no_row() {
        // On the CPU libtorch keeps no allocator statistics and NVML is absent.
        let rows = MemoryViews::rows(&views(1, None, Some(3)), &views(4, Some(5), Some(6)));
        let names: Vec<_> = rows.iter().map(|r| r.0).collect();
        assert_eq!(names, ["tensors alive (exact)", "host heap in use (whole process)"]);
    }
}
