//! The report builder: the judged layers' figures, the verdict's layer's
//! series, the findings and the notes, put together as a [`Report`]. It
//! decides nothing: the judge did. The notes' prose is `report::notes`'.
use super::execute::Executor;
use super::judge::Judge;
use super::Started;
use crate::report::{DeviceResult, Findings, MemoryViews, Report, RunContext, RunSettings, VerdictFigures};
use crate::verdict::{self, Verdict};
use std::time::Duration;

/// Each judged layer's verdict and levels, and in thread scope the growth
/// the counted threads do not explain.
fn layer_results(exec: &Executor<'_>, judge: &Judge) -> Vec<DeviceResult> {
    let samples = &exec.samples;
    judge
        .judged()
        .into_iter()
        .map(|d| {
            let layer = exec.probes.layer(d);
            let counted = samples.window_levels(d);
            let unexplained = counted
                .clone()
                .zip(samples.window_process_wide(d))
                .and_then(|(counted, global)| verdict::unexplained_growth(&counted, &global, exec.settings.iterations));
            DeviceResult {
                device: layer.device(),
                layer,
                source: exec.probes.counted[d].source_name().to_string(),
                verdict: judge.verdicts[d].clone(),
                levels: samples.levels.iter().map(|l| l[d] - samples.start[d]).collect(),
                retained_growth_bytes: counted.as_ref().map_or(0, |levels| levels[levels.len() - 1] - levels[0]),
                peak_bytes: exact_peak(exec, d),
                unexplained_bytes_per_iteration: unexplained,
            }
        })
        .collect()
}

/// Layer `d`'s peak since the test began, where its count keeps one.
fn exact_peak(exec: &Executor<'_>, d: usize) -> Option<i64> {
    exec.probes.layer(d).keeps_peak().then(|| exec.samples.test_peaks[d])
}

/// The host heap's growth per iteration, a view shown only where the
/// judged layers explain none: a graph kept by a `total += loss`, or a
/// Rust collection, grows it while every judged layer stays flat.
fn host_heap_growth(exec: &Executor<'_>, judge: &Judge) -> Option<f64> {
    let flat = |d: usize| exec.samples.window_levels(d).is_some_and(|levels| levels.iter().all(|&l| l == levels[0]));
    let judged_layers_flat = judge.judged().into_iter().all(flat);
    if !judged_layers_flat || judge.verdicts.iter().any(Verdict::is_failure) {
        return None;
    }
    let levels = exec.samples.host_heap_window()?;
    verdict::host_heap_growth(&levels, verdict::host_heap_spacing(exec.settings.iterations))
}

/// The report of a finished or stopped run.
pub(super) fn report(exec: Executor<'_>, judge: &Judge, findings: Findings, started: Started) -> Report {
    let settings = exec.settings;
    let chosen = judge.verdict_layer(findings.attribution_failure.is_some());
    let layer = exec.probes.layer(chosen);
    let series = exec.samples.series(chosen);
    let mut samples = exec.samples.samples.clone();
    for (sample, levels) in samples.iter_mut().zip(&exec.samples.levels) {
        sample.live_bytes = levels[chosen] - exec.samples.start[chosen];
    }
    // Setup's events are spread over the iterations too: an estimate.
    let events_per_iteration = exec.probes.events(exec.probes.body) as f64 / exec.samples.iterations_run();
    let mut report = Report {
        test: exec.test.name.clone(),
        device: exec.probes.device,
        verdict: judge.verdicts[chosen].clone(),
        verdict_layer: layer,
        verdict_device: layer.device(),
        settings: RunSettings {
            warmup: settings.warmup,
            iterations: settings.iterations,
            threshold_bytes: settings.threshold_bytes(),
            peak_budget_bytes: settings.peak_budget_bytes(),
            attribution_iterations: findings.attribution.as_ref().map_or(settings.attribution_iterations, |a| a.iterations),
        },
        samples,
        devices: layer_results(&exec, judge),
        context: RunContext {
            location: exec.test.location.clone(),
            crate_root: exec.test.crate_folder.as_ref().map(|root| root.display().to_string()),
            scope: exec.probes.scope.name().to_string(),
            expected_failure: exec.test.expected_failure,
            elapsed: Duration::ZERO,
            harness_time: exec.time,
        },
        figures: VerdictFigures {
            setup_bytes: series.after_setup - series.start,
            warmup_retained_bytes: if series.warmup.is_empty() { 0 } else { series.warmup_retained() },
            peak_bytes: exact_peak(&exec, chosen),
            events_per_iteration,
            host_heap_growth_per_iteration: host_heap_growth(&exec, judge),
            thinned: None,
            before: exec.samples.before.as_ref().map(MemoryViews::from_snapshot),
            after: exec.samples.after.as_ref().map(MemoryViews::from_snapshot),
        },
        findings: Findings { notes: exec.notes.iter().map(ToString::to_string).collect(), ..findings },
        files: None,
    };
    report.findings.hints = crate::report::hints::for_report(&report);
    crate::report::series::thin(&mut report);
    let context = &mut report.context;
    context.elapsed = started.elapsed();
    context.harness_time.total = context.elapsed;
    context.harness_time.cuda_startup = crate::probe::cuda::startup_time().saturating_sub(started.cuda_startup);
    report
}
