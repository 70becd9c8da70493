//! Writing reports beside the build: `<dir>/<test>.json` for every leak test,
//! `<dir>/<test>.svg` for failing ones (or all, on request), and
//! `<dir>/index.html` listing every report in the folder. Each file is
//! written to a temporary name and renamed, so a reader never sees half a
//! file; a failed write is a warning and never changes a verdict.
use super::format::{device_name, escape_markup as escape};
use super::json::{self, ReportFile};
use super::{svg, Report};
use crate::config::Plots;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// What was written for one report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFiles {
    /// The JSON report.
    pub json: PathBuf,
    /// The SVG timeline, where one was written.
    pub plot: Option<PathBuf>,
    /// `index.html` of every report in the folder.
    pub index: PathBuf,
}

/// `target/gpu-leak-test` of the build that made this test binary (found
/// from the binary's own path, `target/<profile>/deps/<test>`), else
/// `target/gpu-leak-test` under the current folder.
pub fn default_report_dir() -> PathBuf {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        let deps = exe.parent()?;
        let profile = deps.parent()?;
        let target = profile.parent()?;
        (deps.file_name()? == "deps").then(|| target.join("gpu-leak-test"))
    });
    from_exe.unwrap_or_else(|| PathBuf::from("target/gpu-leak-test"))
}

/// A file name for a test on a device (`row1_keeps_losses.cuda0`): the
/// same test can run on the CPU and on CUDA. Letters, digits, `-`, `_`, `.`.
pub fn file_stem(test: &str, device: &str) -> String {
    let clean = |text: &str| -> String {
        text.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect::<String>().trim_matches('_').to_string()
    };
    let test = clean(test);
    let test = if test.is_empty() { "leak_test".to_string() } else { test };
    format!("{test}.{}", device.replace(':', ""))
}

/// Writes `contents` to `path` through a temporary file in the same folder.
pub fn write_atomically(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temporary = dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&temporary, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    result
}

/// Writes the JSON report, the plot when `plots` asks for one, and the
/// refreshed index. Errors say which file and why.
pub fn write_report(report: &Report, dir: &Path, plots: Plots) -> Result<ReportFiles, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let stem = file_stem(&report.test, &device_name(report.device));
    let wants_plot = match plots {
        Plots::All => true,
        Plots::Failing => !report.passed(),
        Plots::None => false,
    };
    let plot = if wants_plot {
        let path = dir.join(format!("{stem}.svg"));
        write_atomically(&path, svg::timeline(report).as_bytes())
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Some(path)
    } else {
        let _ = std::fs::remove_file(dir.join(format!("{stem}.svg")));
        None
    };
    let plot_name = plot.as_ref().map(|_| format!("{stem}.svg"));
    let text = json::to_json(report, plot_name.as_deref()).map_err(|e| format!("cannot serialise the report: {e}"))?;
    let json_path = dir.join(format!("{stem}.json"));
    write_atomically(&json_path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    let index = write_index(dir)?;
    Ok(ReportFiles { json: json_path, plot, index })
}

/// Rebuilds `index.html` from every JSON report in `dir`.
pub fn write_index(dir: &Path) -> Result<PathBuf, String> {
    let mut reports: Vec<ReportFile> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| json::from_json(&std::fs::read_to_string(p).ok()?).ok())
        .collect();
    reports.sort_by(|a, b| (a.passed, &a.report.test).cmp(&(b.passed, &b.report.test)));
    let mut html = String::from(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<title>gpu-leak-test reports</title>\n<style>\
         body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}\
         .fail{color:#b00020;font-weight:bold}.pass{color:#1b7e2a}</style>\n<h1>gpu-leak-test reports</h1>\n<table>\n\
         <tr><th>test</th><th>device</th><th>verdict</th><th>retained growth</th><th>per iteration</th><th>peak</th><th>plot</th><th>report</th></tr>\n",
    );
    for r in &reports {
        let stem = file_stem(&r.report.test, &super::device_name(r.report.device));
        let per_iteration = match &r.report.verdict {
            crate::verdict::Verdict::Leak(leak) => super::bytes(leak.bytes_per_iteration.round() as u64),
            crate::verdict::Verdict::Suppressed { bytes_per_iteration, .. }
            | crate::verdict::Verdict::WithinThreshold { bytes_per_iteration, .. } => {
                super::bytes(bytes_per_iteration.round() as u64)
            }
            _ => String::new(),
        };
        let plot = r.plot.as_ref().map(|p| format!("<a href=\"{0}\">plot</a>", escape(p))).unwrap_or_default();
        html.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{plot}</td><td><a href=\"{}.json\">json</a></td></tr>\n",
            escape(&r.report.test),
            escape(&super::device_name(r.report.verdict_device)),
            if r.passed { "pass" } else { "fail" },
            escape(&r.report.verdict.label().replace('_', " ")),
            super::signed_bytes(r.retained_growth_bytes),
            per_iteration,
            super::bytes(r.report.peak_bytes.max(0) as u64),
            escape(&stem),
        ));
    }
    html.push_str("</table>\n");
    let path = dir.join("index.html");
    write_atomically(&path, html.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}
