//! Keeping a report small at any iteration count. A test of 100,000
//! iterations has 100,000 samples per layer: the report keeps about
//! [`KEPT_SAMPLES`] of them (the first and last quarter in full, evenly
//! spaced ones between, and those either side of a phase's boundary), and
//! the full series goes to a CSV file beside it.
//! The verdict was decided on the full series before this runs.
use super::Report;
use std::fmt::Write as _;

/// Samples a report keeps; above this it thins them.
pub(crate) const KEPT_SAMPLES: usize = 1_000;

/// Where the samples were thinned: how many were taken, and the whole
/// series as CSV text, which the report's files write beside the JSON.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Thinned {
    /// Samples taken over the whole test; the report's `samples` keep
    /// about 1,000 of them.
    pub samples_taken: usize,
    /// The CSV file with every sample, once written (relative to the
    /// report's folder).
    pub full_series: Option<String>,
    #[serde(skip)]
    pub(crate) csv: String,
}

/// The indices kept of `n` samples: all where `n` is small; else the first
/// and last quarter of [`KEPT_SAMPLES`], evenly spaced ones between, and
/// every sample where the phase changes (so the page shades each phase).
fn kept(report: &Report) -> Vec<usize> {
    let n = report.samples.len();
    if n <= KEPT_SAMPLES {
        return (0..n).collect();
    }
    let edge = KEPT_SAMPLES / 4;
    let middle = KEPT_SAMPLES - 2 * edge;
    let stride = (n - 2 * edge).div_ceil(middle).max(1);
    let boundary = |i: usize| i > 0 && report.samples[i].phase != report.samples[i - 1].phase;
    let boundary_before = |i: usize| i + 1 < n && report.samples[i + 1].phase != report.samples[i].phase;
    (0..n).filter(|&i| i < edge || i >= n - edge || (i - edge) % stride == 0 || boundary(i) || boundary_before(i)).collect()
}

/// Thins `report`'s samples and every layer's levels alike, keeping the
/// full series as CSV for [`Thinned::csv`]. Nothing happens to a report
/// with at most [`KEPT_SAMPLES`] samples.
pub(crate) fn thin(report: &mut Report) {
    let n = report.samples.len();
    if n <= KEPT_SAMPLES {
        return;
    }
    let mut csv = String::from("sample,phase,iteration");
    for d in &report.devices {
        let _ = write!(csv, ",{}", d.layer.name());
    }
    csv.push_str(",allocator_allocated,allocator_reserved,host_heap\n");
    let cell = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    for (i, s) in report.samples.iter().enumerate() {
        let _ = write!(csv, "{i},{},{}", s.phase, s.iteration);
        for d in &report.devices {
            let _ = write!(csv, ",{}", d.levels.get(i).map(|l| l.to_string()).unwrap_or_default());
        }
        let _ = writeln!(csv, ",{},{},{}", cell(s.allocated_bytes), cell(s.reserved_bytes), cell(s.host_heap_bytes));
    }
    let keep = kept(report);
    report.samples = keep.iter().map(|&i| report.samples[i]).collect();
    for d in &mut report.devices {
        if d.levels.len() == n {
            d.levels = keep.iter().map(|&i| d.levels[i]).collect();
        }
    }
    report.figures.thinned = Some(Thinned { samples_taken: n, full_series: None, csv });
}

/// `growing_iterations` in the JSON: runs of consecutive iterations as
/// `[first, last]`, so a leak that grew every one of 100,000 iterations is
/// one pair.
pub(crate) mod runs {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub(crate) fn serialize<S: Serializer>(iterations: &[u32], serializer: S) -> Result<S::Ok, S::Error> {
        let mut runs: Vec<[u32; 2]> = Vec::new();
        for &i in iterations {
            match runs.last_mut() {
                Some(run) if run[1].checked_add(1) == Some(i) => run[1] = i,
                _ => runs.push([i, i]),
            }
        }
        runs.serialize(serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u32>, D::Error> {
        let runs: Vec<[u32; 2]> = Vec::deserialize(deserializer)?;
        Ok(runs.into_iter().flat_map(|[first, last]| first..=last).collect())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn consecutive_iterations_are_written_as_runs_and_read_back_whole() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Grew(#[serde(with = "super::runs")] Vec<u32>);
        let grew = Grew(vec![1, 2, 3, 5, 7, 8]);
        let text = serde_json::to_string(&grew).unwrap();
        assert_eq!(text, "[[1,3],[5,5],[7,8]]");
        assert_eq!(serde_json::from_str::<Grew>(&text).unwrap(), grew);
    }
}
