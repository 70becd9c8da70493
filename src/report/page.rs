//! The page of one test (`<test>.html`): readable without opening the JSON.
//! The verdict and the settings, the three memory views, the timeline, the
//! retained bytes stacked by allocation site over the attribution
//! iterations (so you see which line grows), a marker where the body
//! failed, the sites with expandable stacks, and the retained tensors.
use crate::layer::device_name;
use super::format::{escape_markup as escape, level_bytes, per_iteration_bytes};
use super::{bytes, signed_bytes, svg, MemoryViews, Report};
use crate::verdict::Verdict;
use std::fmt::Write;

/// Colours of the stacked site series, in site order.
const SITE_COLORS: [&str; 8] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/// The page's HTML. `plot` is the timeline's file name, where one was
/// written beside it.
pub fn render(report: &Report) -> String {
    let mut html = String::new();
    let status = if report.passed() { "pass" } else if report.context.expected_failure { "expected" } else { "fail" };
    let _ = write!(
        html,
        "<!doctype html>\n<meta charset=\"utf-8\">\n<title>{test} - gpu-leak-test</title>\n<style>\
         body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}\
         td,th{{padding:3px 10px;border-bottom:1px solid #ddd;text-align:left;vertical-align:top}}#devices td:nth-child(n+4){{white-space:nowrap}}\
         .fail{{color:#b00020}}.pass{{color:#1b7e2a}}.expected{{color:#7a5c00}}pre{{background:#f6f6f6;padding:8px;overflow-x:auto}}\
         .marker{{color:#b00020;font-weight:bold}}</style>\n\
         <p><a href=\"index.html\">all tests</a></p>\n<h1>{test}</h1>\n\
         <p id=\"verdict\" class=\"{status}\"><b>{verdict}</b> on {device} ({scope} scope){body}{location}</p>\n",
        test = escape(&report.test),
        verdict = escape(&report.verdict.label().replace('_', " ")),
        device = escape(&super::text::place(report)),
        scope = escape(&report.context.scope),
        body = if report.verdict_device != report.device {
            format!("; the body ran on {}", escape(&device_name(report.device)))
        } else {
            String::new()
        },
        location = report.context.location.as_deref().map(|l| format!(" &middot; {}", escape(l))).unwrap_or_default(),
    );
    settings_and_devices(report, &mut html);
    views(report, &mut html);
    failure_marker(report, &mut html);
    let _ = write!(html, "<h2>Timeline</h2>\n<figure id=\"timeline\">{}</figure>\n", svg::timeline(report));
    if let Some(attribution) = &report.findings.attribution {
        stacked_by_site(attribution, &RETAINED_CHART, &mut html);
    }
    baseline(report, &mut html);
    if let Some(peak_sites) = &report.findings.peak_sites {
        stacked_by_site(peak_sites, &PEAK_CHART, &mut html);
    }
    sites(report, &mut html);
    references(report, &mut html);
    for note in report.findings.hints.iter().chain(&report.findings.notes) {
        let _ = writeln!(html, "<p class=\"hint\">{}</p>", escape(note));
    }
    html
}

fn settings_and_devices(report: &Report, html: &mut String) {
    let s = &report.settings;
    let _ = write!(
        html,
        "<h2>Settings</h2>\n<table id=\"settings\"><tr><th>warm-up</th><td>{}</td></tr><tr><th>measured</th><td>{}</td></tr>\
         <tr><th>threshold</th><td>{}</td></tr><tr><th>peak budget</th><td>{}</td></tr><tr><th>attribution</th><td>{}</td></tr></table>\n\
         <h2>Layers judged</h2>\n<p>{window}</p>\n<table id=\"devices\"><tr><th>layer</th><th>what it is</th><th>verdict</th><th>growth</th><th>per iteration</th><th>peak</th></tr>\n",
        s.warmup,
        s.iterations,
        bytes(s.threshold_bytes),
        s.peak_budget_bytes.map(bytes).unwrap_or_else(|| "none".into()),
        s.attribution_iterations,
        window = escape(&window_words(report)),
    );
    for d in &report.devices {
        let rate = match &d.verdict {
            Verdict::Leak(leak) => format!("{}{}", per_iteration_bytes(leak.bytes_per_iteration), rate_words(leak.rate)),
            Verdict::Suppressed { bytes_per_iteration, .. } | Verdict::WithinThreshold { bytes_per_iteration, .. } => {
                per_iteration_bytes(*bytes_per_iteration)
            }
            _ => String::new(),
        };
        let mark = if d.layer == report.verdict_layer { " (this verdict)" } else { "" };
        let _ = writeln!(
            html,
            "<tr><td>{}{mark}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&d.layer.name()),
            escape(d.layer.description()),
            escape(&d.verdict.label().replace('_', " ")),
            signed_bytes(d.retained_growth_bytes),
            escape(&rate),
            d.peak_bytes.map(|p| bytes(p.max(0) as u64)).unwrap_or_else(|| "– (counted by level)".into()),
        );
    }
    html.push_str("</table>\n");
}

