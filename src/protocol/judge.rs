//! The judge: every layer's verdict from typed evidence, by rules that run
//! in this order, each able to overwrite what came before it only where it
//! says so:
//!
//! 1. the window: each layer's series by `verdict::decide`, and the body's
//!    peak against its budget ([`Judge::decide_window`]);
//! 2. the memory baseline: a figure over it fails its layer, where nothing
//!    fails it already ([`Judge::over_baseline`], [`Judge::no_baseline`]);
//! 3. attribution: each leak judged again by its layer's rule on what the
//!    sites show ([`Judge::after_attribution`]);
//! 4. host objects beside kept tensors: the tensors' own records are part
//!    of their leak, not a second cause ([`Judge::records_of_kept_tensors`]);
//! 5. the test's verdict: a failure in any judged layer, the biggest leak
//!    first, else the body's ([`Judge::verdict_layer`]).
//!
//! The rules themselves are `verdict.rs`'s; this file only applies them to
//! the run's layers. Its tests run it on scripted samples.
use super::samples::Samples;
use crate::attribution::Attribution;
use crate::baseline::FigureChange;
use crate::layer::{Attributed, Layer};
use crate::report::notes::Note;
use crate::verdict::{self, Confirmation, Leak, Verdict};

/// The verdicts of one run, layer by layer.
pub(super) struct Judge {
    layers: Vec<Layer>,
    /// The index of the body's device's tensors.
    body: usize,
    /// The measured window, and the threshold over it.
    window: u32,
    threshold_bytes: u64,
    peak_budget_bytes: Option<u64>,
    pub(super) verdicts: Vec<Verdict>,
    /// Layers that saw an allocation or a free during the test.
    used: Vec<bool>,
}

/// What the judge needs of the settings.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    pub(super) window: u32,
    pub(super) threshold_bytes: u64,
    pub(super) peak_budget_bytes: Option<u64>,
}

impl Judge {
    pub(super) fn new(layers: Vec<Layer>, body: usize, rules: Rules) -> Judge {
        let verdicts = vec![Verdict::Clean; layers.len()];
        let used = vec![false; layers.len()];
        let Rules { window, threshold_bytes, peak_budget_bytes } = rules;
        Judge { layers, body, window, threshold_bytes, peak_budget_bytes, verdicts, used }
    }

    /// A run stopped before or during its body: `verdict` on layer `d`,
    /// every other layer clean.
    pub(super) fn stopped(&mut self, d: usize, verdict: Verdict) {
        self.verdicts = vec![Verdict::Clean; self.layers.len()];
        self.verdicts[d] = verdict;
    }

    pub(super) fn body(&self) -> usize {
        self.body
    }

    /// Which layers saw an allocation or a free (see `Probes::used`).
    pub(super) fn set_used(&mut self, used: Vec<bool>) {
        self.used = used;
    }

    /// The layers judged: the body's device's, every layer used during the
    /// test, and every layer that failed.
    pub(super) fn judged(&self) -> Vec<usize> {
        (0..self.layers.len()).filter(|&d| d == self.body || self.used[d] || self.verdicts[d].is_failure()).collect()
    }

    /// Whether the window has decided every judged layer: confirmation
    /// runs on while a layer needs more iterations, and stops once one is a
    /// certain leak (more would only pile up more of it).
    pub(super) fn window_decided(&self, samples: &Samples) -> bool {
        let asks: Vec<Confirmation> = self
            .judged()
            .into_iter()
            .map(|d| (d, samples.series(d)))
            .filter(|(d, series)| self.layers[*d].may_leak(series))
            .map(|(_, series)| verdict::confirmation(&series, self.window, self.threshold_bytes))
            .collect();
        asks.contains(&Confirmation::CertainLeak) || !asks.contains(&Confirmation::NeedsMore)
    }

    /// Rule 1: every layer's verdict on the window; the body's peak since
    /// the test began against its budget.
    pub(super) fn decide_window(&mut self, samples: &Samples) {
        let peak = self.peak_budget_bytes.map(|budget| (samples.test_peaks[self.body], budget));
        self.verdicts = (0..self.layers.len())
            .map(|d| {
                let peak = peak.filter(|_| d == self.body);
                self.layers[d].decide(&samples.series(d), self.window, self.threshold_bytes, peak)
            })
            .collect();
    }

