//! The verdict: plain arithmetic on the exact live-bytes series the hook
//! gives after each iteration. No libtorch here, so it is tested on scripted
//! samples.
use std::fmt;

/// Where in the protocol something happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Setup,
    WarmUp,
    Measure,
    /// Extra measured iterations, run when growth was seen only once.
    Confirm,
    /// Iterations with stack capture, run only after a failing verdict.
    Attribution,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Setup => "setup",
            Phase::WarmUp => "warm-up",
            Phase::Measure => "measured",
            Phase::Confirm => "confirmation",
            Phase::Attribution => "attribution",
        })
    }
}

/// How the live bytes moved over the measured iterations.
#[derive(Debug, Clone, PartialEq)]
pub enum Growth {
    /// Retained growth at or under the threshold.
    Flat { retained_bytes: i64 },
    /// Over the threshold, but the level rose to a new high only once, then
    /// stayed: a cache filled, a buffer was kept, a workspace was created.
    Once { retained_bytes: i64, iteration: u32 },
    /// Over the threshold and rising to new highs in two or more iterations.
    Recurring(Leak),
}

/// A leak: retained growth over the measured iterations.
#[derive(Debug, Clone, PartialEq)]
pub struct Leak {
    pub retained_bytes: i64,
    /// Number of measured iterations the growth was retained over.
    pub iterations: u32,
    pub bytes_per_iteration: f64,
    /// Measured iterations (1-based) after which the level reached a new high.
    pub growing_iterations: Vec<u32>,
}

/// Classifies `measured` (live bytes after each measured iteration) against
/// `baseline` (live bytes before the first of them).
///
/// Retained growth is `last - baseline`, so memory that is freed again before
/// the end (a sawtooth, a cache that flushes) is not a leak. Growth counts as
/// recurring when the level sets a new high in at least two iterations, which
/// catches leaks that happen only every k-th iteration, as long as the window
/// holds two of them.
pub fn growth(baseline: i64, measured: &[i64], threshold_bytes: u64) -> Growth {
    let Some(&last) = measured.last() else { return Growth::Flat { retained_bytes: 0 } };
    let retained_bytes = last - baseline;
    if retained_bytes <= threshold_bytes.min(i64::MAX as u64) as i64 {
        return Growth::Flat { retained_bytes };
    }
    let mut high = baseline;
    let mut new_highs = Vec::new();
    for (index, &live) in measured.iter().enumerate() {
        if live > high {
            high = live;
            new_highs.push(index as u32 + 1);
        }
    }
    if new_highs.len() < 2 {
        return Growth::Once { retained_bytes, iteration: new_highs.first().copied().unwrap_or(1) };
    }
    Growth::Recurring(Leak {
        retained_bytes,
        iterations: measured.len() as u32,
        bytes_per_iteration: retained_bytes as f64 / measured.len() as f64,
        growing_iterations: new_highs,
    })
}

/// Exact live bytes at each point of a run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Before setup (or before the first iteration for the per-iteration form).
    pub start: i64,
    /// After setup; equal to `start` where there is none.
    pub after_setup: i64,
    /// After each warm-up iteration.
    pub warmup: Vec<i64>,
    /// After each measured (and confirmation) iteration.
    pub measured: Vec<i64>,
}

impl Series {
    /// Live bytes just before the first measured iteration.
    pub fn baseline(&self) -> i64 {
        self.warmup.last().copied().unwrap_or(self.after_setup)
    }

    /// What the warm-up iterations left behind.
    pub fn warmup_retained(&self) -> i64 {
        self.baseline() - self.after_setup
    }
}

/// When one-time retention happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetainedDuring {
    WarmUp,
    /// A measured iteration (1-based).
    Iteration(u32),
}

/// The outcome of a leak test.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Nothing retained.
    Clean,
    /// Memory retained once, then flat: reported, never failed.
    OneTimeRetention { bytes: i64, during: RetainedDuring },
    /// Retained growth over the threshold, recurring across iterations.
    Leak(Leak),
    /// Live bytes rose over the window, but everything still alive was
    /// allocated in the latest iteration and the level did not rise every
    /// time: state replaced each iteration. Reported, not failed.
    Bounded { retained_bytes: i64 },
    /// A leak whose retained bytes all come from suppressed sites
    /// (`gpu-leak-test.yaml`): reported, not failed.
    Suppressed { retained_bytes: i64, bytes_per_iteration: f64 },
    /// The live-bytes peak went over the `peak_mb` budget.
    PeakOverBudget { peak_bytes: i64, budget_bytes: u64 },
    /// The body panicked.
    Panicked { phase: Phase, iteration: u32, message: String },
    /// libtorch could not allocate (out of memory) inside the body.
    OutOfMemory { phase: Phase, iteration: u32, message: String },
    /// The body returned an error.
    BodyError { phase: Phase, iteration: u32, message: String },
}

impl Verdict {
    pub fn is_failure(&self) -> bool {
        !matches!(
            self,
            Verdict::Clean | Verdict::OneTimeRetention { .. } | Verdict::Bounded { .. } | Verdict::Suppressed { .. }
        )
    }

