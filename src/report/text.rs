//! The human-readable report: the panic message of a failing leak test.
use crate::layer::device_name;
use super::format::{bytes, level_bytes, per_iteration_bytes, signed_bytes, thousands};
use super::{MemoryViews, Report};
use crate::verdict::{LeakRate, Phase, RetainedDuring, Verdict};
use std::fmt::{self, Write as _};
use Align::{Left, Right};

/// `[1, 2, 3, 5]` → `"1-3, 5"`.
pub(crate) fn ranges(values: &[u32]) -> String {
    let values: Vec<u64> = values.iter().map(|&v| v as u64).collect();
    crate::refs::consecutive_runs(&values)
        .into_iter()
        .map(|(first, last)| if first == last { first.to_string() } else { format!("{first}-{last}") })
        .collect::<Vec<_>>()
        .join(", ")
}

fn headline(report: &Report) -> String {
    let what = match &report.verdict {
        Verdict::Clean => "clean".to_string(),
        Verdict::OneTimeRetention { .. } => "passed with one-time retention".to_string(),
        Verdict::Plateau { .. } => "passed: plateau, not a leak".to_string(),
        Verdict::WithinThreshold { .. } => "passed: growth within the threshold".to_string(),
        Verdict::WithinAllowance { .. } => "passed: Rust-heap growth within its allowance".to_string(),
        Verdict::Leak(_) => "LEAK".to_string(),
        Verdict::Bounded { .. } => "passed: bounded, not a leak".to_string(),
        Verdict::Suppressed { .. } => "passed with a suppressed leak".to_string(),
        Verdict::PeakOverBudget { .. } => "PEAK OVER BUDGET".to_string(),
        Verdict::PeakOverBaseline { .. } => "PEAK OVER BASELINE".to_string(),
        Verdict::NoBaseline { .. } => "NO BASELINE".to_string(),
        Verdict::Panicked { .. } => "PANICKED".to_string(),
        Verdict::OutOfMemory { .. } => "OUT OF MEMORY".to_string(),
        Verdict::BodyError { .. } => "ERROR".to_string(),
        Verdict::CannotMeasure { .. } => "CANNOT MEASURE".to_string(),
        Verdict::RecordsOfKeptTensors { .. } => "passed: the records of tensors kept elsewhere".to_string(),
    };
    let location = report.context.location.as_deref().map(|l| format!(" ({l})")).unwrap_or_default();
    let body = if report.verdict_device != report.device {
        format!(" (the body ran on {})", device_name(report.device))
    } else {
        String::new()
    };
    format!("gpu-leak-test: {what} in `{}`{location} on {}{body}", report.test, place(report))
}

/// Where the verdict is: the device, and the layer where it is not the
/// device's tensors.
pub(crate) fn place(report: &Report) -> String {
    report.verdict_layer.place()
}

/// One line for a passing test (shown with --nocapture): its real verdict.
pub(crate) fn passing_line(report: &Report) -> String {
    let what = match &report.verdict {
        Verdict::Clean => "clean".to_string(),
        Verdict::OneTimeRetention { bytes: kept, during: RetainedDuring::WarmUp } => {
            format!("clean (warm-up kept {} once: one-time state, not a leak)", bytes((*kept).max(0) as u64))
        }
        Verdict::OneTimeRetention { bytes: kept, during: RetainedDuring::Iteration(i) } => {
            format!("passed: one-time retention of {} in measured iteration {i}, then flat", bytes((*kept).max(0) as u64))
        }
        Verdict::Plateau { bytes: kept, settled_at } => format!(
            "passed: plateau of {} that settled after measured iteration {settled_at} and stayed flat",
            bytes((*kept).max(0) as u64)
        ),
        Verdict::WithinThreshold { retained_bytes, bytes_per_iteration } => format!(
            "passed: grew {} ({} per iteration), within the threshold of {}",
            bytes((*retained_bytes).max(0) as u64),
            per_iteration_bytes(*bytes_per_iteration),
            bytes(report.settings.threshold_bytes)
        ),
        Verdict::WithinAllowance { bytes_per_call, allowance_bytes, .. } => format!(
            "passed: the Rust heap kept {} per call, amortised, within its allowance of {}",
            per_iteration_bytes(*bytes_per_call),
            bytes(*allowance_bytes)
        ),
        Verdict::Bounded { period: Some(p), .. } => {
            format!("passed: bounded, a sawtooth that returns to the same trough every {p} iterations")
        }
        Verdict::Bounded { period: None, .. } => {
            "passed: bounded, state replaced every iteration with a size that varies".to_string()
        }
        Verdict::Suppressed { bytes_per_iteration, .. } => format!(
            "passed: a leak of {} per iteration, all at sites suppressed in gpu-leak-test.yaml",
            per_iteration_bytes(*bytes_per_iteration)
        ),
        other => other.label().to_string(),
    };
    let others: Vec<String> = report
        .devices
        .iter()
        .filter(|d| d.layer != report.verdict_layer)
        .map(|d| format!("{} {}", d.layer, d.verdict.label()))
        .collect();
    let others = if others.is_empty() { String::new() } else { format!("; also judged: {}", others.join(", ")) };
    let baseline = report.findings.baseline.as_ref().map(|b| format!("; baseline {} ({})", b.summary(), b.file)).unwrap_or_default();
    format!(
        "gpu-leak-test: {} {what} on {} over {} measured iterations ({} scope){others}{baseline}",
        report.test,
        place(report),
        report.settings.iterations,
        report.context.scope
    )
}

