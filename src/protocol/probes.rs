//! Wiring the probes: which layers a test follows, one counting state per
//! layer (its source, proved by its canary), and reading them all at once.
use super::samples::Reading;
use crate::layer::{Counting, Layer, Proof};
use crate::probe::process::Coverage;
use crate::probe::{Snapshot, SnapshotTimes, Tracker};
use crate::report::notes::Note;
use crate::report::{CanaryTimes, Sample, SamplingParts};
use crate::scope::ResolvedScope;
use crate::verdict::{Phase, Verdict};
use std::time::Instant;
use tch::Device;

/// Every followed layer's counting state, and the trackers they read.
pub(super) struct Probes {
    /// Where the body runs.
    pub(super) device: Device,
    pub(super) scope: ResolvedScope,
    pub(super) tracker: Tracker,
    /// The process-wide tracker, beside the test's own in thread scope.
    pub(super) global: Option<Tracker>,
    /// One per followed layer, in `layer::followed`'s order.
    pub(super) counted: Vec<Box<dyn Counting>>,
    /// The index of the body's device's tensors.
    pub(super) body: usize,
    pub(super) coverage: Coverage,
}

impl Probes {
    /// Chooses each followed layer's source for this scope.
    pub(super) fn wire(device: Device, scope: ResolvedScope, tracker: Tracker, global: Option<Tracker>, coverage: Coverage) -> Probes {
        let layers = crate::layer::followed(device, scope);
        let counted: Vec<Box<dyn Counting>> = layers.iter().map(|l| l.count(scope.is_process(), &coverage)).collect();
        let body = layers.iter().position(|&l| l == Layer::Tensors(device)).expect("the body's device is followed");
        Probes { device, scope, tracker, global, counted, body, coverage }
    }

    pub(super) fn layer(&self, d: usize) -> Layer {
        self.counted[d].layer()
    }

    pub(super) fn layers(&self) -> Vec<Layer> {
        self.counted.iter().map(|c| c.layer()).collect()
    }

    /// The index of `layer`, where it is followed.
    pub(super) fn index_of(&self, layer: Layer) -> Option<usize> {
        self.counted.iter().position(|c| c.layer() == layer)
    }

    /// No verdict from a blind source: the host's layers, and the body's
    /// device's, must see a canary first. `Ok` is what the C++ heap's
    /// canary added (one CPU tensor's records); `Err` the layer that is
    /// blind, with its verdict.
    pub(super) fn prove(&mut self, times: &mut CanaryTimes) -> Result<i64, (usize, Verdict)> {
        let mut records_per_tensor = 0;
        for d in 0..self.counted.len() {
            let on = self.layer(d).device();
            if on != Device::Cpu && on != self.device {
                continue;
            }
            let proof = Proof {
                body: self.device,
                process_scope: self.scope.is_process(),
                tracker: &self.tracker,
                coverage: &self.coverage,
            };
            let started = Instant::now();
            let proved = self.counted[d].prove(proof);
            times.add(self.layer(d), started.elapsed());
            match proved {
                Ok(added) if self.layer(d) == Layer::HostObjects => records_per_tensor = added,
                Ok(_) => {}
                Err(reason) => return Err((d, self.counted[d].cannot_measure(reason))),
            }
        }
        Ok(records_per_tensor)
    }

    /// The peaks start with the test: the sources' canaries came before.
    pub(super) fn reset_peaks(&self) {
        for counted in self.counted.iter().filter(|c| c.layer().keeps_peak()) {
            counted.reset_peak(&self.tracker);
        }
    }

    /// Each layer's live bytes now, as its source counts them.
    pub(super) fn levels_now(&self) -> Vec<i64> {
        self.counted.iter().map(|c| c.level(&self.tracker)).collect()
    }

    /// Every reading of one sample: each layer's level and its peak since
    /// the sample before (a new peak window starts), the process-wide
    /// levels in thread scope, and the body's device's views.
    /// Where its time went is added to `parts`.
    pub(super) fn read(&self, phase: Phase, iteration: u32, host_heap: bool, parts: &mut SamplingParts) -> (Reading, Snapshot) {
        let started = Instant::now();
        for counted in &self.counted {
            counted.settle();
        }
        parts.settle += started.elapsed();
        let mut times = SnapshotTimes::default();
        let snapshot = self.snapshot_timed(host_heap, &mut times);
        parts.synchronize += times.synchronize;
        parts.host_heap += times.host_heap;
        let levels = self.levels_now();
        let peaks = self
            .counted
            .iter()
            .map(|c| {
                let peaks = c.peaks(&self.tracker);
                if peaks.is_some() {
                    c.reset_peak(&self.tracker);
                }
                peaks
            })
            .collect();
        let process_wide = self.global.as_ref().map(|global| self.counted.iter().map(|c| c.level_process_wide(global)).collect());
        let sample = Sample::from_snapshot(phase, iteration, &snapshot);
        (Reading { sample, levels, process_wide, peaks }, snapshot)
    }

    /// Every view of the body's device, its exact count as its source
    /// counts it (the allocator's statistics, where they are the source).
    pub(super) fn snapshot(&self, host_heap: bool) -> Snapshot {
        self.snapshot_timed(host_heap, &mut SnapshotTimes::default())
    }

    fn snapshot_timed(&self, host_heap: bool, times: &mut SnapshotTimes) -> Snapshot {
        let mut snapshot = Snapshot::take_timed(self.device, &self.tracker, host_heap, times);
        snapshot.hook = self.counted[self.body].view(&self.tracker);
        snapshot
    }

    /// Allocations and frees layer `d` counted so far.
    pub(super) fn events(&self, d: usize) -> u64 {
        self.counted[d].events(&self.tracker)
    }

    /// Whether layer `d` was used during the test: it counted an event, or
    /// (statistics, which count none) its level `moved`.
    pub(super) fn used(&self, d: usize, moved: bool) -> bool {
        let counted = &self.counted[d];
        counted.events(&self.tracker) > 0 || (!counted.counts_events() && moved)
    }

    /// What the report says about the scope and what it could see.
    pub(super) fn coverage_notes(&self) -> Vec<Note> {
        let mut notes = Vec::new();
        if self.device.is_cuda() && self.index_of(Layer::OutsideLibtorch(self.device)).is_none() {
            notes.push(Note::OutsideLibtorchNotJudged);
        }
        if let Some(reason) = crate::layer::rust_heap::not_counted_because(self.scope) {
            notes.push(Note::RustHeapNotCounted { reason });
        }
        if let ResolvedScope::Process { alongside_other_tests: true } = self.scope {
            notes.push(Note::ProcessScopeBesideOtherTests);
        }
        if self.scope.is_process() {
            if !self.coverage.cpu {
                notes.push(Note::CpuAllocatorNotCounted);
            }
            notes.extend(self.counted.iter().filter_map(|c| c.coverage_note(&self.coverage)).map(Note::Coverage));
        }
        notes
    }
}