/// The iterations every growth figure is over.
fn window_words(report: &Report) -> String {
    let (measured, confirmation) = report.window();
    let thinned = report
        .figures.thinned
        .as_ref()
        .map(|t| format!(" The timeline shows {} of {} samples; every sample is in {}.", report.samples.len(), t.samples_taken, t.full_series.as_deref().unwrap_or("the report's .series.csv file")))
        .unwrap_or_default();
    format!("Growth is over the judged window: {measured} measured and {confirmation} confirmation iterations.{thinned}")
}

/// How a leak's rate was found, for a table cell.
fn rate_words(rate: crate::verdict::LeakRate) -> String {
    match rate {
        crate::verdict::LeakRate::ExactPattern => " (exact)".into(),
        crate::verdict::LeakRate::LatestSteps { steps, .. } => format!(" (exact over the last {steps} iterations, after a one-off rise)"),
        _ => " (average: no exact step)".into(),
    }
}

fn views(report: &Report, html: &mut String) {
    let (Some(before), Some(after)) = (&report.figures.before, &report.figures.after) else { return };
    let _ = writeln!(
        html,
        "<h2>Memory on {}</h2>\n<table id=\"views\"><tr><th></th><th>before</th><th>after</th><th>change</th></tr>",
        escape(&device_name(report.device))
    );
    for (name, b, a) in MemoryViews::rows(before, after) {
        let _ = writeln!(html, "<tr><th>{name}</th><td>{}</td><td>{}</td><td>{}</td></tr>", level_bytes(b), level_bytes(a), signed_bytes(a - b));
    }
    html.push_str("</table>\n");
}

fn failure_marker(report: &Report, html: &mut String) {
    let failures = [Some(&report.verdict), report.findings.attribution_failure.as_ref()];
    for failure in failures.into_iter().flatten() {
        if let Some((phase, iteration, message)) = failure.body_failure() {
            let _ = writeln!(
                html,
                "<p class=\"marker\" id=\"failure\">&#9888; {} in {phase} iteration {iteration}</p>\n<pre>{}</pre>",
                escape(&failure.label().replace('_', " ")),
                escape(message)
            );
        }
    }
}

/// What one chart of bytes stacked by site shows.
struct SiteChart {
    id: &'static str,
    title: &'static str,
    /// Says what each band is; `{n}` is the number of iterations.
    caption: &'static str,
    /// Whether a site's bytes add up over the iterations (survivors pile
    /// up) or stand for each iteration alone (what is alive at its peak).
    cumulative: bool,
}

/// Retained bytes at the end of each attribution iteration: a site that
/// leaks is a band that widens every iteration.
const RETAINED_CHART: SiteChart = SiteChart {
    id: "by-site",
    title: "Retained bytes by allocation site",
    caption: "After each of the {n} attribution iterations, what each site's survivors hold; a site that leaks widens every iteration.",
    cumulative: true,
};

/// What each site holds at the peak of each attribution iteration: where a
/// peak over its baseline is reached.
const PEAK_CHART: SiteChart = SiteChart {
    id: "peak-by-site",
    title: "Bytes alive at the peak, by allocation site",
    caption: "At the peak of each of the {n} attribution iterations, what each site had allocated in it and still held: where the peak is reached.",
    cumulative: false,
};