    /// Rule 2: each figure over its baseline fails its layer, the biggest
    /// rise first, where nothing fails that layer already.
    pub(super) fn over_baseline(&mut self, over: &[FigureChange], tolerance_pct: f64) {
        for change in over {
            let Some(d) = self.layers.iter().position(|l| l.name() == change.device) else { continue };
            if !self.verdicts[d].is_failure() {
                self.verdicts[d] = Verdict::PeakOverBaseline {
                    figure: change.figure.clone(),
                    baseline_bytes: change.baseline_bytes,
                    measured_bytes: change.measured_bytes,
                    tolerance_pct,
                };
            }
        }
    }

    /// Rule 2: a baseline that cannot be used fails the body's device,
    /// where nothing fails it already.
    pub(super) fn no_baseline(&mut self, file: String, reason: String) {
        if !self.verdicts[self.body].is_failure() {
            self.verdicts[self.body] = Verdict::NoBaseline { file, reason };
        }
    }

    /// The judged layer whose peak rose over its baseline, for finding
    /// where that peak is reached (the level after warm-up is setup's and
    /// warm-up's state, which the iterations do not allocate again).
    pub(super) fn peak_over_baseline(&self) -> Option<usize> {
        let peak_rose = |v: &Verdict| matches!(v, Verdict::PeakOverBaseline { figure, .. } if figure != "after_warmup_bytes");
        self.judged().into_iter().find(|&d| peak_rose(&self.verdicts[d]))
    }

    fn leak(&self, d: usize) -> Option<&Leak> {
        match &self.verdicts[d] {
            Verdict::Leak(leak) => Some(leak),
            _ => None,
        }
    }

    /// The loop's period, where a judged layer's levels repeat with one (a
    /// sawtooth: truncated BPTT, gradient accumulation); 1 where none does.
    fn loop_period(&self) -> u32 {
        let period = |&d: &usize| match self.verdicts[d] {
            Verdict::Bounded { period: Some(period), .. } => Some(period),
            _ => None,
        };
        self.judged().iter().filter_map(period).max().unwrap_or(1)
    }

    /// How many iterations a block of layer `d` may outlive the one that
    /// allocated it without being kept: its layer's late frees, and a
    /// sawtooth's rising edge, which keeps what its iterations allocate
    /// until it falls, `period - 1` iterations later, in every layer that
    /// follows the loop (host objects follow the tensors).
    fn iterations_a_block_may_live(&self, d: usize) -> u32 {
        self.layers[d].iterations_a_free_may_lag() + self.loop_period() - 1
    }

    /// Iterations enough that `leak` leaves a survivor before the last one:
    /// one at every k-th iteration, or at every fall of the loop's sawtooth.
    fn iterations_for_a_survivor(&self, leak: &Leak) -> u32 {
        survivor_iterations(leak).max(self.loop_period() + 1)
    }

    fn host_objects(&self) -> Option<usize> {
        self.layers.iter().position(|&l| l == Layer::HostObjects)
    }

    /// Whether `layer` is followed, judged and a leak.
    pub(super) fn leaks(&self, layer: Layer) -> bool {
        self.layers.iter().position(|&l| l == layer).is_some_and(|d| self.judged().contains(&d) && self.leak(d).is_some())
    }

    /// Whether libtorch's host objects are a leak.
    pub(super) fn host_objects_leak(&self) -> bool {
        self.host_objects().is_some_and(|h| self.judged().contains(&h) && self.leak(h).is_some())
    }

    /// Whether any judged tensor layer is a leak.
    pub(super) fn a_tensor_layer_leaks(&self) -> bool {
        self.judged().into_iter().any(|d| matches!(self.layers[d], Layer::Tensors(_)) && self.leak(d).is_some())
    }

