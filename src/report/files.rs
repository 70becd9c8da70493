//! Writing reports beside the build: `<dir>/<test>.json` for every leak test,
//! `<dir>/<test>.svg` for failing ones (or all, on request), and
//! `<dir>/index.html` listing every report in the folder. Each file is
//! written to a temporary name and renamed, so a reader never sees half a
//! file; a failed write is a warning and never changes a verdict.
use super::format::{device_name, escape_markup as escape};
use super::json;
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
    /// The test's own page (`<test>.html`).
    pub page: PathBuf,
}

/// Where reports go by default: `target/gpu-leak-test` of the build that
/// made this test binary (found from the binary's own path,
/// `target/<profile>/deps/<test>`). A binary run from a nextest archive
/// lives in a temporary extraction folder that nextest deletes afterwards;
/// there the reports go to the workspace nextest remapped
/// (`CARGO_MANIFEST_DIR` at run time, up to its workspace root), where the
/// user looks. Else `target/gpu-leak-test` under the current folder.
pub fn default_report_dir() -> PathBuf {
    let exe = std::env::current_exe().ok();
    let extracted = exe.as_ref().is_some_and(|exe| exe.starts_with(std::env::temp_dir()));
    let from_exe = exe.as_ref().filter(|_| !extracted).and_then(|exe| {
        let deps = exe.parent()?;
        let profile = deps.parent()?;
        let target = profile.parent()?;
        (deps.file_name()? == "deps").then(|| target.join("gpu-leak-test"))
    });
    from_exe
        .or_else(|| workspace_root_at_run_time().map(|root| root.join("target/gpu-leak-test")))
        .unwrap_or_else(|| PathBuf::from("target/gpu-leak-test"))
}

/// The workspace of the crate under test, from CARGO_MANIFEST_DIR at run
/// time: the outermost folder above it whose Cargo.toml has `[workspace]`,
/// else the crate's own folder.
fn workspace_root_at_run_time() -> Option<PathBuf> {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR")?);
    let is_workspace = |dir: &Path| {
        std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|text| text.lines().any(|l| l.trim() == "[workspace]"))
    };
    let outermost = manifest_dir.ancestors().filter(|dir| is_workspace(dir)).last().map(Path::to_path_buf);
    Some(outermost.unwrap_or(manifest_dir))
}

/// The readable part of a file name keeps at most this many characters; the
/// hash after it keeps names unique.
const READABLE_NAME_CHARS: usize = 100;

/// The crate and test binary a report comes from: two tests named alike in
/// two binaries or crates must not share a file. `CARGO_PKG_NAME` is set at
/// run time by cargo and nextest; the binary is this executable's name
/// without cargo's hash.
fn test_binary_identity() -> String {
    let package = std::env::var("CARGO_PKG_NAME").unwrap_or_default();
    let binary = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|stem| match stem.rsplit_once('-') {
            Some((name, hash)) if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_string(),
            _ => stem,
        })
        .unwrap_or_default();
    format!("{package}\0{binary}")
}

/// FNV-1a: stable across runs and platforms, unlike std's hasher.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf29ce484222325, |hash, byte| (hash ^ byte as u64).wrapping_mul(0x100000001b3))
}

/// A file name for a test on a device (`row1_keeps_losses.cuda0.3f9a61c2`):
/// the readable test name (letters, digits, `-`, `_`, shortened), the device
/// (the same test runs on the CPU and on CUDA), and a hash of the crate, the
/// test binary, the full test name and the device, so that names alike
/// after cleaning (`_x` and `x`, two Unicode names, two tests of one name in
/// two binaries) and long names never share a file.
pub fn file_stem(test: &str, device: &str) -> String {
    file_stem_in(&test_binary_identity(), test, device)
}

/// [`file_stem`] for a test binary named by `identity`.
fn file_stem_in(identity: &str, test: &str, device: &str) -> String {
    let clean: String = test.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let clean: String = clean.trim_matches('_').chars().take(READABLE_NAME_CHARS).collect();
    let readable = if clean.is_empty() { "leak_test".to_string() } else { clean };
    let hash = fnv1a(&format!("{identity}\0{test}\0{device}"));
    format!("{readable}.{}.{:08x}", device.replace(':', ""), hash as u32)
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
    let page = dir.join(format!("{stem}.html"));
    write_atomically(&page, super::page::render(report).as_bytes()).map_err(|e| format!("cannot write {}: {e}", page.display()))?;
    let index = update_index(dir, IndexRow::of(report, &stem, plot_name.as_deref()))?;
    Ok(ReportFiles { json: json_path, plot, index, page })
}

/// What the index shows of one report: one line of `index.rows`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct IndexRow {
    stem: String,
    test: String,
    device: String,
    verdict: String,
    passed: bool,
    expected_failure: bool,
    retained_growth_bytes: i64,
    bytes_per_iteration: Option<f64>,
    peak_bytes: i64,
    site: Option<String>,
    plot: Option<String>,
    run: String,
    /// Seconds since the Unix epoch.
    written_at: u64,
}