/// What a window of `iterations` measured iterations cannot see, after a
/// verdict that growth stopped (see `verdict::confirmation_bound`).
fn horizon(iterations: u32, out: &mut String) {
    let _ = writeln!(
        out,
        "  A leak recurring less often than every {iterations} iterations would not be seen in this window; raise \
         `iterations` to look further."
    );
}

/// What the verdict means, in a sentence or two.
fn verdict_lines(report: &Report, out: &mut String) {
    let s = &report.settings;
    match &report.verdict {
        Verdict::Clean => {
            let _ = writeln!(
                out,
                "  Nothing retained over {} measured iterations (threshold {}).",
                s.iterations,
                bytes(s.threshold_bytes)
            );
        }
        Verdict::OneTimeRetention { bytes: kept, during } => {
            let when = match during {
                RetainedDuring::WarmUp => "during warm-up".to_string(),
                RetainedDuring::Iteration(i) => format!("once, in measured iteration {i}, then stayed flat"),
            };
            let _ = writeln!(out, "  Retained {} {when}: one-time state, reported, not failed.", bytes(*kept as u64));
            if let RetainedDuring::Iteration(_) = during {
                horizon(s.iterations, out);
            }
        }
        Verdict::Leak(leak) => leak_lines(report, leak, out),
        Verdict::RecordsOfKeptTensors { retained_bytes, bytes_per_iteration } => {
            let _ = writeln!(
                out,
                "  libtorch's host objects grew {} ({} per iteration): no more than the records (TensorImpl, \
                 StorageImpl, handle) of the tensors kept by the leak beside it, so part of that leak, not a \
                 second cause.",
                bytes((*retained_bytes).max(0) as u64),
                per_iteration_bytes(*bytes_per_iteration)
            );
        }
        Verdict::Plateau { .. }
        | Verdict::WithinThreshold { .. }
        | Verdict::WithinAllowance { .. }
        | Verdict::Bounded { .. }
        | Verdict::Suppressed { .. } => passing_growth_lines(report, out),
        Verdict::PeakOverBudget { .. } | Verdict::PeakOverBaseline { .. } | Verdict::NoBaseline { .. } => {
            peak_lines(report, out)
        }
        Verdict::Panicked { phase, iteration, message }
        | Verdict::OutOfMemory { phase, iteration, message }
        | Verdict::BodyError { phase, iteration, message } => {
            let at = if *phase == Phase::Setup { "in setup".to_string() } else { format!("in {phase} iteration {iteration}") };
            let what = match &report.verdict {
                Verdict::Panicked { .. } => "The test body panicked",
                Verdict::OutOfMemory { .. } => "The device ran out of memory",
                _ => "The test body returned an error",
            };
            let _ = writeln!(out, "  {what} {at}:");
            for line in without_cpp_frames(message).lines() {
                let _ = writeln!(out, "    | {line}");
            }
        }
        Verdict::CannotMeasure { layer, source, reason } => {
            let _ = writeln!(
                out,
                "  No verdict could be backed: {source} cannot judge {layer} on {} here. It is a failure, not a pass:",
                place(report)
            );
            let _ = writeln!(out, "  {reason}.");
        }
    }
}