    /// How many attribution iterations the leaks need to name their sites
    /// and back their verdicts, from at least `least`; `None` where nothing
    /// leaks.
    pub(super) fn attribution_iterations_needed(&self, least: u32) -> Option<u32> {
        let leaking: Vec<usize> = self.judged().into_iter().filter(|&d| self.leak(d).is_some()).collect();
        if leaking.is_empty() {
            return None;
        }
        // Beside a tensor leak, host objects that grow are usually the kept
        // tensors' records, with libtorch's own bookkeeping of live blocks
        // (a map that rehashes now and then): they set no iteration count.
        let host = self.host_objects();
        let tensors_leak = leaking.iter().any(|&d| Some(d) != host);
        let leaks: Vec<(usize, &Leak)> =
            leaking.iter().filter(|&&d| !(tensors_leak && Some(d) == host)).filter_map(|&d| Some((d, self.leak(d)?))).collect();
        // Enough iterations that a leak every k-th iteration (or at every
        // fall of the loop's sawtooth) leaves a survivor before the last
        // one, and before the last its layer's late frees, or the
        // sawtooth's rising edge, could still be holding.
        let needed = leaks
            .iter()
            .map(|&(d, leak)| self.iterations_for_a_survivor(leak) + self.iterations_a_block_may_live(d))
            .max()
            .unwrap_or(2);
        let mut count = least.max(needed);
        let host_objects_leak = !tensors_leak && host.is_some_and(|h| self.leak(h).is_some());
        if host_objects_leak || leaks.iter().any(|(_, leak)| leak.drift.is_none()) {
            // Growth with no exact pattern, or host objects (whose patterns
            // attribution must back): enough iterations to follow each site
            // (see verdict::growth_evidence).
            count = count.max(verdict::REPLACED_STATE_ITERATIONS);
        }
        Some(count)
    }

    /// The iterations of a pass that records host objects beside a tensor
    /// leak, from the first pass's `count`: host objects follow the
    /// tensors' pattern, and their own rule, which judges them after, needs
    /// their late frees' iteration on top.
    pub(super) fn iterations_with_host_objects_beside(&self, count: u32) -> u32 {
        let Some(host) = self.host_objects() else { return count };
        let tensors = self
            .judged()
            .into_iter()
            .filter(|&d| d != host)
            .filter_map(|d| self.leak(d))
            .map(|leak| self.iterations_for_a_survivor(leak))
            .max()
            .unwrap_or(0);
        count.max(tensors + self.iterations_a_block_may_live(host))
    }

    /// Rule 3: each leak judged again by its layer's rule on what
    /// attribution found. `site_levels` are each site's live bytes after
    /// every attribution iteration, by layer; `attributable` says which
    /// layers' sources name sites. Returns the notes on which evidence
    /// decided a leak with no exact pattern.
    pub(super) fn after_attribution(
        &mut self,
        attribution: &mut Attribution,
        site_levels: &[(Layer, Vec<u64>)],
        evidence: &AttributionEvidence<'_>,
    ) -> Vec<Note> {
        let mut notes = Vec::new();
        for d in self.judged() {
            let Some(leak) = self.leak(d).cloned() else { continue };
            let on = self.layers[d];
            if on == Layer::HostObjects && !evidence.host_objects_recorded {
                continue;
            }
            let suppressed = attribution.apply_suppressions(on, evidence.suppressions);
            let levels: Vec<Vec<u64>> = site_levels.iter().filter(|(layer, _)| *layer == on).map(|(_, l)| l.clone()).collect();
            if !evidence.attributable[d] && leak.drift.is_none() {
                // Growth with no exact pattern is judged by the sites that
                // grow, and this source names none: neither a pass nor a
                // leak can be backed.
                self.verdicts[d] = (evidence.cannot_measure)(d, leak.bytes_per_iteration);
                continue;
            }
            let growth = verdict::growth_evidence(attribution.kept_across_iterations(on, self.iterations_a_block_may_live(d)), &levels);
            let found = Attributed {
                replaced: growth.is_none(),
                trough_rose: evidence.samples.trough_rose_during_attribution(d),
                suppressed_per_iteration: suppressed,
                window: self.window,
                threshold_bytes: self.threshold_bytes,
            };
            self.verdicts[d] = on.after_attribution(&leak, &found);
            // A random body's verdict says which evidence decided it.
            if let (Verdict::Leak(Leak { drift: None, .. }), Some(evidence)) = (&self.verdicts[d], growth) {
                notes.push(Note::Evidence { layer: on, evidence });
            }
        }
        notes
    }

