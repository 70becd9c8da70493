//! The SVG timeline of one test: after each iteration, the change from the
//! level before the first measured iteration of every judged layer's exact
//! live bytes, with the allocator's allocated and reserved bytes on the same
//! axis; the threshold as a line over the measured iterations; warm-up and
//! attribution shaded. The axis is scaled to the exact layers and the
//! threshold alone. The legend sits below. The driver's views, which every
//! process moves, are not drawn: they are read only before and after the
//! window, and the report's table has them.
use crate::layer::device_name;
use super::format::{escape_markup as escape};
use super::{MemoryViews, Report};
use crate::verdict::Phase;
use std::fmt::Write;

const WIDTH: f64 = 860.0;
const LEFT: f64 = 110.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 56.0;
/// The main plot's height.
const MAIN_H: f64 = 300.0;
/// Below a plot: iteration labels and the axis title.
const X_LABELS: f64 = 44.0;
const LEGEND_ROW: f64 = 18.0;

/// The exact line's colour; the render test looks for it, as for the others.
pub const LIVE_COLOR: &str = "#1f4e9c";
/// The caching allocator's allocated bytes.
pub const ALLOCATED_COLOR: &str = "#e07b00";
/// The caching allocator's reserved bytes.
pub const RESERVED_COLOR: &str = "#2a9d3c";
/// The threshold line.
pub const THRESHOLD_COLOR: &str = "#d62728";
/// Exact lines of the other judged layers (host memory when the body ran
/// on CUDA, and the reverse; libtorch's host objects, the Rust heap, the
/// driver's allocations outside libtorch): one colour each for the five a
/// one-GPU machine follows besides the verdict's.
pub const OTHER_LAYER_COLORS: [&str; 5] = ["#17becf", "#7f7f7f", "#bcbd22", "#8e44ad", "#e377c2"];
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

/// One line of the timeline: its legend name, colour, dash pattern,
/// value at each sample, and whether the axis is scaled to it (exact
/// layers are; the allocator's views are drawn on their axis, clipped).
struct Line<'a> {
    name: String,
    color: &'a str,
    dash: &'a str,
    values: Vec<Option<f64>>,
    scales_axis: bool,
}

/// The lines of the main plot: the verdict's exact line, every other
/// judged layer's under it, and the allocator's views.
fn lines(report: &Report) -> Vec<Line<'static>> {
    let samples = &report.samples;
    let view = |value: fn(&super::Sample) -> Option<u64>| samples.iter().map(|s| value(s).map(|v| v as f64)).collect();
    let mut lines = vec![
        Line {
            name: format!("{} (exact)", report.verdict_layer.plain_name()),
            color: LIVE_COLOR,
            dash: "",
            values: samples.iter().map(|s| Some(s.live_bytes as f64)).collect(),
            scales_axis: true,
        },
        Line {
            name: MemoryViews::ALLOCATED_LABEL.into(),
            color: ALLOCATED_COLOR,
            dash: "",
            values: view(|s| s.allocated_bytes),
            scales_axis: false,
        },
        Line {
            name: MemoryViews::RESERVED_LABEL.into(),
            color: RESERVED_COLOR,
            dash: "8 4",
            values: view(|s| s.reserved_bytes),
            scales_axis: false,
        },
    ];
    // One exact line per other judged layer, drawn under the main one.
    let others = report.devices.iter().filter(|d| d.layer != report.verdict_layer && d.levels.len() == samples.len());
    for (d, color) in others.zip(OTHER_LAYER_COLORS.iter().cycle()) {
        let name = format!("{} (exact, {})", d.layer.plain_name(), d.verdict.label());
        let values = d.levels.iter().map(|&v| Some(v as f64)).collect();
        lines.insert(1, Line { name, color, dash: "4 2", values, scales_axis: true });
    }
    lines
}

/// Where samples and values land on the canvas: a plot `h` tall from `top`.
struct Plot {
    /// Number of x positions (at least 2).
    n: usize,
    low: f64,
    high: f64,
    top: f64,
    h: f64,
}

impl Plot {
    const W: f64 = WIDTH - LEFT - RIGHT;