/// Growth that passes: a plateau, under the threshold, bounded, or
/// suppressed.
fn passing_growth_lines(report: &Report, out: &mut String) {
    let s = &report.settings;
    match &report.verdict {
        Verdict::Plateau { bytes: kept, settled_at } => {
            let _ = writeln!(
                out,
                "  Grew by {} up to measured iteration {settled_at}, then stayed flat for at least {} iterations: \
                 a plateau (a cache that filled), reported, not failed.",
                bytes((*kept).max(0) as u64),
                s.iterations
            );
            horizon(s.iterations, out);
        }
        Verdict::WithinThreshold { retained_bytes, bytes_per_iteration } => {
            let _ = writeln!(
                out,
                "  Grew {} ({} per iteration), at or under the threshold of {}.",
                bytes((*retained_bytes).max(0) as u64),
                per_iteration_bytes(*bytes_per_iteration),
                bytes(s.threshold_bytes)
            );
        }
        Verdict::WithinAllowance { retained_bytes, bytes_per_call, allowance_bytes } => {
            let _ = writeln!(
                out,
                "  The Rust heap grew {}, which is {} per call of the body amortised over the run: at or under its \
                 allowance of {} per call, what a log of numbers or a Vec doubling its capacity keeps.",
                bytes((*retained_bytes).max(0) as u64),
                per_iteration_bytes(*bytes_per_call),
                bytes(*allowance_bytes)
            );
        }
        Verdict::Bounded { retained_bytes, period } => {
            let _ = match period {
                Some(p) => writeln!(
                    out,
                    "  Live bytes rise and fall back to the same trough every {p} iterations: periodic release, \
                     bounded, not a leak (ended {} above the baseline).",
                    bytes((*retained_bytes).max(0) as u64)
                ),
                None => writeln!(
                    out,
                    "  Live bytes ended {} higher, but everything still alive was allocated in the latest iteration \
                     and no site grew in every iteration: state replaced each iteration, not piling up.",
                    bytes((*retained_bytes).max(0) as u64)
                ),
            };
        }
        Verdict::Suppressed { retained_bytes, bytes_per_iteration } => {
            let _ = writeln!(
                out,
                "  {} retained over {} measured iterations ({} per iteration), all at sites suppressed in gpu-leak-test.yaml.",
                bytes((*retained_bytes).max(0) as u64),
                s.iterations,
                per_iteration_bytes(*bytes_per_iteration)
            );
        }
        _ => {}
    }
}

/// A peak over its budget or its baseline, or a baseline that cannot be
/// used.
fn peak_lines(report: &Report, out: &mut String) {
    match &report.verdict {
        Verdict::PeakOverBudget { peak_bytes, budget_bytes } => {
            let _ = writeln!(
                out,
                "  Live bytes peaked at {}, over the peak_mb budget of {} by {}.",
                bytes(*peak_bytes as u64),
                bytes(*budget_bytes),
                bytes((*peak_bytes as u64).saturating_sub(*budget_bytes))
            );
        }
        Verdict::PeakOverBaseline { figure, baseline_bytes, measured_bytes, tolerance_pct } => {
            let change = crate::baseline::FigureChange {
                device: report.verdict_layer.name(),
                figure: figure.clone(),
                baseline_bytes: *baseline_bytes,
                measured_bytes: *measured_bytes,
            };
            let _ = writeln!(
                out,
                "  On {}, {} rose to {}, over its baseline of {} by {}{}: more than the {tolerance_pct}% tolerance.",
                change.device,
                crate::baseline::Figures::describe(figure),
                bytes((*measured_bytes).max(0) as u64),
                bytes((*baseline_bytes).max(0) as u64),
                bytes(change.difference().max(0) as u64),
                change.percent().map(|p| format!(" ({p:+.1}%)")).unwrap_or_default(),
            );
            let file = report.findings.baseline.as_ref().map_or("the baseline", |b| b.file.as_str());
            let _ = writeln!(
                out,
                "  If the rise is meant, accept it: `{}`, then review and commit {file}.",
                crate::baseline::update_command(&report.test)
            );
        }
        Verdict::NoBaseline { file, reason } => {
            let _ = writeln!(out, "  The memory baseline {file} cannot be used: {reason}.");
        }
        _ => {}
    }
}