    /// Rule 4: a kept tensor keeps its records in libtorch's host objects
    /// too. Where those grew, typically, by no more than the records of the
    /// tensors kept across attribution's iterations (by a leak, a
    /// suppressed one, or a cache filling up), they are part of that, not a
    /// second cause.
    pub(super) fn records_of_kept_tensors(&mut self, attribution: &Attribution, samples: &Samples, records_per_tensor: i64) {
        let Some(host) = self.host_objects() else { return };
        let Some(leak) = self.leak(host) else { return };
        let kept_blocks: usize = attribution
            .sites
            .iter()
            .filter(|s| s.layer != Layer::HostObjects && !s.only_last_iteration(attribution.iterations))
            .map(|s| s.survivors.allocations)
            .sum();
        let tensors_per_iteration = kept_blocks as f64 / attribution.iterations.max(1) as f64;
        let series = samples.series(host);
        let typical = verdict::typical_rise(series.baseline(), &series.measured);
        if verdict::records_of_kept_tensors(typical, tensors_per_iteration, records_per_tensor) {
            self.verdicts[host] =
                Verdict::RecordsOfKeptTensors { retained_bytes: leak.retained_bytes, bytes_per_iteration: leak.bytes_per_iteration };
        }
    }

    /// Where attribution stopped, whether host objects grew beside a tensor
    /// leak, which only attribution could have explained.
    pub(super) fn host_objects_unexplained(&self) -> Option<Note> {
        if !(self.host_objects_leak() && self.a_tensor_layer_leaks()) {
            return None;
        }
        let rate = self.leak(self.host_objects()?)?.bytes_per_iteration;
        Some(Note::HostObjectsUnexplained { bytes_per_iteration: rate.round().max(0.0) as u64 })
    }

    /// Rule 5: the layer whose verdict the test gets: a failure in any
    /// judged layer (the biggest leak first), else the body's device's.
    ///
    /// Host objects that grew beside a tensor leak are often the kept
    /// tensors' own records, which only attribution tells apart from a kept
    /// graph (rule 4). Where attribution stopped, the tensors' leak, which
    /// needs no attribution, is the verdict.
    pub(super) fn verdict_layer(&self, attribution_stopped: bool) -> usize {
        let unexplained_host_objects = attribution_stopped && self.a_tensor_layer_leaks();
        let rank = |d: usize| match &self.verdicts[d] {
            Verdict::Leak(_) if unexplained_host_objects && self.layers[d] == Layer::HostObjects => (2, 0.0),
            Verdict::Leak(leak) => (3, leak.bytes_per_iteration),
            v if v.is_failure() => (2, 0.0),
            _ => (0, 0.0),
        };
        self.judged()
            .into_iter()
            .filter(|&d| self.verdicts[d].is_failure())
            .max_by(|&a, &b| rank(a).partial_cmp(&rank(b)).unwrap_or(std::cmp::Ordering::Equal).then(b.cmp(&a)))
            .unwrap_or(self.body)
    }
}

/// What rule 3 reads beside the sites.
pub(super) struct AttributionEvidence<'a> {
    pub(super) samples: &'a Samples,
    pub(super) suppressions: &'a [crate::config::Suppression],
    /// Per layer: its source names allocation sites.
    pub(super) attributable: Vec<bool>,
    /// Whether libtorch's host objects got stacks: where they did not,
    /// their leak waits for rule 4.
    pub(super) host_objects_recorded: bool,
    /// The "cannot measure" verdict of layer `d`'s source for growth of
    /// this many bytes per iteration with no exact pattern.
    pub(super) cannot_measure: &'a dyn Fn(usize, f64) -> Verdict,
}

/// Iterations enough that a leak every k-th iteration leaves a survivor
/// before the last one.
fn survivor_iterations(leak: &Leak) -> u32 {
    let widest_gap =
        leak.growing_iterations.windows(2).map(|w| w[1] - w[0]).chain(leak.drift.map(|(period, _)| period)).max().unwrap_or(1);
    widest_gap + 1
}

#[cfg(test)]
mod tests {
    use super::super::samples::script::scripted;
    use super::*;
    use tch::Device;

    const RULES: Rules = Rules { window: 4, threshold_bytes: 0, peak_budget_bytes: None };