    /// A plot whose axis holds every value from sample `from` on (and the
    /// threshold), at least `least` tall, with a margin.
    fn fitting(n: usize, values: &[&[Option<f64>]], from: usize, threshold: Option<f64>, least: f64, (top, h): (f64, f64)) -> Plot {
        let mut low = 0.0f64;
        let mut high = 0.0f64;
        let mut seen = false;
        for v in values.iter().flat_map(|values| values[from.min(values.len())..].iter()).flatten().chain(threshold.iter()) {
            (low, high) = if seen { (low.min(*v), high.max(*v)) } else { (*v, *v) };
            seen = true;
        }
        // A flat run still gets a readable axis.
        if high - low < least {
            let middle = (high + low) / 2.0;
            (low, high) = ((middle - least / 2.0).min(low), (middle + least / 2.0).max(high));
        }
        let pad = (high - low) * 0.08;
        Plot { n: n.max(2), low: low - pad, high: high + pad, top, h }
    }

    fn x(&self, i: usize) -> f64 {
        LEFT + Self::W * i as f64 / (self.n - 1) as f64
    }

    fn y(&self, v: f64) -> f64 {
        self.top + self.h * (1.0 - (v - self.low) / (self.high - self.low))
    }

    fn bottom(&self) -> f64 {
        self.top + self.h
    }
}

/// Each line as its change since sample `base`.
fn relative_to(line: &Line, base: usize) -> Vec<Option<f64>> {
    let reference = line.values.get(base).copied().flatten();
    line.values.iter().map(|v| v.zip(reference).map(|(v, b)| v - b)).collect()
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
    let relative: Vec<Vec<Option<f64>>> = lines.iter().map(|line| relative_to(line, base)).collect();
    let threshold = measured_start.map(|_| report.settings.threshold_bytes as f64);
    let scaled: Vec<&[Option<f64>]> =
        lines.iter().zip(&relative).filter(|(line, _)| line.scales_axis).map(|(_, values)| values.as_slice()).collect();
    let plot = Plot::fitting(samples.len(), &scaled, base, threshold, 1024.0, (TOP, MAIN_H));
    let below = plot.bottom() + X_LABELS;
    let entries = legend_entries(&lines, &relative, threshold.is_some());
    let height = below + 12.0 + LEGEND_ROW * entries.len().div_ceil(2) as f64 + 10.0;

    let mut svg = String::new();
    header(&mut svg, report, height);
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
    legend(&mut svg, &entries, below + 12.0);
    svg.push_str("</svg>\n");
    svg
}