    /// A short name for summaries and machine-readable output.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::OneTimeRetention { .. } => "one_time_retention",
            Verdict::Leak(_) => "leak",
            Verdict::Bounded { .. } => "bounded",
            Verdict::Suppressed { .. } => "suppressed",
            Verdict::PeakOverBudget { .. } => "peak_over_budget",
            Verdict::Panicked { .. } => "panicked",
            Verdict::OutOfMemory { .. } => "out_of_memory",
            Verdict::BodyError { .. } => "error",
        }
    }
}

/// The verdict for a run that finished all its iterations. A leak outranks a
/// peak over budget, which outranks one-time retention.
pub fn decide(series: &Series, threshold_bytes: u64, peak: Option<(i64, u64)>) -> Verdict {
    let peak_over = peak.filter(|&(peak_bytes, budget)| peak_bytes > budget.min(i64::MAX as u64) as i64);
    match growth(series.baseline(), &series.measured, threshold_bytes) {
        Growth::Recurring(leak) => Verdict::Leak(leak),
        _ if peak_over.is_some() => {
            let (peak_bytes, budget_bytes) = peak_over.unwrap();
            Verdict::PeakOverBudget { peak_bytes, budget_bytes }
        }
        Growth::Once { retained_bytes, iteration } => {
            Verdict::OneTimeRetention { bytes: retained_bytes, during: RetainedDuring::Iteration(iteration) }
        }
        Growth::Flat { .. } if series.warmup_retained() > 0 => {
            Verdict::OneTimeRetention { bytes: series.warmup_retained(), during: RetainedDuring::WarmUp }
        }
        Growth::Flat { .. } => Verdict::Clean,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(warmup: &[i64], measured: &[i64]) -> Series {
        Series { start: 0, after_setup: 100, warmup: warmup.to_vec(), measured: measured.to_vec() }
    }

    #[test]
    fn flat_is_clean() {
        let s = series(&[100, 100], &[100, 100, 100, 100, 100]);
        assert_eq!(decide(&s, 0, None), Verdict::Clean);
    }

    #[test]
    fn steady_growth_is_a_leak_with_its_rate() {
        let s = series(&[612, 1124], &[1636, 2148, 2660, 3172, 3684]);
        let Verdict::Leak(leak) = decide(&s, 0, None) else { panic!() };
        assert_eq!(leak.retained_bytes, 2560);
        assert_eq!(leak.bytes_per_iteration, 512.0);
        assert_eq!(leak.growing_iterations, vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn every_third_iteration_is_still_a_leak() {
        let s = series(&[100, 100], &[100, 100, 400, 400, 400, 700]);
        let Verdict::Leak(leak) = decide(&s, 0, None) else { panic!() };
        assert_eq!(leak.growing_iterations, vec![3, 6]);
        assert_eq!(leak.retained_bytes, 600);
    }

    #[test]
    fn growth_that_is_freed_again_is_not_retained() {
        let s = series(&[100], &[300, 100, 300, 100, 100]);
        assert_eq!(decide(&s, 0, None), Verdict::Clean);
        // A sawtooth that ends high rose to a new high only once.
        let s = series(&[100], &[300, 100, 300, 100, 300]);
        assert_eq!(decide(&s, 0, None), Verdict::OneTimeRetention { bytes: 200, during: RetainedDuring::Iteration(1) });
    }

    #[test]
    fn warmup_retention_is_reported_not_failed() {
        let s = series(&[5000, 5000], &[5000, 5000, 5000]);
        let verdict = decide(&s, 0, None);
        assert_eq!(verdict, Verdict::OneTimeRetention { bytes: 4900, during: RetainedDuring::WarmUp });
        assert!(!verdict.is_failure());
    }

    #[test]
    fn single_step_in_the_measured_window_is_one_time() {
        let s = series(&[100], &[100, 900, 900, 900, 900]);
        assert_eq!(decide(&s, 0, None), Verdict::OneTimeRetention { bytes: 800, during: RetainedDuring::Iteration(2) });
    }

    #[test]
    fn threshold_is_inclusive_of_small_growth() {
        let s = series(&[0], &[10, 20, 30]);
        assert_eq!(growth(0, &s.measured, 30), Growth::Flat { retained_bytes: 30 });
        assert!(matches!(growth(0, &s.measured, 29), Growth::Recurring(_)));
    }

    #[test]
    fn peak_budget() {
        let s = series(&[100], &[100, 100]);
        assert_eq!(decide(&s, 0, Some((2000, 1000))), Verdict::PeakOverBudget { peak_bytes: 2000, budget_bytes: 1000 });
        assert_eq!(decide(&s, 0, Some((1000, 1000))), Verdict::Clean);
        // A leak outranks the peak.
        let s = series(&[100], &[200, 300]);
        assert!(matches!(decide(&s, 0, Some((2000, 1000))), Verdict::Leak(_)));
    }

    #[test]
    fn no_warmup_uses_the_level_after_setup() {
        let s = Series { start: 0, after_setup: 50, warmup: vec![], measured: vec![50, 50] };
        assert_eq!(s.baseline(), 50);
        assert_eq!(decide(&s, 0, None), Verdict::Clean);
    }

    #[test]
    fn frees_of_older_memory_are_negative_and_fine() {
        let s = series(&[100], &[-500, -500, -500]);
        assert_eq!(decide(&s, 0, None), Verdict::Clean);
    }
}
