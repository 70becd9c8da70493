//! The store of samples: after setup and after every iteration, each
//! followed layer's level (and in thread scope its process-wide level),
//! its peak during the iteration, and the body's device's other views.
//! Pure: the judge and the report read it, and its tests script it.
use crate::baseline::Figures;
use crate::layer::Peaks;
use crate::probe::Snapshot;
use crate::report::Sample;
use crate::verdict::{Phase, Series};

/// Every sample of one run, by layer index (as in the run's probes).
#[derive(Debug, Clone, Default)]
pub(super) struct Samples {
    /// Live bytes per layer before setup.
    pub(super) start: Vec<i64>,
    /// The body's device's views at each sample.
    pub(super) samples: Vec<Sample>,
    /// Live bytes per layer at each sample.
    pub(super) levels: Vec<Vec<i64>>,
    /// In thread scope, each layer's process-wide level at each sample.
    pub(super) process_wide: Vec<Vec<i64>>,
    /// Per sample, each layer's repeatable peak during the iteration before
    /// it, above the level before that iteration (0 where its count keeps
    /// no peak): what memory baselines keep.
    pub(super) iteration_peaks: Vec<Vec<i64>>,
    /// Each layer's highest live bytes above `start` over setup, warm-up,
    /// measured and confirmation iterations: what `peak_mb` bounds.
    pub(super) test_peaks: Vec<i64>,
    /// All views right before the first measured iteration, and after the
    /// last.
    pub(super) before: Option<Snapshot>,
    pub(super) after: Option<Snapshot>,
}

/// One sample's readings, as the probes took them.
pub(super) struct Reading {
    pub(super) sample: Sample,
    pub(super) levels: Vec<i64>,
    pub(super) process_wide: Option<Vec<i64>>,
    /// Each layer's peaks during the iteration, where its count keeps one.
    pub(super) peaks: Vec<Option<Peaks>>,
}

impl Samples {
    pub(super) fn new(start: Vec<i64>) -> Samples {
        let test_peaks = vec![0; start.len()];
        Samples { start, test_peaks, ..Samples::default() }
    }

    /// Keeps one sample. Attribution's iterations, which capture stacks,
    /// set no test peak.
    pub(super) fn push(&mut self, reading: Reading) {
        let before = self.levels.last().unwrap_or(&self.start);
        let phase = reading.sample.phase;
        let mut rises = vec![0; reading.levels.len()];
        for (d, peaks) in reading.peaks.iter().enumerate() {
            let Some(peaks) = peaks else { continue };
            let level = reading.levels[d];
            rises[d] = peaks.repeatable.max(level) - before[d];
            if phase != Phase::Attribution {
                self.test_peaks[d] = self.test_peaks[d].max(peaks.peak.max(level) - self.start[d]);
            }
        }
        self.iteration_peaks.push(rises);
        self.samples.push(reading.sample);
        self.levels.push(reading.levels);
        if let Some(process_wide) = reading.process_wide {
            self.process_wide.push(process_wide);
        }
    }

    /// The exact series of layer `d`, from the samples so far.
    pub(super) fn series(&self, d: usize) -> Series {
        let at = |phases: &[Phase]| -> Vec<i64> { self.levels_in(d, phases).collect() };
        Series {
            start: self.start[d],
            after_setup: at(&[Phase::Setup]).first().copied().unwrap_or(self.start[d]),
            warmup: at(&[Phase::WarmUp]),
            measured: at(&[Phase::Measure, Phase::Confirm]),
        }
    }

    /// Layer `d`'s level after each sample taken in one of `phases`.
    pub(super) fn levels_in<'s>(&'s self, d: usize, phases: &'s [Phase]) -> impl Iterator<Item = i64> + 's {
        self.samples.iter().zip(&self.levels).filter(|(s, _)| phases.contains(&s.phase)).map(move |(_, l)| l[d])
    }

