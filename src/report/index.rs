//! `index.html` and `index.rows`: one row per report in a report folder.
//!
//! Adding a row costs the same however many reports the folder holds. Both
//! files are appended to, under the folder's lock: `index.rows` gets the
//! row as a JSON line (a test's newer row supersedes its older ones), and
//! `index.html` the row as a table row. A small script in the page keeps the
//! newest row per report, marks the rows of earlier runs stale, sorts and
//! counts. Once `index.rows` has grown to twice its size at the last
//! compaction (plus [`COMPACTION_SLACK`]), both files are rewritten with one
//! row per report, the page fully rendered: a rewrite after as many appends
//! as it reads rows, so each report pays a constant share.
use crate::layer::device_name;
use super::format::{escape_markup as escape};
use super::Report;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// What the index shows of one report: one line of `index.rows`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(super) struct IndexRow {
    stem: String,
    test: String,
    device: String,
    /// The layer every figure of the row is about: the verdict's.
    #[serde(default)]
    layer: String,
    /// Where the body ran, where that is not the layer's device.
    #[serde(default)]
    body: Option<String>,
    verdict: String,
    passed: bool,
    expected_failure: bool,
    /// The figures the row shows, all of the verdict's layer.
    #[serde(flatten)]
    figures: RowFigures,
    plot: Option<String>,
    run: String,
    /// Seconds since the Unix epoch.
    written_at: u64,
}

/// An index row's figures.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct RowFigures {
    retained_growth_bytes: i64,
    bytes_per_iteration: Option<f64>,
    peak_bytes: Option<i64>,
    site: Option<String>,
    /// Where a test keeps a memory baseline: its status and biggest change.
    #[serde(default)]
    baseline: Option<String>,
}