/// A leak: how much, over how many iterations, its pattern, and which
/// layer it is in.
fn leak_lines(report: &Report, leak: &crate::verdict::Leak, out: &mut String) {
    let s = &report.settings;
    let measured = leak.iterations.min(s.iterations);
    let confirmation = leak.iterations.saturating_sub(s.iterations);
    let window = if confirmation > 0 {
        format!("{measured} measured and {confirmation} confirmation iterations")
    } else {
        format!("{measured} measured iterations")
    };
    let _ = writeln!(
        out,
        "  {} retained over {window}: {} per iteration (threshold {} over {} measured iterations).",
        bytes(leak.retained_bytes.max(0) as u64),
        per_iteration_bytes(leak.bytes_per_iteration),
        bytes(s.threshold_bytes),
        s.iterations
    );
    let _ = writeln!(
        out,
        "  Live bytes reached a new high after iteration{} {} (measured{}).",
        if leak.growing_iterations.len() == 1 { "" } else { "s" },
        ranges(&leak.growing_iterations),
        if confirmation > 0 { format!(" 1-{measured}, confirmation {}-{}", measured + 1, leak.iterations) } else { String::new() }
    );
    let every = |period: u32| if period == 1 { "every iteration".to_string() } else { format!("every {period} iterations") };
    match (leak.drift, leak.rate) {
        (Some((period, grown)), _) => {
            let _ = writeln!(out, "  It grew by exactly {} {}, to the end of the window.", bytes(grown.max(0) as u64), every(period));
        }
        (None, LeakRate::LatestSteps { period, bytes: grown, steps }) => {
            let _ = writeln!(
                out,
                "  It grew by exactly {} {} over the last {steps} iterations; the growth before them was a one-off, \
                 in what was retained but not in the rate.",
                bytes(grown.max(0) as u64),
                every(period)
            );
        }
        _ => {
            let _ = writeln!(out, "  The growth follows no exact pattern: the rate is what was retained over the iterations.");
        }
    }
    if let Some(what_grew) = report.verdict_layer.what_grew() {
        let _ = writeln!(out, "  {what_grew}");
    }
}

/// libtorch's error messages end with a list of C++ frames; the first lines
/// say what happened. tch's panics quote the message with `{:?}`, so the
/// line breaks may be escaped.
fn without_cpp_frames(message: &str) -> &str {
    let markers = ["\nException raised from", "\nframe #0", "\\nException raised from", "\\nframe #0"];
    let end = markers.iter().filter_map(|m| message.find(m)).min();
    message[..end.unwrap_or(message.len())].trim_end()
}

/// How many sites get their stack printed.
const STACKS_SHOWN: usize = 3;

fn attribution_lines(report: &Report, out: &mut String) {
    let Some(attribution) = &report.findings.attribution else { return };
    let last = attribution.iterations;
    let _ = writeln!(
        out,
        "\n  Where it was allocated: what survived {} more iteration{} run with stack capture, by the first frame in your code:",
        attribution.iterations,
        if attribution.iterations == 1 { "" } else { "s" }
    );
    if attribution.sites.is_empty() {
        let _ = writeln!(
            out,
            "    nothing allocated during those iterations survived them on {}; the retained memory was \
             allocated on a thread without the hook or frees happened elsewhere",
            device_name(report.device)
        );
        return;
    }
    let mut table = vec![["bytes", "allocs", "per iteration", "iterations", "site"].map(String::from)];
    for site in attribution.sites.iter().take(8) {
        let mut note = match &site.suppressed_by {
            Some(reason) => format!("  (suppressed: {reason})"),
            None if site.only_last_iteration(last) => "  (last iteration only: replaced each time, not piling up)".into(),
            None => String::new(),
        };
        if let Some(label) = site.layer.site_label() {
            note.insert_str(0, &format!("  [{label}]"));
        }
        table.push([
            bytes(site.survivors.bytes),
            thousands(site.survivors.allocations as u64),
            per_iteration_bytes(site.survivors.bytes_per_iteration),
            ranges(&site.survivors.iterations),
            format!("{}{note}", site.description),
        ]);
    }
    write_table(out, [Right, Right, Right, Left, Left], &table);
    if attribution.sites.len() > 8 {
        let _ = writeln!(out, "    … and {} smaller sites", attribution.sites.len() - 8);
    }
    // Stacks of the top sites, not only the biggest: a leak often has a
    // small site that matters next to a big one.
    for (rank, top) in attribution.sites.iter().take(STACKS_SHOWN).enumerate() {
        let which = if rank == 0 { "the biggest site".to_string() } else { format!("site {}", rank + 1) };
        let _ = writeln!(out, "\n  Stack of {which}, {} (innermost first):", top.location.as_deref().unwrap_or("no frame of yours"));
        for frame in &top.stack {
            match frame.location() {
                Some(location) => {
                    let _ = writeln!(out, "    {}  at {location}", frame.function);
                }
                None => {
                    let _ = writeln!(out, "    {}", frame.function);
                }
            }
        }
    }
}