    /// One value before the first measured iteration (at the last warm-up or
    /// setup sample, the series' baseline) and after each measured and
    /// confirmation iteration, `value` reading it by sample index; `None`
    /// where any is missing. Every measured-window comparison (the layers'
    /// exact levels, the process-wide view, the host heap) reads this way.
    pub(super) fn measured_window(&self, value: impl Fn(usize) -> Option<i64>) -> Option<Vec<i64>> {
        let baseline = self.samples.iter().rposition(|s| matches!(s.phase, Phase::WarmUp | Phase::Setup))?;
        let measured = (0..self.samples.len()).filter(|&i| matches!(self.samples[i].phase, Phase::Measure | Phase::Confirm));
        std::iter::once(baseline).chain(measured).map(value).collect()
    }

    /// Layer `d`'s exact levels over the measured window.
    pub(super) fn window_levels(&self, d: usize) -> Option<Vec<i64>> {
        self.measured_window(|i| Some(self.levels[i][d]))
    }

    /// Layer `d`'s process-wide levels over the measured window.
    pub(super) fn window_process_wide(&self, d: usize) -> Option<Vec<i64>> {
        self.measured_window(|i| self.process_wide.get(i).map(|l| l[d]))
    }

    /// How many samples were taken.
    pub(super) fn len(&self) -> usize {
        self.samples.len()
    }

    /// Forgets the samples from the `len`-th on (an attribution pass run
    /// again).
    pub(super) fn truncate(&mut self, len: usize) {
        self.samples.truncate(len);
        self.levels.truncate(len);
        self.process_wide.truncate(len);
        self.iteration_peaks.truncate(len);
    }

    /// Whether layer `d`'s level ever left where it started.
    pub(super) fn moved(&self, d: usize) -> bool {
        self.levels.iter().any(|l| l[d] != self.start[d])
    }

    /// Whether layer `d`'s trough rose: its lowest level over attribution's
    /// iterations is above the window's latest trough, its lowest level over
    /// the second half of the measured and confirmation iterations. A block
    /// that comes and goes (another thread's cache, a library's scratch)
    /// leaves the trough where it was, and so does a one-off kept earlier in
    /// the window (libtorch's lazily made state, at whichever backward()
    /// the scheduling gives it): the latest trough holds it already.
    /// Something kept every iteration lifts attribution's trough above it.
    pub(super) fn trough_rose_during_attribution(&self, d: usize) -> bool {
        let window: Vec<i64> = self.levels_in(d, &[Phase::Measure, Phase::Confirm]).collect();
        let latest = window[window.len() / 2..].iter().copied().min();
        match (latest, self.levels_in(d, &[Phase::Attribution]).min()) {
            (Some(before), Some(during)) => during > before,
            _ => false,
        }
    }

    /// How much layer `d` grew in the latest iteration.
    pub(super) fn latest_growth(&self, d: usize) -> Option<i64> {
        let [.., before, last] = &self.levels[..] else { return None };
        Some(last[d] - before[d])
    }

    /// Layer `d`'s figures for its baseline, from repeatable peaks.
    pub(super) fn baseline_figures(&self, d: usize) -> Figures {
        let phase = |i: usize| self.samples[i].phase;
        let before = |i: usize| if i == 0 { self.start[d] } else { self.levels[i - 1][d] };
        let test_peak = (0..self.samples.len())
            .filter(|&i| phase(i) != Phase::Attribution)
            .map(|i| before(i) + self.iteration_peaks[i][d] - self.start[d])
            .max()
            .unwrap_or(0);
        Figures {
            iteration_peak_bytes: (0..self.samples.len())
                .filter(|&i| phase(i) == Phase::Measure)
                .map(|i| self.iteration_peaks[i][d])
                .max()
                .unwrap_or(0),
            after_warmup_bytes: self.series(d).baseline() - self.start[d],
            test_peak_bytes: test_peak.max(0),
        }
    }

    /// The host heap's levels over the measured window where it was read:
    /// the baseline, then the iterations that read it, evenly spaced.
    pub(super) fn host_heap_window(&self) -> Option<Vec<i64>> {
        let baseline = self.samples.iter().rposition(|s| matches!(s.phase, Phase::WarmUp | Phase::Setup))?;
        let mut read = (baseline..self.samples.len())
            .filter(|&i| i == baseline || matches!(self.samples[i].phase, Phase::Measure | Phase::Confirm))
            .map(|i| self.samples[i].host_heap_bytes.map(|b| b as i64));
        let before = read.next().flatten()?;
        Some(std::iter::once(before).chain(read.flatten()).collect())
    }

