//! The SVG timeline of one test: after each iteration, the change from the
//! level before the first measured iteration of the exact live bytes (hook),
//! the allocator's allocated and reserved bytes, and the driver's used bytes;
//! the threshold as a line over the measured iterations; warm-up and
//! attribution shaded.
use crate::layer::device_name;
use super::format::{escape_markup as escape};
use super::Report;
use crate::verdict::Phase;
use std::fmt::Write;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 110.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 56.0;
const BOTTOM: f64 = 60.0;

/// The exact line's colour; the render test looks for it, as for the others.
pub const LIVE_COLOR: &str = "#1f4e9c";
/// The caching allocator's allocated bytes.
pub const ALLOCATED_COLOR: &str = "#e07b00";
/// The caching allocator's reserved bytes.
pub const RESERVED_COLOR: &str = "#2a9d3c";
/// The driver's used bytes.
pub const DRIVER_COLOR: &str = "#8e44ad";
/// The threshold line.
pub const THRESHOLD_COLOR: &str = "#d62728";
/// Exact lines of the other judged devices (host memory when the body ran
/// on CUDA, and the reverse).
pub const OTHER_DEVICE_COLORS: [&str; 3] = ["#17becf", "#7f7f7f", "#bcbd22"];
/// Background of the warm-up iterations.
pub const WARMUP_SHADE: &str = "#e8e8e8";
/// Background of the attribution iterations.
pub const ATTRIBUTION_SHADE: &str = "#fdf1d8";

/// A binary unit and a round step (1, 2 or 5 times a power of ten of that
/// unit) that cut `range` bytes into three to eight ticks.
fn tick_step(range: f64) -> (f64, &'static str, f64) {
    let units = [(1073741824.0, "GiB"), (1048576.0, "MiB"), (1024.0, "KiB"), (1.0, "B")];
    let (unit, name) = units.into_iter().find(|(u, _)| range / u >= 2.0).unwrap_or((1.0, "B"));
    let raw = range / unit / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * magnitude).find(|s| *s >= raw).unwrap_or(magnitude * 10.0);
    (unit, name, (step * unit).max(1.0))
}

fn tick_label(value: f64, unit: f64, name: &str) -> String {
    let v = value / unit;
    if v.abs() < 1e-9 {
        return format!("0 {name}");
    }
    let sign = if v > 0.0 { "+" } else { "" };
    if (v - v.round()).abs() < 1e-9 {
        format!("{sign}{} {name}", v.round())
    } else {
        format!("{sign}{v:.1} {name}")
    }
}

/// What a layer's exact line shows.
fn series_name(layer: crate::Layer) -> String {
    match layer {
        crate::Layer::HostObjects => "libtorch's host objects".to_string(),
        crate::Layer::Tensors(device) => format!("tensors alive on {}", device_name(device)),
        crate::Layer::OutsideLibtorch(device) => format!("driver allocations outside libtorch on {}", device_name(device)),
    }
}

/// One line of the timeline: its legend name, colour, dash pattern, and
/// value at each sample.
struct Line<'a> {
    name: String,
    color: &'a str,
    dash: &'a str,
    values: Vec<Option<f64>>,
}

/// The lines the timeline draws: the verdict's exact line, every other
/// judged layer's under it, and the allocator's and driver's views.
fn lines(report: &Report) -> Vec<Line<'static>> {
    let samples = &report.samples;
    let view = |value: fn(&super::Sample) -> Option<u64>| samples.iter().map(|s| value(s).map(|v| v as f64)).collect();
    let mut lines = vec![
        Line {
            name: format!("{} (exact)", series_name(report.verdict_layer)),
            color: LIVE_COLOR,
            dash: "",
            values: samples.iter().map(|s| Some(s.live_bytes as f64)).collect(),
        },
        Line { name: "allocator allocated".into(), color: ALLOCATED_COLOR, dash: "", values: view(|s| s.allocated_bytes) },
        Line { name: "allocator reserved".into(), color: RESERVED_COLOR, dash: "8 4", values: view(|s| s.reserved_bytes) },
        Line { name: "driver used".into(), color: DRIVER_COLOR, dash: "2 4", values: view(|s| s.driver_used_bytes) },
    ];
    // One exact line per other judged device, drawn under the main one.
    let others = report.devices.iter().filter(|d| d.layer != report.verdict_layer && d.levels.len() == samples.len());
    for (d, color) in others.zip(OTHER_DEVICE_COLORS.iter().cycle()) {
        let name = format!("{} (exact, {})", series_name(d.layer), d.verdict.label());
        lines.insert(1, Line { name, color, dash: "4 2", values: d.levels.iter().map(|&v| Some(v as f64)).collect() });
    }
    lines
}

