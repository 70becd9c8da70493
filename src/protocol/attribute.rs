//! The attributor: a few more iterations with a stack captured for every
//! allocation, after a verdict needs sites. It finds what survived them,
//! by site (for a leak), or what was alive at each one's peak (for a peak
//! over its baseline).
use super::execute::{Executor, Iteration};
use crate::attribution::{self, Attribution};
use crate::layer::Layer;
use crate::refs::Reference;
use crate::report::notes::Note;
use crate::verdict::{Phase, Verdict};
use std::collections::HashSet;
use std::time::Instant;

/// What the attribution iterations found.
pub(super) struct Found {
    pub(super) attribution: Attribution,
    /// The retained tensors that watched roots hold.
    pub(super) references: Vec<Reference>,
    /// Each site's live bytes after every attribution iteration, by layer.
    pub(super) site_levels: Vec<(Layer, Vec<u64>)>,
}

/// The folder sites are named relative to: where the build saw the
/// crate's sources, as the debug info names them.
fn sites_root(exec: &Executor<'_>) -> std::path::PathBuf {
    let test = exec.test;
    test.build_folder.clone().or_else(|| test.crate_folder.clone()).unwrap_or_else(|| std::env::current_dir().unwrap_or_default())
}

/// Which layers that are counted without the tracker get stacks in a
/// pass: each only where it is attributed, as a training step makes ten
/// times more of their blocks than tensors.
#[derive(Debug, Clone, Copy)]
pub(super) struct Recorded {
    pub(super) host_objects: bool,
    pub(super) rust_heap: bool,
}

/// Runs `count` attribution iterations with stack capture on and groups
/// the allocations that survive them; libtorch's host objects and the Rust
/// heap get stacks only where `recorded` says. `Err` is how the body
/// failed there.
/// Attribution's samples count as attribution's time, not as sampling.
pub(super) fn survivors(
    exec: &mut Executor<'_>,
    iteration: &mut Iteration<'_>,
    count: u32,
    recorded: Recorded,
) -> Result<Found, Verdict> {
    let (started, sampling_before) = (Instant::now(), exec.time.sampling);
    let found = record_survivors(exec, iteration, count, recorded);
    exec.time.attribution += started.elapsed();
    exec.time.sampling = sampling_before;
    found
}

fn record_survivors(exec: &mut Executor<'_>, iteration: &mut Iteration<'_>, count: u32, recorded: Recorded) -> Result<Found, Verdict> {
    let tracker = exec.probes.tracker.clone();
    tracker.clear_recorded();
    let watching = crate::refs::Watching::start();
    // In process scope the C++ heap reaches the tracker only to be
    // recorded, and the Rust heap always does.
    let feed = recorded.host_objects && exec.probes.counted.iter().any(|c| c.feeds_sites_on_request());
    let stop = |tracker: &crate::probe::Tracker| {
        tracker.stop_recording();
        crate::probe::process::record_host_object_sites(false);
        crate::layer::rust_heap::record_sites(false);
    };
    crate::probe::process::record_host_object_sites(feed);
    crate::layer::rust_heap::record_sites(recorded.rust_heap);
    tracker.start_recording_layers(1, recorded.host_objects);
    let mut by_stack_each_iteration = Vec::new();
    for i in 1..=count {
        tracker.set_tag(i);
        if let Err(stopped) = exec.iterate(Phase::Attribution, i, iteration) {
            stop(&tracker);
            return Err(stopped);
        }
        by_stack_each_iteration.push(tracker.recorded_bytes_by_stack());
    }
    stop(&tracker);
    let survivors = tracker.recorded_survivors();
    tracker.clear_recorded();
    let naming = Instant::now();
    let attribution = attribution::attribute(&survivors, count, &sites_root(exec));
    let references = watching.finish(&survivors, &attribution);
    exec.time.attribution_naming += naming.elapsed();
    let sites: HashSet<&(Layer, Vec<usize>)> = by_stack_each_iteration.iter().flat_map(|m| m.keys()).collect();
    let site_levels = sites
        .into_iter()
        .map(|key| (key.0, by_stack_each_iteration.iter().map(|m| m.get(key).copied().unwrap_or(0)).collect()))
        .collect();
    Ok(Found { attribution, references, site_levels })
}

/// Where layer `d`'s peak rose over its baseline: runs the attribution
/// iterations again with stack capture and takes the allocations alive at
/// each one's peak there, by site.
pub(super) fn peak_sites(exec: &mut Executor<'_>, iteration: &mut Iteration<'_>, d: usize) -> Attribution {
    let count = exec.settings.attribution_iterations;
    let (started, sampling_before) = (Instant::now(), exec.time.sampling);
    let tracker = exec.probes.tracker.clone();
    tracker.clear_recorded();
    tracker.start_recording_layers(1, exec.probes.layer(d) == Layer::HostObjects);
    exec.probes.counted[d].watch_peak(&tracker);
    let mut alive_at_peaks = Vec::new();
    for i in 1..=count {
        tracker.set_tag(i);
        if let Err(stopped) = exec.iterate(Phase::Attribution, i, iteration) {
            exec.notes.push(Note::PeakSitesStopped { label: stopped.label(), iteration: i });
            break;
        }
        alive_at_peaks.extend(tracker.take_alive_at_peak());
    }
    tracker.stop_watching_peak();
    tracker.stop_recording();
    tracker.clear_recorded();
    let naming = Instant::now();
    let sites = attribution::attribute(&alive_at_peaks, count, &sites_root(exec));
    exec.time.attribution_naming = naming.elapsed();
    exec.time.attribution = started.elapsed();
    exec.time.sampling = sampling_before;
    sites
}

/// The note for a body that failed during attribution.
pub(super) fn stopped_note(stopped: &Verdict) -> Note {
    let (phase, iteration, message) = stopped.body_failure().unwrap_or((Phase::Attribution, 0, ""));
    Note::AttributionStopped { label: stopped.label(), phase, iteration, message: message.to_string() }
}