    /// Iterations run after setup, at least 1.
    pub(super) fn iterations_run(&self) -> f64 {
        self.samples.iter().filter(|s| s.phase != Phase::Setup).count().max(1) as f64
    }
}

#[cfg(test)]
pub(super) mod script {
    //! Scripted samples for the judge's and the store's tests.
    use super::*;

    /// A store whose layers went through `levels` (one row per sample),
    /// phased setup, `warmup` warm-up iterations, then measured ones.
    pub(in crate::protocol) fn scripted(warmup: usize, levels: &[&[i64]]) -> Samples {
        let layers = levels[0].len();
        let mut samples = Samples::new(vec![0; layers]);
        for (i, row) in levels.iter().enumerate() {
            let (phase, iteration) = match i {
                0 => (Phase::Setup, 0),
                i if i <= warmup => (Phase::WarmUp, i as u32),
                i => (Phase::Measure, (i - warmup) as u32),
            };
            let mut sample = Sample::from_snapshot(phase, iteration, &Snapshot::empty());
            sample.host_heap_bytes = None;
            samples.push(Reading { sample, levels: row.to_vec(), process_wide: None, peaks: vec![None; layers] });
        }
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::script::scripted;
    use super::*;

    #[test]
    fn the_series_splits_setup_warm_up_and_the_measured_window() {
        let samples = scripted(2, &[&[10], &[12], &[14], &[14], &[15]]);
        let series = samples.series(0);
        assert_eq!((series.start, series.after_setup), (0, 10));
        assert_eq!(series.warmup, vec![12, 14]);
        assert_eq!(series.measured, vec![14, 15]);
        assert_eq!(samples.window_levels(0), Some(vec![14, 14, 15]));
        assert_eq!(samples.latest_growth(0), Some(1));
    }

    #[test]
    fn a_peak_during_an_iteration_is_kept_above_the_level_before_it() {
        let mut samples = Samples::new(vec![0]);
        let mut sample = Sample::from_snapshot(Phase::Measure, 1, &Snapshot::empty());
        sample.host_heap_bytes = None;
        let peaks = vec![Some(Peaks { peak: 900, repeatable: 700 })];
        samples.push(Reading { sample, levels: vec![100], process_wide: None, peaks });
        assert_eq!(samples.test_peaks, vec![900]);
        assert_eq!(samples.iteration_peaks, vec![vec![700]]);
        assert_eq!(samples.baseline_figures(0).iteration_peak_bytes, 700);
    }

    #[test]
    fn a_one_off_kept_early_in_the_window_does_not_raise_the_trough_of_a_sawtooth() {
        // Period 4, 200 B kept once at the window's second drop (BPTT with a
        // lazily made record): attribution's troughs equal the latest one.
        let window: &[&[i64]] = &[&[0], &[2400], &[4800], &[600], &[3000], &[5400], &[7800], &[800], &[3200], &[5600], &[8000], &[800]];
        let mut samples = scripted(0, window);
        for level in [3200, 5600, 8000, 800, 3200] {
            let sample = Sample::from_snapshot(Phase::Attribution, 1, &Snapshot::empty());
            samples.push(Reading { sample, levels: vec![level], process_wide: None, peaks: vec![None] });
        }
        assert!(!samples.trough_rose_during_attribution(0));
    }

    #[test]
    fn a_trough_that_rises_during_attribution_is_seen_and_one_that_comes_back_is_not() {
        let mut samples = scripted(0, &[&[0], &[5], &[5]]);
        for level in [9, 9] {
            let sample = Sample::from_snapshot(Phase::Attribution, 1, &Snapshot::empty());
            samples.push(Reading { sample, levels: vec![level], process_wide: None, peaks: vec![None] });
        }
        assert!(samples.trough_rose_during_attribution(0));
        let sample = Sample::from_snapshot(Phase::Attribution, 3, &Snapshot::empty());
        samples.push(Reading { sample, levels: vec![5], process_wide: None, peaks: vec![None] });
        assert!(!samples.trough_rose_during_attribution(0));
    }
}