/// The canvas, the title and the subtitle, and the clip path of the plot.
fn header(svg: &mut String, report: &Report, height: f64) {
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="{WIDTH}" height="{height}" fill="white"/>"#);
    let title = format!("{} on {}: {}", report.test, device_name(report.device), report.verdict.label().replace('_', " "));
    let _ = writeln!(svg, r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{}</text>"#, escape(&title));
    let _ = writeln!(
        svg,
        r##"<text x="{LEFT}" y="40" fill="#555">change after each iteration, from the level before the first measured one; axis scaled to the exact layers</text>"##
    );
    let _ = writeln!(svg, r#"<clipPath id="plot"><rect x="{LEFT}" y="{TOP}" width="{}" height="{MAIN_H}"/></clipPath>"#, Plot::W);
}

/// Shaded warm-up and attribution: half a step either side of their samples.
fn phases(svg: &mut String, plot: &Plot, samples: &[super::Sample]) {
    let half = Plot::W / (plot.n - 1) as f64 / 2.0;
    for (phase, shade, label) in [(Phase::WarmUp, WARMUP_SHADE, "warm-up"), (Phase::Attribution, ATTRIBUTION_SHADE, "attribution")] {
        let indices: Vec<usize> = samples.iter().enumerate().filter(|(_, s)| s.phase == phase).map(|(i, _)| i).collect();
        if let (Some(&a), Some(&b)) = (indices.first(), indices.last()) {
            let x0 = (plot.x(a) - half).max(LEFT);
            let x1 = (plot.x(b) + half).min(WIDTH - RIGHT);
            let _ = writeln!(svg, r#"<rect x="{x0:.1}" y="{}" width="{:.1}" height="{}" fill="{shade}"/>"#, plot.top, x1 - x0, plot.h);
            let _ = writeln!(svg, r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#666">{label}</text>"##, (x0 + x1) / 2.0, plot.top + 14.0);
        }
    }
}

/// Axes and grid, at round values of a binary unit, and the iterations
/// with the axis title under them.
fn axes(svg: &mut String, plot: &Plot, samples: &[super::Sample]) {
    let (unit, unit_name, tick) = tick_step(plot.high - plot.low);
    let mut v = (plot.low / tick).ceil() * tick;
    while v <= plot.high {
        let yy = plot.y(v);
        let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/>"##, WIDTH - RIGHT);
        let label = tick_label(v, unit, unit_name);
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, yy + 4.0, escape(&label));
        v += tick;
    }
    let bottom = plot.bottom();
    let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{}" x2="{LEFT}" y2="{bottom:.1}" stroke="#333"/>"##, plot.top);
    let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{bottom:.1}" x2="{:.1}" y2="{bottom:.1}" stroke="#333"/>"##, WIDTH - RIGHT);
    let step = (samples.len() / 16).max(1);
    for (i, s) in samples.iter().enumerate().step_by(step) {
        let label = match s.phase {
            Phase::Setup => "setup".to_string(),
            Phase::WarmUp => format!("w{}", s.iteration),
            Phase::Attribution => format!("a{}", s.iteration),
            Phase::Confirm => format!("c{}", s.iteration),
            _ => s.iteration.to_string(),
        };
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{label}</text>"#, plot.x(i), bottom + 18.0);
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">iteration (w: warm-up, c: confirmation, a: attribution)</text>"#,
        LEFT + Plot::W / 2.0,
        bottom + 36.0
    );
}

/// The exact line last, so it is drawn on top; allocated is drawn wide, so
/// where it equals the exact line it shows as a rim.
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
fn legend_entries(lines: &[Line<'static>], relative: &[Vec<Option<f64>>], threshold: bool) -> Vec<(String, &'static str)> {
    let mut entries: Vec<(String, &'static str)> = lines
        .iter()
        .zip(relative)
        .filter(|(_, v)| v.iter().flatten().count() >= 2)
        .map(|(line, _)| (line.name.clone(), line.color))
        .collect();
    if threshold {
        entries.push(("threshold (over the measured iterations)".into(), THRESHOLD_COLOR));
    }
    entries
}

/// The legend, in two columns under the plots: it covers no data.
fn legend(svg: &mut String, entries: &[(String, &str)], top: f64) {
    let column = Plot::W / 2.0;
    for (i, (name, color)) in entries.iter().enumerate() {
        let lx = LEFT + column * (i % 2) as f64;
        let ly = top + LEGEND_ROW * (i / 2) as f64 + 6.0;
        let _ = writeln!(svg, r#"<line x1="{lx}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/>"#, lx + 22.0);
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx + 28.0, ly + 4.0, escape(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_other_layer_of_a_one_gpu_machine_has_a_colour_no_other_line_has() {
        use crate::layer::Layer;
        use tch::Device;
        let followed = [
            Layer::Tensors(Device::Cpu),
            Layer::HostObjects,
            Layer::RustHeap,
            Layer::Tensors(Device::Cuda(0)),
            Layer::OutsideLibtorch(Device::Cuda(0)),
            Layer::OutsideLibtorch(Device::Cpu),
        ];
        assert!(OTHER_LAYER_COLORS.len() >= followed.len() - 1, "one layer is the verdict's, drawn in LIVE_COLOR");
        let mut colours: Vec<&str> = OTHER_LAYER_COLORS.to_vec();
        colours.extend([LIVE_COLOR, ALLOCATED_COLOR, RESERVED_COLOR, THRESHOLD_COLOR]);
        let mut distinct = colours.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), colours.len(), "{colours:?}");
    }

    #[test]
    fn ticks_are_round_in_binary_units() {
        assert_eq!(tick_step(1_400_000.0), (1024.0, "KiB", 500.0 * 1024.0));
        assert_eq!(tick_step(3.0 * 1048576.0), (1048576.0, "MiB", 1048576.0));
        assert_eq!(tick_step(40.0).1, "B");
        assert_eq!(tick_label(409600.0, 1024.0, "KiB"), "+400 KiB");
        assert_eq!(tick_label(-512.0, 1024.0, "KiB"), "-0.5 KiB");
    }
}