impl IndexRow {
    fn of(report: &Report, stem: &str, plot: Option<&str>) -> IndexRow {
        use crate::verdict::Verdict;
        let bytes_per_iteration = match &report.verdict {
            Verdict::Leak(leak) => Some(leak.bytes_per_iteration),
            Verdict::Suppressed { bytes_per_iteration, .. } | Verdict::WithinThreshold { bytes_per_iteration, .. } => {
                Some(*bytes_per_iteration)
            }
            _ => None,
        };
        IndexRow {
            stem: stem.to_string(),
            test: report.test.clone(),
            device: device_name(report.verdict_device),
            verdict: report.verdict.label().to_string(),
            passed: report.passed(),
            expected_failure: report.expected_failure,
            retained_growth_bytes: report.retained_growth_bytes(),
            bytes_per_iteration,
            peak_bytes: report.peak_bytes,
            site: report.top_site().map(|s| s.location.clone().unwrap_or_else(|| s.description.clone())),
            plot: plot.map(str::to_string),
            run: run_id(),
            written_at: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        }
    }
}

/// Tells one run of the suite from the next: nextest's run id, else the
/// parent process (cargo test runs every test binary of a run from one
/// cargo) and its start time, so a reused pid is a new run.
fn run_id() -> String {
    if let Ok(id) = std::env::var("NEXTEST_RUN_ID") {
        return id;
    }
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let started = std::fs::read_to_string(format!("/proc/{parent}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(19).map(str::to_string)))
        .unwrap_or_default();
    format!("{parent}-{started}")
}

/// Holds an exclusive `flock` on `dir/.index.lock` until dropped: leak tests
/// that finish together (threads, or processes under nextest) update the
/// index one at a time, so no row is lost.
struct IndexLock(std::fs::File);

impl IndexLock {
    fn take(dir: &Path) -> Result<IndexLock, String> {
        let path = dir.join(".index.lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor owned by `file`, which outlives the lock.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(format!("cannot lock {}: {}", path.display(), std::io::Error::last_os_error()));
        }
        Ok(IndexLock(file))
    }
}

impl Drop for IndexLock {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: unlocks the descriptor this guard locked.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Adds (or replaces) this report's row in `dir/index.rows` and rewrites
/// `index.html` from the rows, under the folder's lock. The cost per test is
/// one read of the rows file (a line per report), whatever the reports
/// weigh; no report is parsed again.
fn update_index(dir: &Path, row: IndexRow) -> Result<PathBuf, String> {
    let _lock = IndexLock::take(dir)?;
    let rows_path = dir.join("index.rows");
    let mut rows: Vec<IndexRow> = std::fs::read_to_string(&rows_path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|r: &IndexRow| r.stem != row.stem)
        .collect();
    rows.push(row);
    let text: String = rows.iter().filter_map(|r| serde_json::to_string(r).ok()).map(|line| line + "\n").collect();
    write_atomically(&rows_path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", rows_path.display()))?;
    let path = dir.join("index.html");
    write_atomically(&path, index_html(&rows, &run_id()).as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// Merges the report folders of several runners (nextest partitions) into
/// `out`: every report file is copied, one row is kept per report (the
/// newest where two folders have one), the rows of each folder's latest run
/// become one run, and `out/index.html` is written. Returns the number of
/// rows of that merged run.
pub fn merge_report_dirs(out: &Path, inputs: &[PathBuf]) -> Result<usize, String> {
    std::fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let merged_run = format!("merged-{}", std::process::id());
    let mut by_stem: std::collections::BTreeMap<String, IndexRow> = Default::default();
    for input in inputs {
        let rows_path = input.join("index.rows");
        let text = std::fs::read_to_string(&rows_path).map_err(|e| format!("cannot read {}: {e}", rows_path.display()))?;
        let rows: Vec<IndexRow> = text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect();
        let latest_run = rows.iter().max_by_key(|r| r.written_at).map(|r| r.run.clone());
        for entry in std::fs::read_dir(input).map_err(|e| format!("cannot list {}: {e}", input.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            let is_report = path.extension().is_some_and(|e| e == "json" || e == "html" || e == "svg");
            let name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
            if is_report && name != "index.html" {
                std::fs::copy(&path, out.join(&name)).map_err(|e| format!("cannot copy {}: {e}", path.display()))?;
            }
        }
        for mut row in rows {
            if Some(&row.run) == latest_run.as_ref() {
                row.run = merged_run.clone();
            }
            match by_stem.get(&row.stem) {
                Some(kept) if kept.written_at > row.written_at => {}
                _ => {
                    by_stem.insert(row.stem.clone(), row);
                }
            }
        }
    }
    let rows: Vec<IndexRow> = by_stem.into_values().collect();
    let text: String = rows.iter().filter_map(|r| serde_json::to_string(r).ok()).map(|line| line + "\n").collect();
    write_atomically(&out.join("index.rows"), text.as_bytes()).map_err(|e| format!("cannot write index.rows: {e}"))?;
    write_atomically(&out.join("index.html"), index_html(&rows, &merged_run).as_bytes())
        .map_err(|e| format!("cannot write index.html: {e}"))?;
    Ok(rows.iter().filter(|r| r.run == merged_run).count())
}

/// The index page: this run's counts by verdict, then a row per report,
/// failures first; rows from earlier runs are marked stale.
fn index_html(rows: &[IndexRow], run: &str) -> String {
    let mut rows: Vec<&IndexRow> = rows.iter().collect();
    let current = |r: &IndexRow| r.run == run;
    rows.sort_by(|a, b| {
        let failing = |r: &IndexRow| r.passed || r.expected_failure;
        (!current(a), failing(a), &a.test, &a.device).cmp(&(!current(b), failing(b), &b.test, &b.device))
    });
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for r in rows.iter().filter(|r| current(r)) {
        let key = if r.expected_failure { format!("{} (expected)", r.verdict) } else { r.verdict.clone() };
        *counts.entry(key.replace('_', " ")).or_default() += 1;
    }
    let latest = rows.iter().filter(|r| current(r)).map(|r| r.written_at).max().unwrap_or(0);
    let counts: Vec<String> = counts.iter().map(|(verdict, n)| format!("{n} {verdict}")).collect();
    let stale = rows.iter().filter(|r| !current(r)).count();
    let mut html = format!(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<title>gpu-leak-test reports</title>\n<style>\
         body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}}\
         .fail{{color:#b00020;font-weight:bold}}.pass{{color:#1b7e2a}}.expected{{color:#7a5c00}}tr.stale{{color:#999}}</style>\n\
         <h1>gpu-leak-test reports</h1>\n<p id=\"run\">Latest run: {} tests, written up to <time data-unix=\"{latest}\">{}</time> (UTC): {}.{}</p>\n<table>\n\
         <tr><th>test</th><th>device</th><th>verdict</th><th>retained growth</th><th>per iteration</th><th>peak</th><th>site</th><th>plot</th><th>report</th></tr>\n",
        rows.iter().filter(|r| current(r)).count(),
        utc(latest),
        if counts.is_empty() { "none".to_string() } else { counts.join(", ") },
        if stale > 0 { format!(" {stale} rows from earlier runs are marked stale.") } else { String::new() },
    );
    for r in rows {
        let (class, verdict) = match (r.passed, r.expected_failure) {
            (false, true) => ("expected", format!("{} (expected by #[should_panic])", r.verdict.replace('_', " "))),
            (false, false) => ("fail", r.verdict.replace('_', " ")),
            (true, _) => ("pass", r.verdict.replace('_', " ")),
        };
        let plot = r.plot.as_ref().map(|p| format!("<a href=\"{0}\">plot</a>", escape(p))).unwrap_or_default();
        html.push_str(&format!(
            "<tr class=\"{}\"><td><a href=\"{}.html\">{}</a></td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{plot}</td><td><a href=\"{}.json\">json</a></td></tr>\n",
            if current(r) { "current" } else { "stale" },
            escape(&r.stem),
            escape(&r.test),
            escape(&r.device),
            escape(&verdict) + if current(r) { "" } else { " (stale)" },
            super::signed_bytes(r.retained_growth_bytes),
            r.bytes_per_iteration.map(|b| super::bytes(b.round().max(0.0) as u64)).unwrap_or_default(),
            super::bytes(r.peak_bytes.max(0) as u64),
            escape(r.site.as_deref().unwrap_or("")),
            escape(&r.stem),
        ));
    }
    html.push_str("</table>\n");
    html
}

/// `2026-11-30 06:38:50` from Unix seconds (UTC), without a date library.
fn utc(seconds: u64) -> String {
    let days = seconds / 86_400;
    let (h, m, s) = (seconds % 86_400 / 3600, seconds % 3600 / 60, seconds % 60);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{s:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_names_are_unique_per_binary_and_per_raw_name_and_bounded_in_length() {
        let here = file_stem_in("crate\0article", "row1", "cpu");
        assert!(here.starts_with("row1.cpu."), "{here}");
        assert_ne!(here, file_stem_in("crate\0detector", "row1", "cpu"), "same name in two binaries");
        assert_ne!(here, file_stem_in("other\0article", "row1", "cpu"), "same name in two crates");
        assert_ne!(file_stem_in("c", "_x", "cpu"), file_stem_in("c", "x", "cpu"), "names alike after cleaning");
        assert_ne!(file_stem_in("c", "naïve", "cpu"), file_stem_in("c", "na_ve", "cpu"));
        let long = "a".repeat(250);
        let stem = file_stem_in("c", &long, "cuda:0");
        assert!(stem.len() <= READABLE_NAME_CHARS + 16, "{} characters", stem.len());
        assert_ne!(stem, file_stem_in("c", &"a".repeat(251), "cuda:0"), "long names differ by their hash");
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_796_020_730), "2026-11-30 06:38:50");
    }
}