/// Where samples and values land on the canvas.
struct Plot {
    /// Number of x positions (at least 2).
    n: usize,
    low: f64,
    high: f64,
}

impl Plot {
    const W: f64 = WIDTH - LEFT - RIGHT;
    const H: f64 = HEIGHT - TOP - BOTTOM;

    /// A plot whose axis holds every value from sample `from` on (and the
    /// threshold), at least 1 KiB tall, with a margin.
    fn fitting(n: usize, values: &[Vec<Option<f64>>], from: usize, threshold: Option<f64>) -> Plot {
        let mut low = 0.0f64;
        let mut high = 0.0f64;
        for v in values.iter().flat_map(|values| values[from.min(values.len())..].iter()).flatten().chain(threshold.iter()) {
            low = low.min(*v);
            high = high.max(*v);
        }
        // A flat run still gets a readable axis.
        if high - low < 1024.0 {
            let middle = (high + low) / 2.0;
            (low, high) = ((middle - 512.0).min(low), (middle + 512.0).max(high));
        }
        let pad = (high - low) * 0.08;
        Plot { n: n.max(2), low: low - pad, high: high + pad }
    }

    fn x(&self, i: usize) -> f64 {
        LEFT + Self::W * i as f64 / (self.n - 1) as f64
    }

    fn y(&self, v: f64) -> f64 {
        TOP + Self::H * (1.0 - (v - self.low) / (self.high - self.low))
    }
}

/// Renders the timeline.
pub fn timeline(report: &Report) -> String {
    let samples = &report.samples;
    let lines = lines(report);
    // Every line as its change since the sample before the first measured
    // iteration, so they share an axis and a small leak is not flattened by
    // what setup and warm-up allocated; earlier points are clipped.
    let measured_start = samples.iter().position(|s| s.phase == Phase::Measure);
    let base = measured_start.map_or(0, |i| i.saturating_sub(1));
    let relative: Vec<Vec<Option<f64>>> = lines
        .iter()
        .map(|line| {
            let reference = line.values.get(base).copied().flatten();
            line.values.iter().map(|v| v.zip(reference).map(|(v, b)| v - b)).collect()
        })
        .collect();
    let threshold = measured_start.map(|_| report.settings.threshold_bytes as f64);
    let plot = Plot::fitting(samples.len(), &relative, base, threshold);

    let mut svg = String::new();
    header(&mut svg, report);
    phases(&mut svg, &plot, samples);
    axes(&mut svg, &plot, samples);
    if let (Some(t), Some(start)) = (threshold, measured_start) {
        let end = samples.iter().rposition(|s| matches!(s.phase, Phase::Measure | Phase::Confirm)).unwrap_or(start);
        let (x0, x1, y) = (plot.x(start.saturating_sub(1)), plot.x(end), plot.y(t));
        let _ = writeln!(
            svg,
            r#"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="{THRESHOLD_COLOR}" stroke-width="2" stroke-dasharray="6 3"/>"#
        );
    }
    polylines(&mut svg, &plot, &lines, &relative);
    legend(&mut svg, &lines, &relative, threshold.is_some());
    svg.push_str("</svg>\n");
    svg
}