/// Each figure beside its baseline, with the change; the figures that
/// failed marked.
fn baseline_lines(report: &Report, out: &mut String) {
    let Some(outcome) = &report.findings.baseline else { return };
    let _ = writeln!(
        out,
        "\n  Memory baseline {} ({}, libtorch {}, tolerance {}%): {}.",
        outcome.file,
        outcome.device_kind,
        outcome.libtorch,
        outcome.tolerance_pct,
        outcome.status.label()
    );
    let mut table = vec![["device", "figure", "baseline", "this run", "change"].map(String::from)];
    for row in outcome.rows() {
        let change = row.change().map_or(String::new(), |c| {
            let percent = c.percent().map(|p| format!(" ({p:+.1}%)")).unwrap_or_default();
            format!("{}{percent}", signed_bytes(c.difference()))
        });
        table.push([
            row.device.to_string(),
            crate::baseline::Figures::short_name(row.figure).to_string(),
            row.baseline.map(|w| bytes(w.max(0) as u64)).unwrap_or_else(|| "-".into()),
            bytes(row.measured.max(0) as u64),
            format!("{change}{}", if row.over { "  OVER" } else { "" }),
        ]);
    }
    write_table(out, [Left, Left, Right, Right, Left], &table);
    if outcome.status == crate::baseline::BaselineStatus::Within && !outcome.lower.is_empty() {
        let _ = writeln!(
            out,
            "    Some figures dropped: the baseline can be lowered with `{}`.",
            crate::baseline::update_command(&report.test)
        );
    }
}

/// Where a peak over its baseline is reached: what was alive at the peak
/// of each attribution iteration, by site.
fn peak_site_lines(report: &Report, out: &mut String) {
    let Some(sites) = &report.findings.peak_sites else { return };
    let n = sites.iterations;
    let _ = writeln!(
        out,
        "\n  Where the peak is reached: what was alive at the peak of each of {n} more iteration{} run with stack capture \
         (allocated in that iteration), by the first frame in your code:",
        if n == 1 { "" } else { "s" }
    );
    if sites.sites.is_empty() {
        let _ = writeln!(out, "    no allocation with a stack was alive at the peak: its source names no sites here");
        return;
    }
    let mut table = vec![["at the peak", "allocs", "site"].map(String::from)];
    for site in sites.sites.iter().take(8) {
        table.push([
            bytes(site.survivors.bytes_per_iteration.round() as u64),
            thousands((site.survivors.allocations as u64).div_ceil(u64::from(n.max(1)))),
            site.description.clone(),
        ]);
    }
    write_table(out, [Right, Right, Left], &table);
    if sites.sites.len() > 8 {
        let _ = writeln!(out, "    … and {} smaller sites", sites.sites.len() - 8);
    }
}

fn references_lines(report: &Report, out: &mut String) {
    if report.findings.references.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n  Retained tensors, by the part of your state that holds them:");
    for r in &report.findings.references {
        let shape: Vec<String> = r.shape.iter().map(|d| d.to_string()).collect();
        let also = if r.also_held_by.is_empty() {
            String::new()
        } else {
            format!(" (also {}, the same storage, counted once)", r.also_held_by.join(", "))
        };
        let _ = writeln!(
            out,
            "    retained {} tensor{} [{}] {} {} ({}) referenced from {}{also}{}",
            thousands(r.tensors as u64),
            if r.tensors == 1 { "" } else { "s" },
            shape.join(", "),
            dtype_name(&r.dtype),
            device_name(r.device),
            bytes(r.bytes),
            r.held_by,
            r.allocated_at.as_deref().map(|a| format!(", allocated at {a}")).unwrap_or_default()
        );
        if let Some(graph) = r.graph.as_ref().filter(|g| g.bytes > 0) {
            let sites: Vec<String> = graph.sites.iter().take(3).map(|(site, b)| format!("{} at {site}", bytes(*b))).collect();
            let others = if graph.shared_with.is_empty() {
                String::new()
            } else {
                format!(" (or the graphs of {})", graph.shared_with.join(", "))
            };
            let _ = writeln!(
                out,
                "      {} requires grad; its autograd graph{others} keeps {} allocated elsewhere alive: {}; `detach()` it \
                 or compute it under `tch::no_grad` if you keep it",
                r.held_by,
                bytes(graph.bytes),
                sites.join(", ")
            );
        }
    }
}