/// Bytes of each site after each attribution iteration, stacked.
fn stacked_by_site(attribution: &crate::attribution::Attribution, chart: &SiteChart, html: &mut String) {
    let sites: Vec<_> = attribution.sites.iter().filter(|s| !s.survivors.bytes_by_iteration.is_empty()).take(SITE_COLORS.len()).collect();
    if sites.is_empty() {
        return;
    }
    let n = attribution.iterations.max(1) as usize;
    // Each site's bytes after each iteration, summed over the iterations
    // so far where they pile up.
    let cumulative: Vec<Vec<f64>> = sites
        .iter()
        .map(|s| {
            (0..n).scan(0.0, |sum, i| {
                let bytes = s.survivors.bytes_by_iteration.get(i).copied().unwrap_or(0) as f64;
                *sum = if chart.cumulative { *sum + bytes } else { bytes };
                Some(*sum)
            })
            .collect()
        })
        .collect();
    let total_max = (0..n).map(|i| cumulative.iter().map(|c| c[i]).sum::<f64>()).fold(1.0, f64::max);
    let (width, height, left, bottom) = (820.0, 260.0, 70.0, 30.0);
    let x = |i: usize| left + (width - left - 20.0) * if n == 1 { 1.0 } else { i as f64 / (n - 1) as f64 };
    let y = |v: f64| (height - bottom) - (height - bottom - 20.0) * v / total_max;
    let _ = write!(
        html,
        "<h2>{}</h2>\n<p>{}</p>\n<svg id=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"4\" y=\"14\">{}</text><text x=\"4\" y=\"{:.0}\">0 B</text>\n",
        chart.title,
        escape(&chart.caption.replace("{n}", &n.to_string())),
        chart.id,
        escape(&bytes(total_max as u64)),
        height - bottom
    );
    let mut below = vec![0.0; n];
    for (k, (site, values)) in sites.iter().zip(&cumulative).enumerate() {
        let above: Vec<f64> = below.iter().zip(values).map(|(b, v)| b + v).collect();
        let mut points: Vec<String> = (0..n).map(|i| format!("{:.1},{:.1}", x(i), y(above[i]))).collect();
        points.extend((0..n).rev().map(|i| format!("{:.1},{:.1}", x(i), y(below[i]))));
        let label = site.location.as_deref().unwrap_or(&site.description);
        let _ = writeln!(
            html,
            "<polygon class=\"site-series\" data-site=\"{}\" fill=\"{}\" fill-opacity=\"0.75\" points=\"{}\"><title>{}</title></polygon>",
            escape(label),
            SITE_COLORS[k],
            points.join(" "),
            escape(label)
        );
        below = above;
    }
    for i in 0..n {
        let _ = writeln!(html, "<text x=\"{:.1}\" y=\"{:.0}\" text-anchor=\"middle\">a{}</text>", x(i), height - 10.0, i + 1);
    }
    html.push_str("</svg>\n");
}

/// Each figure beside its baseline, where the test keeps one.
fn baseline(report: &Report, html: &mut String) {
    let Some(outcome) = &report.findings.baseline else { return };
    let _ = write!(
        html,
        "<h2>Memory baseline</h2>\n<p id=\"baseline-status\">{}: <code>{}</code> ({}, libtorch {}, tolerance {}%)</p>\n\
         <table id=\"baseline\"><tr><th>device</th><th>figure</th><th>baseline</th><th>this run</th><th>change</th></tr>\n",
        escape(outcome.status.label()),
        escape(&outcome.file),
        escape(&outcome.device_kind),
        escape(&outcome.libtorch),
        outcome.tolerance_pct
    );
    for row in outcome.rows() {
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td></tr>",
            escape(row.device),
            escape(crate::baseline::Figures::describe(row.figure)),
            escape(crate::baseline::Figures::short_name(row.figure)),
            row.baseline.map(|w| escape(&bytes(w.max(0) as u64))).unwrap_or_default(),
            escape(&bytes(row.measured.max(0) as u64)),
            if row.over { "fail" } else { "" },
            row.change().map(|c| escape(&signed_bytes(c.difference()))).unwrap_or_default(),
        );
    }
    html.push_str("</table>\n");
}

fn sites(report: &Report, html: &mut String) {
    let Some(attribution) = &report.findings.attribution else { return };
    html.push_str(
        "<h2>Where it was allocated</h2>\n<table id=\"sites\"><tr><th></th><th>bytes</th><th>per iteration</th><th>iterations</th><th>layer</th><th>site</th></tr>\n",
    );
    for (k, site) in attribution.sites.iter().enumerate() {
        let color = SITE_COLORS.get(k).copied().unwrap_or("#999");
        let stack: String = site
            .stack
            .iter()
            .map(|f| match f.location() {
                Some(location) => format!("{}  at {location}\n", f.function),
                None => format!("{}\n", f.function),
            })
            .collect();
        let _ = writeln!(
            html,
            "<tr class=\"site\"><td><span style=\"color:{color}\">&#9632;</span></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}<details><summary>stack</summary><pre>{}</pre></details></td></tr>",
            bytes(site.survivors.bytes),
            per_iteration_bytes(site.survivors.bytes_per_iteration),
            site.survivors.iterations.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            escape(&site.layer.name()),
            escape(&site.description)
                + &site.suppressed_by.as_ref().map(|reason| format!(" <i>(suppressed: {})</i>", escape(reason))).unwrap_or_default(),
            escape(&stack)
        );
    }
    html.push_str("</table>\n");
}

fn references(report: &Report, html: &mut String) {
    if report.findings.references.is_empty() {
        return;
    }
    html.push_str("<h2>Retained tensors</h2>\n<table id=\"references\"><tr><th>held by</th><th>tensors</th><th>shape</th><th>bytes</th><th>allocated at</th></tr>\n");
    for r in &report.findings.references {
        let shape: Vec<String> = r.shape.iter().map(i64::to_string).collect();
        let _ = writeln!(
            html,
            "<tr><td>{}</td><td>{}</td><td>[{}] {}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.held_by),
            r.tensors,
            shape.join(", "),
            escape(&r.dtype),
            bytes(r.bytes),
            escape(r.allocated_at.as_deref().unwrap_or(""))
        );
    }
    html.push_str("</table>\n");
}