/// The canvas, the title and the subtitle, and the clip path of the plot.
fn header(svg: &mut String, report: &Report) {
    let (plot_w, plot_h) = (Plot::W, Plot::H);
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#);
    let title = format!("{} on {}: {}", report.test, device_name(report.device), report.verdict.label().replace('_', " "));
    let _ = writeln!(svg, r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#, escape(&title));
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="40" fill="#555">change after each iteration, from the level before the first measured one</text>"##
    );
    let _ = writeln!(svg, r#"<clipPath id="plot"><rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/></clipPath>"#);
}

/// Shaded warm-up and attribution: half a step either side of their samples.
fn phases(svg: &mut String, plot: &Plot, samples: &[super::Sample]) {
    let half = Plot::W / (plot.n - 1) as f64 / 2.0;
    for (phase, shade, label) in [(Phase::WarmUp, WARMUP_SHADE, "warm-up"), (Phase::Attribution, ATTRIBUTION_SHADE, "attribution")] {
        let indices: Vec<usize> = samples.iter().enumerate().filter(|(_, s)| s.phase == phase).map(|(i, _)| i).collect();
        if let (Some(&a), Some(&b)) = (indices.first(), indices.last()) {
            let x0 = (plot.x(a) - half).max(LEFT);
            let x1 = (plot.x(b) + half).min(WIDTH - RIGHT);
            let _ = writeln!(svg, r#"<rect x="{x0:.1}" y="{TOP}" width="{:.1}" height="{}" fill="{shade}"/>"#, x1 - x0, Plot::H);
            let _ = writeln!(svg, r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#666">{label}</text>"##, (x0 + x1) / 2.0, TOP + 14.0);
        }
    }
}

/// Axes and grid, at round values of a binary unit, and the iterations.
fn axes(svg: &mut String, plot: &Plot, samples: &[super::Sample]) {
    let plot_h = Plot::H;
    let (unit, unit_name, tick) = tick_step(plot.high - plot.low);
    let mut v = (plot.low / tick).ceil() * tick;
    while v <= plot.high {
        let yy = plot.y(v);
        let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##, WIDTH - RIGHT);
        let label = tick_label(v, unit, unit_name);
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, yy + 4.0, escape(&label));
        v += tick;
    }
    let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{:.1}" stroke="#333"/>"##, TOP + plot_h);
    let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#333"/>"##, TOP + plot_h, WIDTH - RIGHT, TOP + plot_h);
    let step = (samples.len() / 16).max(1);
    for (i, s) in samples.iter().enumerate().step_by(step) {
        let label = match s.phase {
            Phase::Setup => "setup".to_string(),
            Phase::WarmUp => format!("w{}", s.iteration),
            Phase::Attribution => format!("a{}", s.iteration),
            _ => s.iteration.to_string(),
        };
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#, plot.x(i), TOP + plot_h + 18.0);
    }
    let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">iteration</text>"#, LEFT + Plot::W / 2.0, HEIGHT - 14.0);
}

/// Driver first, the exact line last, so it is drawn on top; allocated is
/// drawn wide, so where it equals the exact line it shows as a rim.
fn polylines(svg: &mut String, plot: &Plot, lines: &[Line], relative: &[Vec<Option<f64>>]) {
    for (line, values) in lines.iter().zip(relative).rev() {
        let points: Vec<String> =
            values.iter().enumerate().filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", plot.x(i), plot.y(v)))).collect();
        if points.len() < 2 {
            continue;
        }
        let width = match line.color {
            LIVE_COLOR => 2.5,
            ALLOCATED_COLOR => 7.0,
            _ => 2.0,
        };
        let dash = if line.dash.is_empty() { String::new() } else { format!(r#" stroke-dasharray="{}""#, line.dash) };
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{}" stroke-width="{width}"{dash} clip-path="url(#plot)" points="{}"/>"#,
            line.color,
            points.join(" ")
        );
    }
}

/// The names of the lines drawn (two points or more), and the threshold's.
fn legend(svg: &mut String, lines: &[Line], relative: &[Vec<Option<f64>>], threshold: bool) {
    let mut entries: Vec<(&str, &str)> = lines
        .iter()
        .zip(relative)
        .filter(|(_, v)| v.iter().flatten().count() >= 2)
        .map(|(line, _)| (line.name.as_str(), line.color))
        .collect();
    if threshold {
        entries.push(("threshold", THRESHOLD_COLOR));
    }
    let mut ly = TOP + 30.0;
    for (name, color) in entries {
        let lx = LEFT + 12.0;
        let _ = writeln!(svg, r#"<line x1="{lx}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/>"#, lx + 22.0);
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}">{name}</text>"#, lx + 28.0, ly + 4.0);
        ly += 16.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_in_binary_units() {
        assert_eq!(tick_step(1_400_000.0), (1024.0, "KiB", 500.0 * 1024.0));
        assert_eq!(tick_step(3.0 * 1048576.0), (1048576.0, "MiB", 1048576.0));
        assert_eq!(tick_step(40.0).1, "B");
        assert_eq!(tick_label(409600.0, 1024.0, "KiB"), "+400 KiB");
        assert_eq!(tick_label(-512.0, 1024.0, "KiB"), "-0.5 KiB");
    }
}