/// tch's kind names, as PyTorch users read them.
fn dtype_name(kind: &str) -> &str {
    match kind {
        "Float" => "f32",
        "Double" => "f64",
        "Half" => "f16",
        "BFloat16" => "bf16",
        "Int" => "i32",
        "Int64" => "i64",
        "Int16" => "i16",
        "Int8" => "i8",
        "Uint8" => "u8",
        "Bool" => "bool",
        other => other,
    }
}

fn views_table(report: &Report, out: &mut String) {
    let (Some(before), Some(after)) = (&report.figures.before, &report.figures.after) else { return };
    let _ = writeln!(
        out,
        "\n  Memory on {} (before = after warm-up, after = after the measured iterations):",
        device_name(report.device)
    );
    views_rows(before, after, out);
    if before.allocated_bytes.is_none() {
        let _ = writeln!(out, "    (on the CPU libtorch keeps no allocator statistics; the hook is the only view)");
    }
}

/// The before/after rows under a header.
fn views_rows(before: &MemoryViews, after: &MemoryViews, out: &mut String) {
    let mut table = vec![["", "before", "after", "change"].map(String::from)];
    for (name, b, a) in MemoryViews::rows(before, after) {
        table.push([name.to_owned(), level_bytes(b), level_bytes(a), signed_bytes(a - b)]);
    }
    write_table(out, [Left, Right, Right, Right], &table);
}