impl IndexRow {
    pub(super) fn of(report: &Report, stem: &str, plot: Option<&str>) -> IndexRow {
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
            layer: report.verdict_layer.name().to_string(),
            body: (report.verdict_device != report.device).then(|| device_name(report.device)),
            verdict: report.verdict.label().to_string(),
            passed: report.passed(),
            expected_failure: report.context.expected_failure,
            // Every figure of the row from the verdict's layer.
            figures: RowFigures {
                retained_growth_bytes: report.retained_growth_bytes(),
                bytes_per_iteration,
                peak_bytes: report.figures.peak_bytes,
                site: report.top_site().map(|s| s.location.clone().unwrap_or_else(|| s.description.clone())),
                baseline: report.findings.baseline.as_ref().map(|b| b.summary()),
            },
            plot: plot.map(str::to_string),
            run: run_id(),
            written_at: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        }
    }

    /// The verdict as the page shows it (`peak over budget`).
    fn verdict_label(&self) -> String {
        self.verdict.replace('_', " ")
    }

    /// What the run's counts group it under: its verdict, marked where
    /// `#[should_panic]` expected the failure.
    fn count_key(&self) -> String {
        if self.expected_failure {
            format!("{} (expected)", self.verdict_label())
        } else {
            self.verdict_label()
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

/// Bytes `index.rows` may grow by beyond twice its compacted size before
/// the next compaction: small folders never need one.
pub const COMPACTION_SLACK: u64 = 64 * 1024;

/// The page's first line after the doctype: the format, and the size of
/// `index.rows` when the page was last rendered whole.
const PAGE_MARK: &str = "<!-- gpu-leak-test index 2; rows compacted at ";

fn append(path: &Path, text: &str) -> Result<(), String> {
    crate::disk::append(path, text).map_err(|e| format!("cannot append to {}: {e}", path.display()))
}

/// The rows size recorded in the page's mark, where the page is of this
/// format; read from its first bytes only.
fn compacted_size(page: &Path) -> Option<u64> {
    let mut head = [0u8; 160];
    let read = std::fs::File::open(page).and_then(|mut f| f.read(&mut head)).ok()?;
    let head = std::str::from_utf8(&head[..read]).ok()?;
    let after = &head[head.find(PAGE_MARK)? + PAGE_MARK.len()..];
    after[..after.find(' ')?].parse().ok()
}

/// Every row of `index.rows`, the newest of each report only, in the order
/// their reports first appeared.
fn read_rows(path: &Path) -> Result<Vec<IndexRow>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    Ok(newest_per_report(text.lines().filter_map(|line| serde_json::from_str(line).ok())))
}

/// Whether each report the folder's index lists failed (its newest row),
/// by file stem; empty where there is no readable index.
pub(super) fn failed_by_stem(dir: &Path) -> BTreeMap<String, bool> {
    read_rows(&dir.join("index.rows"))
        .unwrap_or_default()
        .into_iter()
        .map(|row| (row.stem, !row.passed && !row.expected_failure))
        .collect()
}

/// Keeps the last row of each report (rows come oldest first).
fn newest_per_report(rows: impl IntoIterator<Item = IndexRow>) -> Vec<IndexRow> {
    let mut order: Vec<String> = Vec::new();
    let mut newest: BTreeMap<String, IndexRow> = BTreeMap::new();
    for row in rows {
        if !newest.contains_key(&row.stem) {
            order.push(row.stem.clone());
        }
        newest.insert(row.stem.clone(), row);
    }
    order.into_iter().filter_map(|stem| newest.remove(&stem)).collect()
}

/// Writes `rows` as the whole of both files, the page rendered for `run`.
fn write_compacted(dir: &Path, rows: &[IndexRow], run: &str) -> Result<PathBuf, String> {
    let rows_path = dir.join("index.rows");
    let text: String = rows.iter().filter_map(|r| serde_json::to_string(r).ok()).map(|line| line + "\n").collect();
    crate::disk::write_atomically(&rows_path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", rows_path.display()))?;
    let page = dir.join("index.html");
    crate::disk::write_atomically(&page, render(rows, run, text.len() as u64).as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", page.display()))?;
    Ok(page)
}

/// Adds this report's row to the folder's index, under the folder's lock.
pub(super) fn add_row(dir: &Path, row: IndexRow) -> Result<PathBuf, String> {
    let _lock = IndexLock::take(dir)?;
    let rows_path = dir.join("index.rows");
    let page = dir.join("index.html");
    let line = serde_json::to_string(&row).map_err(|e| format!("cannot serialise the index row: {e}"))? + "\n";
    append(&rows_path, &line)?;
    let size = std::fs::metadata(&rows_path).map(|m| m.len()).unwrap_or(0);
    match compacted_size(&page) {
        Some(compacted) if size <= 2 * compacted + COMPACTION_SLACK => {
            append(&page, &row_html(&row, true))?;
            Ok(page)
        }
        // No page yet, a page of an older format, or time to compact.
        _ => write_compacted(dir, &read_rows(&rows_path)?, &row.run),
    }
}

/// A stem as `files::file_stem` makes them: a plain file name, so that
/// `{stem}.json` stays inside the folder it is joined to.
fn is_plain_stem(stem: &str) -> bool {
    !stem.is_empty() && !stem.starts_with('.') && stem.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Merges the report folders of several runners (nextest partitions) into
/// `out`: every report file is copied, one row is kept per report (the
/// newest where two folders have one), the rows of each folder's latest run
/// become one run, and `out/index.html` is written. Returns the number of
/// rows of that merged run.
pub fn merge_report_dirs(out: &Path, inputs: &[PathBuf]) -> crate::Result<usize> {
    merge_into(out, inputs).map_err(|message| crate::Error::ReportFiles { message })
}

fn merge_into(out: &Path, inputs: &[PathBuf]) -> Result<usize, String> {
    // Copying a folder's files onto themselves truncates them, and rows
    // read from the output would be merged with what is written there.
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if let Some(input) = inputs.iter().find(|input| same(input, out)) {
        return Err(format!(
            "the output folder {} is also an input ({}): merge into a new folder",
            out.display(),
            input.display()
        ));
    }
    crate::disk::create_folder(out)?;
    let merged_run = format!("merged-{}", std::process::id());
    // Each report's row with the folder it came from: the newest row wins,
    // and its own files go with it, so the row and the JSON, page and plot
    // it links always describe one run.
    let mut by_stem: BTreeMap<String, (IndexRow, &Path)> = Default::default();
    for input in inputs {
        let rows_path = input.join("index.rows");
        if !rows_path.is_file() {
            return Err(format!("cannot read {}: no such file (is {} a report folder?)", rows_path.display(), input.display()));
        }
        let rows = read_rows(&rows_path)?;
        // A stem names files in the output folder: a path in it ("../x",
        // "/etc/x") would copy over files outside it.
        if let Some(bad) = rows.iter().find(|r| !is_plain_stem(&r.stem)) {
            return Err(format!(
                "{}: the row of `{}` has the stem {:?}, which is not a report's file name (letters, digits, `-`, `_` and \
                 `.`, not starting with `.`); nothing was merged. Remove the row, or write the folder again with a \
                 test run",
                rows_path.display(),
                bad.test,
                bad.stem
            ));
        }
        let latest_run = rows.iter().max_by_key(|r| r.written_at).map(|r| r.run.clone());
        for mut row in rows {
            if Some(&row.run) == latest_run.as_ref() {
                row.run = merged_run.clone();
            }
            match by_stem.get(&row.stem) {
                Some((kept, _)) if kept.written_at > row.written_at => {}
                _ => {
                    by_stem.insert(row.stem.clone(), (row, input.as_path()));
                }
            }
        }
    }
    for (stem, (_, folder)) in &by_stem {
        for extension in ["json", "html", "svg", "series.csv"] {
            let from = folder.join(format!("{stem}.{extension}"));
            if from.is_file() {
                std::fs::copy(&from, out.join(format!("{stem}.{extension}")))
                    .map_err(|e| format!("cannot copy {}: {e}", from.display()))?;
            }
        }
    }
    let by_stem: BTreeMap<String, IndexRow> = by_stem.into_iter().map(|(stem, (row, _))| (stem, row)).collect();
    let rows: Vec<IndexRow> = by_stem.into_values().collect();
    write_compacted(out, &rows, &merged_run)?;
    Ok(rows.iter().filter(|r| r.run == merged_run).count())
}

/// One table row. `current`: of the run the page was rendered for (rows
/// appended later are of the latest run when written; the page's script
/// marks them stale once a newer run appends).
fn row_html(r: &IndexRow, current: bool) -> String {
    let (class, verdict) = match (r.passed, r.expected_failure) {
        (false, true) => ("expected", format!("{} (expected by #[should_panic])", r.verdict_label())),
        (false, false) => ("fail", r.verdict_label()),
        (true, _) => ("pass", r.verdict_label()),
    };
    let plot = r.plot.as_ref().map(|p| format!("<a href=\"{0}\">plot</a>", escape(p))).unwrap_or_default();
    // Numbers short in their cells, exact in the cell's title.
    let number = |short: String, exact: String| format!("<td class=\"n\" title=\"{}\">{}</td>", escape(&exact), escape(&short));
    let growth = number(super::format::short_bytes(r.figures.retained_growth_bytes, true), super::signed_bytes(r.figures.retained_growth_bytes));
    let rate = r.figures.bytes_per_iteration.map(|rate| rate.round().max(0.0) as i64);
    let rate = number(rate.map(|b| super::format::short_bytes(b, false)).unwrap_or_default(), rate.map(|b| super::bytes(b as u64)).unwrap_or_default());
    let peak = match r.figures.peak_bytes {
        Some(p) => number(super::format::short_bytes(p.max(0), false), super::bytes(p.max(0) as u64)),
        None => number("–".into(), "this layer is counted by level: no peak is kept".into()),
    };
    let layer = if r.layer.is_empty() { r.device.clone() } else { r.layer.clone() };
    let place = match &r.body {
        Some(body) => format!("{layer} (body on {body})"),
        None => layer,
    };
    format!(
        "<tr class=\"{}\" data-stem=\"{}\" data-run=\"{}\" data-written=\"{}\" data-verdict=\"{}\" data-failing=\"{}\"><td><a href=\"{}.html\">{}</a></td><td class=\"l\">{}</td><td class=\"{class}\">{}</td>{growth}{rate}{peak}<td>{}</td><td>{}</td><td>{plot}</td><td><a href=\"{}.json\">json</a></td></tr>\n",
        if current { "current" } else { "stale" },
        escape(&r.stem),
        escape(&r.run),
        r.written_at,
        escape(&r.count_key()),
        u8::from(!r.passed && !r.expected_failure),
        escape(&r.stem),
        escape(&r.test),
        escape(&place),
        escape(&verdict) + if current { "" } else { " (stale)" },
        escape(r.figures.baseline.as_deref().unwrap_or("")),
        escape(r.figures.site.as_deref().unwrap_or("")),
        escape(&r.stem),
    )
}

/// What the page's script does to rows appended after it was rendered: the
/// same rules as [`render`] (newest row per report; the run of the last row
/// written is the current one; stale rows marked; failures first, then by
/// test and device; counts of the current run by verdict).
const PAGE_SCRIPT: &str = r#"<script>
document.addEventListener("DOMContentLoaded", () => {
  const table = document.getElementById("reports");
  const rows = [...table.querySelectorAll("tr[data-stem]")];
  if (rows.length <= Number(table.dataset.rendered)) return;
  const newest = new Map();
  for (const row of rows) newest.set(row.dataset.stem, row);
  for (const row of rows) if (newest.get(row.dataset.stem) !== row) row.remove();
  const kept = [...newest.values()];
  const run = rows[rows.length - 1].dataset.run;
  const current = kept.filter((row) => row.dataset.run === run);
  for (const row of kept) {
    const stale = row.dataset.run !== run;
    if (stale && row.classList.contains("current")) {
      row.classList.replace("current", "stale");
      row.cells[2].textContent += " (stale)";
    }
  }
  const key = (row) => [row.dataset.run !== run ? 1 : 0, row.dataset.failing === "1" ? 0 : 1, row.cells[0].textContent, row.cells[1].textContent];
  kept.sort((a, b) => { const x = key(a), y = key(b); for (let i = 0; i < 4; i++) { if (x[i] < y[i]) return -1; if (x[i] > y[i]) return 1; } return 0; });
  for (const row of kept) table.tBodies[0].appendChild(row);
  const counts = new Map();
  for (const row of current) counts.set(row.dataset.verdict, (counts.get(row.dataset.verdict) || 0) + 1);
  const latest = Math.max(0, ...current.map((row) => Number(row.dataset.written)));
  const stale = kept.length - current.length;
  const summary = [...counts].sort().map(([verdict, n]) => `${n} ${verdict}`).join(", ") || "none";
  document.getElementById("run").innerHTML = `Latest run: ${current.length} tests, written up to <time data-unix="${latest}">${new Date(latest * 1000).toISOString().slice(0, 19).replace("T", " ")}</time> (UTC): ${summary}.` + (stale > 0 ? ` ${stale} rows from earlier runs are marked stale.` : "");
});
</script>
"#;

/// The whole page for `rows` (one per report) with `run` current: counts by
/// verdict, then a row per report, failures first, rows from earlier runs
/// marked stale. `rows_size` goes into the page's mark.
fn render(rows: &[IndexRow], run: &str, rows_size: u64) -> String {
    let mut rows: Vec<&IndexRow> = rows.iter().collect();
    let current = |r: &IndexRow| r.run == run;
    rows.sort_by(|a, b| {
        let failing = |r: &IndexRow| r.passed || r.expected_failure;
        (!current(a), failing(a), &a.test, &a.device).cmp(&(!current(b), failing(b), &b.test, &b.device))
    });
    let mut counts: BTreeMap<String, usize> = Default::default();
    for r in rows.iter().filter(|r| current(r)) {
        *counts.entry(r.count_key()).or_default() += 1;
    }
    let latest = rows.iter().filter(|r| current(r)).map(|r| r.written_at).max().unwrap_or(0);
    let counts: Vec<String> = counts.iter().map(|(verdict, n)| format!("{n} {verdict}")).collect();
    let stale = rows.iter().filter(|r| !current(r)).count();
    let mut html = format!(
        "<!doctype html>\n{PAGE_MARK}{rows_size} bytes -->\n<meta charset=\"utf-8\">\n<title>gpu-leak-test reports</title>\n<style>\
         body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}}\
         td.n{{white-space:nowrap;text-align:right;font-variant-numeric:tabular-nums}}td.l{{white-space:nowrap}}.fail{{color:#b00020;font-weight:bold}}.pass{{color:#1b7e2a}}.expected{{color:#7a5c00}}tr.stale{{color:#999}}</style>\n{PAGE_SCRIPT}\
         <h1>gpu-leak-test reports</h1>\n<p id=\"run\">Latest run: {} tests, written up to <time data-unix=\"{latest}\">{}</time> (UTC): {}.{}</p>\n<table id=\"reports\" data-rendered=\"{}\">\n\
         <tr><th>test</th><th>layer</th><th>verdict</th><th>growth (judged window)</th><th>per iteration</th><th>peak</th><th>baseline</th><th>site</th><th>plot</th><th>report</th></tr>\n",
        rows.iter().filter(|r| current(r)).count(),
        utc(latest),
        if counts.is_empty() { "none".to_string() } else { counts.join(", ") },
        if stale > 0 { format!(" {stale} rows from earlier runs are marked stale.") } else { String::new() },
        rows.len(),
    );
    for r in rows {
        html.push_str(&row_html(r, current(r)));
    }
    // The table stays open: later rows are appended to it.
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

    fn row(stem: &str, run: &str, written_at: u64) -> IndexRow {
        IndexRow {
            stem: stem.into(),
            test: stem.into(),
            device: "cpu".into(),
            layer: "cpu".into(),
            body: None,
            verdict: "clean".into(),
            passed: true,
            expected_failure: false,
            figures: RowFigures { peak_bytes: Some(0), ..RowFigures::default() },
            plot: None,
            run: run.into(),
            written_at,
        }
    }

    /// A folder of the test's own, removed as the test ends, pass or fail.
    fn scratch() -> tempfile::TempDir {
        tempfile::Builder::new().prefix("gpu-leak-test-index-").tempdir().unwrap()
    }

    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(1_796_020_730), "2026-11-30 06:38:50");
    }

    #[test]
    fn a_newer_row_of_a_report_supersedes_the_older_in_place() {
        let rows = newest_per_report([row("a", "1", 1), row("b", "1", 2), row("a", "2", 3)]);
        let seen: Vec<(&str, &str)> = rows.iter().map(|r| (r.stem.as_str(), r.run.as_str())).collect();
        assert_eq!(seen, [("a", "2"), ("b", "1")]);
    }

    #[test]
    fn rows_are_appended_until_the_rows_file_doubles_then_compacted_to_one_per_report() {
        let dir = scratch();
        let dir = dir.path();
        // 20 reports rewritten run after run: the files stay within twice
        // their compacted size plus the slack.
        let mut largest = 0;
        for run in 0..400 {
            for test in 0..20 {
                add_row(dir, row(&format!("test_{test:02}"), &format!("run{run}"), run)).unwrap();
            }
            largest = largest.max(std::fs::metadata(dir.join("index.rows")).unwrap().len());
        }
        let one_run = read_rows(&dir.join("index.rows")).unwrap();
        assert_eq!(one_run.len(), 20, "one row per report");
        let compacted: u64 = one_run.iter().map(|r| serde_json::to_string(r).unwrap().len() as u64 + 1).sum();
        assert!(largest <= 2 * compacted + COMPACTION_SLACK + 512, "index.rows reached {largest} bytes");
        let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
        assert!(page.matches("<tr class=").count() <= 20 * ((2 * compacted + COMPACTION_SLACK) / compacted + 1) as usize);
        assert!(page.contains("run399") && compacted_size(&dir.join("index.html")).is_some());
    }

    #[test]
    fn a_page_of_an_older_format_is_rendered_whole_on_the_next_row() {
        let dir = scratch();
        let dir = dir.path();
        std::fs::write(dir.join("index.html"), "<!doctype html>\n<table><tr><td>older-format-row</td></tr></table>\n").unwrap();
        add_row(dir, row("new", "1", 1)).unwrap();
        let page = std::fs::read_to_string(dir.join("index.html")).unwrap();
        assert!(page.contains(PAGE_MARK) && !page.contains("older-format-row") && page.contains("1 tests"), "{page}");
    }

    #[test]
    fn a_merge_refuses_a_stem_that_is_a_path_and_writes_nothing_outside_its_folder() {
        let root = scratch();
        let (input, out) = (root.path().join("in"), root.path().join("out"));
        std::fs::create_dir_all(&input).unwrap();
        let victim = root.path().join("merge_hostile_victim.json");
        std::fs::write(&victim, "keep me").unwrap();
        add_row(&input, row("fine", "1", 1)).unwrap();
        // The victim by a relative path from `out`, and by its absolute one.
        let absolute = root.path().join("merge_hostile_victim").to_string_lossy().into_owned();
        for stem in ["../merge_hostile_victim", absolute.as_str(), "..", ".hidden", "a/b", ""] {
            let rows = input.join("index.rows");
            let hostile = serde_json::to_string(&IndexRow { stem: stem.into(), ..row("hostile", "1", 2) }).unwrap();
            std::fs::write(&rows, format!("{}\n{hostile}\n", serde_json::to_string(&row("fine", "1", 1)).unwrap())).unwrap();
            std::fs::write(input.join(format!("{}.json", stem.replace('/', "_"))), "{}").unwrap();
            let err = merge_into(&out, std::slice::from_ref(&input)).unwrap_err();
            assert!(err.contains("is not a report's file name") && err.contains(&format!("{stem:?}")), "{err}");
            assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me", "{stem}");
        }
        assert!(is_plain_stem("row1_keeps_losses.cuda0.011929d9"));
    }

    #[test]
    fn a_merge_keeps_each_row_s_baseline_change() {
        let (a, b, out) = (scratch(), scratch(), scratch());
        let (a, b, out) = (a.path().to_path_buf(), b.path().to_path_buf(), out.path());
        let mut over = row("x", "1", 1);
        over.figures.baseline = Some("over: cuda:0 iteration peak +40000 B (+10.0%)".into());
        add_row(&a, over).unwrap();
        let mut pending = row("y", "2", 2);
        pending.figures.baseline = Some("pending".into());
        add_row(&b, pending).unwrap();
        merge_into(out, &[a, b]).unwrap();
        let merged = read_rows(&out.join("index.rows")).unwrap();
        let baselines: Vec<Option<&str>> = merged.iter().map(|r| r.figures.baseline.as_deref()).collect();
        assert_eq!(baselines, [Some("over: cuda:0 iteration peak +40000 B (+10.0%)"), Some("pending")]);
        let page = std::fs::read_to_string(out.join("index.html")).unwrap();
        assert!(page.contains("<td>over: cuda:0 iteration peak +40000 B (+10.0%)</td>"), "{page}");
    }
}