    fn judge() -> Judge {
        Judge::new(vec![Layer::Tensors(Device::Cpu), Layer::HostObjects], 0, RULES)
    }

    #[test]
    fn a_layer_that_grows_every_iteration_is_a_leak_and_a_flat_one_is_clean() {
        let samples = scripted(1, &[&[0, 0], &[64, 0], &[128, 0], &[192, 0], &[256, 0], &[320, 0]]);
        let mut judge = judge();
        judge.set_used(vec![true, true]);
        judge.decide_window(&samples);
        assert!(matches!(judge.verdicts[0], Verdict::Leak(_)), "{:?}", judge.verdicts[0]);
        assert_eq!(judge.verdicts[1], Verdict::Clean);
        assert_eq!(judge.verdict_layer(false), 0);
    }

    #[test]
    fn a_layer_nothing_used_is_not_judged_unless_it_is_the_bodys() {
        let mut judge = judge();
        judge.set_used(vec![false, false]);
        assert_eq!(judge.judged(), vec![0]);
        judge.set_used(vec![false, true]);
        assert_eq!(judge.judged(), vec![0, 1]);
    }

    #[test]
    fn a_figure_over_its_baseline_fails_its_layer_but_never_replaces_a_failure() {
        let change = FigureChange {
            device: "cpu".into(),
            figure: "iteration_peak_bytes".into(),
            baseline_bytes: 100,
            measured_bytes: 200,
        };
        let mut judge = judge();
        judge.over_baseline(std::slice::from_ref(&change), 5.0);
        assert!(matches!(judge.verdicts[0], Verdict::PeakOverBaseline { .. }));
        assert_eq!(judge.peak_over_baseline(), Some(0));
        judge.no_baseline("f".into(), "r".into());
        assert!(matches!(judge.verdicts[0], Verdict::PeakOverBaseline { .. }), "the first failure stands");
    }

    #[test]
    fn host_objects_beside_a_tensor_leak_set_no_attribution_count_and_lose_the_verdict_where_attribution_stopped() {
        let samples = scripted(1, &[&[0, 0], &[64, 300], &[128, 600], &[192, 900], &[256, 1200], &[320, 1500]]);
        let mut judge = judge();
        judge.set_used(vec![true, true]);
        judge.decide_window(&samples);
        assert!(matches!(judge.verdicts[1], Verdict::Leak(_)));
        assert_eq!(judge.attribution_iterations_needed(3), Some(3));
        // Host objects grow faster, but the tensors' leak needs no attribution.
        assert_eq!(judge.verdict_layer(false), 1);
        assert_eq!(judge.verdict_layer(true), 0);
        assert_eq!(judge.host_objects_unexplained(), Some(Note::HostObjectsUnexplained { bytes_per_iteration: 300 }));
    }

    #[test]
    fn host_objects_recorded_beside_a_tensor_leak_every_other_iteration_get_their_late_frees_iteration_too() {
        let samples = scripted(
            1,
            &[&[0, 0], &[64, 300], &[64, 300], &[128, 600], &[128, 600], &[192, 900], &[192, 900], &[256, 1200], &[256, 1200]],
        );
        let mut judge = judge();
        judge.set_used(vec![true, true]);
        judge.decide_window(&samples);
        let Verdict::Leak(tensors) = &judge.verdicts[0] else { panic!("{:?}", judge.verdicts[0]) };
        assert_eq!(tensors.drift.map(|(period, _)| period), Some(2), "{tensors:?}");
        assert!(matches!(judge.verdicts[1], Verdict::Leak(_)));
        // The tensors' gap of 2 and one more; a pass that records the host
        // objects beside them adds their late frees' iteration.
        assert_eq!(judge.attribution_iterations_needed(3), Some(3));
        assert_eq!(judge.iterations_with_host_objects_beside(3), 4);
        // Where the first pass already ran as many, none is added.
        assert_eq!(judge.iterations_with_host_objects_beside(5), 5);
    }