/// How a column of a text table lines up.
#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// A table's rows, indented by four spaces, columns two spaces apart and
/// each as wide as its widest cell, so that no figure (a count in GiB, a
/// long label) pushes its row out of line. Trailing spaces are cut, so a
/// left-aligned last column (a site, a note) runs free.
fn write_table<const N: usize>(out: &mut String, align: [Align; N], rows: &[[String; N]]) {
    let widths: [usize; N] = std::array::from_fn(|c| rows.iter().map(|row| row[c].chars().count()).max().unwrap_or(0));
    for row in rows {
        let mut line = String::from("  ");
        for ((cell, width), align) in row.iter().zip(widths).zip(align) {
            let _ = match align {
                Left => write!(line, "  {cell:<width$}"),
                Right => write!(line, "  {cell:>width$}"),
            };
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// Changes shown per phase at most: the first and last half of this many.
const SHOWN_CHANGES: usize = 120;

fn series_line(report: &Report, out: &mut String) {
    let samples = &report.samples;
    if samples.is_empty() {
        return;
    }
    let mut line = String::from("\n  Live bytes after each iteration (exact, in the verdict's layer; change from the one before, ×N: N times in a row):");
    if let Some(thinned) = &report.figures.thinned {
        let full = report
            .files
            .as_ref()
            .map(|files| format!("{}.series.csv", files.json.display().to_string().trim_end_matches(".json")))
            .or_else(|| thinned.full_series.clone())
            .unwrap_or_else(|| "the report's .series.csv file".into());
        let _ = write!(
            line,
            "\n    ({} of {} samples shown, the first and last in full; every sample: {full})",
            thousands(samples.len() as u64),
            thousands(thinned.samples_taken as u64)
        );
    }
    let mut previous: Option<i64> = None;
    let mut i = 0;
    while i < samples.len() {
        let phase = samples[i].phase;
        let _ = write!(line, "\n    {:<13}", format!("{phase}:"));
        // This phase's changes, exactly equal ones in a row as one entry.
        let mut runs: Vec<(Option<i64>, String, usize)> = Vec::new();
        while i < samples.len() && samples[i].phase == phase {
            let value = samples[i].live_bytes;
            let change = previous.map(|p| value - p);
            let entry = match change {
                None => signed_bytes(value),
                Some(0) => "0".to_string(),
                Some(delta) => compact(delta),
            };
            match runs.last_mut() {
                Some((last, _, count)) if change.is_some() && *last == change => *count += 1,
                _ => runs.push((change, entry, 1)),
            }
            previous = Some(value);
            i += 1;
        }
        let shown = |out: &mut String, runs: &[(Option<i64>, String, usize)]| {
            for (_, entry, count) in runs {
                let _ = if *count > 1 { write!(out, " {entry} ×{}", thousands(*count as u64)) } else { write!(out, " {entry}") };
            }
        };
        if runs.len() > SHOWN_CHANGES {
            shown(&mut line, &runs[..SHOWN_CHANGES / 2]);
            let _ = write!(line, " … {} more …", thousands((runs.len() - SHOWN_CHANGES) as u64));
            shown(&mut line, &runs[runs.len() - SHOWN_CHANGES / 2..]);
        } else {
            shown(&mut line, &runs);
        }
    }
    out.push_str(&line);
    out.push('\n');
}

/// A signed byte count without the exact figure, for dense rows.
fn compact(value: i64) -> String {
    let sign = if value < 0 { "-" } else { "+" };
    let v = value.unsigned_abs();
    match v {
        v if v >= 1 << 30 => format!("{sign}{:.1}GiB", v as f64 / (1u64 << 30) as f64),
        v if v >= 1 << 20 => format!("{sign}{:.1}MiB", v as f64 / (1u64 << 20) as f64),
        v if v >= 1 << 10 => format!("{sign}{:.1}KiB", v as f64 / 1024.0),
        v => format!("{sign}{v}B"),
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        let _ = writeln!(out, "{}", headline(self));
        verdict_lines(self, &mut out);
        references_lines(self, &mut out);
        attribution_lines(self, &mut out);
        baseline_lines(self, &mut out);
        peak_site_lines(self, &mut out);
        views_table(self, &mut out);
        series_line(self, &mut out);
        if self.figures.setup_bytes != 0 || self.figures.warmup_retained_bytes != 0 || self.figures.peak_bytes.is_some_and(|p| p != 0) {
            let peak = self.figures.peak_bytes.map(|p| format!(" Peak live: {}.", bytes(p.max(0) as u64))).unwrap_or_default();
            let _ = writeln!(
                out,
                "  In {}: setup holds {}; warm-up kept {} (one-time state, not counted).{peak}",
                self.verdict_layer.plain_name(),
                signed_bytes(self.figures.setup_bytes),
                signed_bytes(self.figures.warmup_retained_bytes),
            );
        }
        if self.devices.len() > 1 {
            let (measured, confirmation) = self.window();
            let window = if confirmation > 0 {
                format!("{measured} measured and {confirmation} confirmation iterations")
            } else {
                format!("{measured} measured iterations")
            };
            let _ = writeln!(out, "\n  Judged per layer ({} scope), growth over the {window}:", self.context.scope);
            let rows: Vec<[String; 4]> = self
                .devices
                .iter()
                .map(|d| {
                    [
                        d.layer.name().to_string(),
                        d.verdict.label().to_string(),
                        signed_bytes(d.retained_growth_bytes),
                        format!(
                            "counted by {}{}",
                            d.source,
                            if d.layer == self.verdict_layer { "  <- this verdict" } else { "" }
                        ),
                    ]
                })
                .collect();
            write_table(&mut out, [Left, Left, Right, Left], &rows);
        } else if let Some(d) = self.devices.first() {
            let _ = writeln!(out, "\n  Counted on {} by {} ({} scope).", d.layer, d.source, self.context.scope);
        }
        for note in &self.findings.notes {
            let _ = writeln!(out, "\n  Note: {note}");
        }
        for hint in &self.findings.hints {
            let _ = writeln!(out, "\n  Hint: {hint}");
        }
        if let Some(files) = &self.files {
            let plot = files.plot.as_ref().map(|p| format!("\n  Plot: {}", p.display())).unwrap_or_default();
            let _ = write!(
                out,
                "\n  Page: {}\n  Report: {}{plot}\n  All tests: {}\n",
                files.page.display(),
                files.json.display(),
                files.index.display()
            );
        }
        let s = &self.settings;
        let _ = writeln!(
            out,
            "\n  {} ({:.0} allocator events each), threshold {}{}, in {:.2?}. \
             Change them with the attribute or GPU_LEAK_TEST_WARMUP / _ITERATIONS / _THRESHOLD_MB.",
            self.iterations_run(),
            self.figures.events_per_iteration,
            bytes(s.threshold_bytes),
            s.peak_budget_bytes.map(|p| format!(", peak budget {}", bytes(p))).unwrap_or_default(),
            self.context.elapsed
        );
        f.write_str(out.trim_end())
    }
}

impl Report {
    /// The iterations that ran, from the samples: fewer than asked for
    /// where a failure stopped the test early.
    fn iterations_run(&self) -> String {
        let s = &self.settings;
        if let Some((phase, iteration, _)) = self.verdict.body_failure() {
            let at = if phase == Phase::Setup { "in setup".to_string() } else { format!("in {phase} iteration {iteration}") };
            return format!("Stopped {at}, of {} warm-up + {} measured iterations asked for", s.warmup, s.iterations);
        }
        let count = |phase: Phase| self.samples.iter().filter(|sample| sample.phase == phase).count() as u32;
        let (warmup, measured, confirmation) = (count(Phase::WarmUp), count(Phase::Measure), count(Phase::Confirm));
        if warmup < s.warmup || measured < s.iterations {
            return format!("Stopped after {warmup} of {} warm-up and {measured} of {} measured iterations", s.warmup, s.iterations);
        }
        let confirmed = match confirmation {
            0 => String::new(),
            n => format!(" + {n} confirmation"),
        };
        format!("Ran {warmup} warm-up + {measured} measured{confirmed} iterations")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtorch_frames_are_cut_from_messages() {
        let message = "CUDA out of memory. Tried to allocate 2.00 GiB.\nException raised from malloc at x.cpp:1\nframe #0: c10::Error";
        assert_eq!(without_cpp_frames(message), "CUDA out of memory. Tried to allocate 2.00 GiB.");
        assert_eq!(without_cpp_frames("plain"), "plain");
        let quoted = r#"Torch("CUDA out of memory.\nException raised from malloc\nframe #0: x")"#;
        assert_eq!(without_cpp_frames(quoted), r#"Torch("CUDA out of memory."#);
    }

    #[test]
    fn every_row_of_the_memory_table_lines_up_with_its_header() {
        // Figures of every width: bytes, KiB, and GiB with a ten-digit count.
        let views = |live: i64, driver: u64| MemoryViews {
            live_bytes: live,
            allocated_bytes: Some(76_167_168),
            reserved_bytes: Some(90_177_536),
            driver_used_bytes: Some(driver),
            driver_process_bytes: Some(878_706_688),
            host_heap_bytes: Some(321_667_424),
            ..MemoryViews::default()
        };
        let mut out = String::new();
        views_rows(&views(0, 3_378_708_480), &views(5_120, 4_518_510_592), &mut out);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 7, "{out}");
        // Labels are padded on the right and figures on the left, so a row
        // lines up with the header when its length and its label's start
        // are the header's.
        for line in &lines[1..] {
            assert_eq!(line.chars().count(), lines[0].chars().count(), "{out}");
            assert!(line.starts_with("    ") && !line[4..].starts_with(' '), "{out}");
        }
    }

    #[test]
    fn a_tables_figures_line_up_and_its_free_text_runs_without_trailing_spaces() {
        let rows = [
            ["bytes", "allocs", "site"].map(String::from),
            ["72.64 MiB (76,167,168 B)", "1,203", "tests/a.rs:1 in a::f  [host objects]"].map(String::from),
            ["648 B", "3", "tests/a.rs:2 in a::g"].map(String::from),
        ];
        let mut out = String::new();
        write_table(&mut out, [Right, Right, Left], &rows);
        let expected = [
            "                       bytes  allocs  site",
            "    72.64 MiB (76,167,168 B)   1,203  tests/a.rs:1 in a::f  [host objects]",
            "                       648 B       3  tests/a.rs:2 in a::g",
        ];
        assert_eq!(out.lines().collect::<Vec<_>>(), expected, "{out}");
    }

    #[test]
    fn iteration_ranges() {
        assert_eq!(ranges(&[1, 2, 3, 5, 7, 8]), "1-3, 5, 7-8");
        assert_eq!(ranges(&[4]), "4");
        assert_eq!(ranges(&[]), "");
    }
}