    #[test]
    fn host_objects_beside_a_sawtooth_may_live_until_it_falls_and_attribution_runs_past_that() {
        // Truncated BPTT as a CPU run measured it: the tensors rise for 3
        // iterations and fall on the 4th; the host objects follow, some
        // bytes off at times, and the first backward kept libtorch's
        // one-time state.
        let tensors = [4608, 5120, 5632, 6144, 8704, 9216, 9728, 10240, 8704, 9216, 9728, 10240, 8704, 9216, 9728, 10240];
        let host = [3680, 7216, 9696, 12176, 8040, 10480, 12960, 15440, 8040, 10480, 12960, 15424, 8040, 10480, 12944, 15408];
        let rows: Vec<[i64; 2]> = tensors.iter().zip(host).map(|(&t, h)| [t, h]).collect();
        let rows: Vec<&[i64]> = rows.iter().map(|r| &r[..]).collect();
        let samples = scripted(2, &rows);
        let mut judge = judge();
        judge.set_used(vec![true, true]);
        judge.decide_window(&samples);
        assert!(matches!(judge.verdicts[0], Verdict::Bounded { period: Some(4), .. }), "{:?}", judge.verdicts[0]);
        assert!(matches!(judge.verdicts[1], Verdict::Leak(Leak { drift: None, .. })), "{:?}", judge.verdicts[1]);
        // The sawtooth's last 3 iterations, beside the one late free.
        assert_eq!(judge.iterations_a_block_may_live(1), 1 + 3);
        // A leak at every fall, in any phase, leaves a survivor older than that.
        let needed = judge.attribution_iterations_needed(3).unwrap();
        assert!(needed - judge.iterations_a_block_may_live(1) > 4, "{needed} iterations");
    }

    #[test]
    fn host_objects_recorded_beside_a_tensor_leak_and_a_sawtooth_outlive_the_sawtooths_edge_too() {
        // CPU tensors rise for 3 iterations and fall on the 4th; CUDA
        // tensors leak 64 B every iteration; host objects grow beside them.
        let cpu = [0, 100, 200, 300, 0, 100, 200, 300, 0, 100, 200, 300, 0];
        let rows: Vec<[i64; 3]> = cpu.iter().enumerate().map(|(i, &c)| [c, 64 * i as i64, 300 * i as i64]).collect();
        let rows: Vec<&[i64]> = rows.iter().map(|r| &r[..]).collect();
        let samples = scripted(1, &rows);
        let mut judge = Judge::new(vec![Layer::Tensors(Device::Cpu), Layer::Tensors(Device::Cuda(0)), Layer::HostObjects], 0, RULES);
        judge.set_used(vec![true, true, true]);
        judge.decide_window(&samples);
        assert!(matches!(judge.verdicts[0], Verdict::Bounded { period: Some(4), .. }), "{:?}", judge.verdicts[0]);
        assert!(matches!(judge.verdicts[1], Verdict::Leak(_)), "{:?}", judge.verdicts[1]);
        // A survivor older than the sawtooth's last 3 iterations and the
        // host objects' late free, as in the first pass's own count.
        let may_live = judge.iterations_a_block_may_live(2);
        assert_eq!(may_live, 1 + 3);
        let beside = judge.iterations_with_host_objects_beside(3);
        assert!(beside > may_live + 4, "{beside} iterations");
    }

    #[test]
    fn host_objects_alone_that_leak_need_enough_iterations_to_follow_each_site() {
        let samples = scripted(1, &[&[0, 0], &[0, 300], &[0, 600], &[0, 900], &[0, 1200], &[0, 1500]]);
        let mut judge = judge();
        judge.set_used(vec![true, true]);
        judge.decide_window(&samples);
        assert_eq!(judge.attribution_iterations_needed(3), Some(verdict::REPLACED_STATE_ITERATIONS.max(3)));
    }

    #[test]
    fn a_flat_window_is_decided_and_growth_that_may_stop_asks_for_more_iterations() {
        let flat = scripted(1, &[&[0, 0], &[64, 0], &[64, 0], &[64, 0], &[64, 0], &[64, 0]]);
        let growing = scripted(1, &[&[0, 0], &[64, 0], &[128, 0], &[192, 0], &[256, 0], &[320, 0]]);
        let mut judge = judge();
        judge.set_used(vec![true, false]);
        assert!(judge.window_decided(&flat));
        assert_eq!(
            judge.window_decided(&growing),
            verdict::confirmation(&growing.series(0), RULES.window, RULES.threshold_bytes) != Confirmation::NeedsMore
        );
    }
}
