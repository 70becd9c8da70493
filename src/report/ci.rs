//! What a CI job shows of a failing leak test, under GitHub Actions: an
//! annotation on the line that holds the memory (its biggest retained site,
//! else the test), which the pull request's diff shows on that line, and a
//! row of the job summary. Printing only: the verdict is decided elsewhere.
//!
//! A failing test prints its annotation itself, which reaches the log at
//! the start of a line under `cargo test`. nextest indents what tests
//! print, so there the `gpu-leak-test-annotate` step prints them from the
//! reports after the run. Each test appends its own summary row under
//! either runner.
use super::format::per_iteration_bytes;
use super::Report;
use crate::verdict::Verdict;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Where the job runs, from GitHub Actions' variables; `None` outside it.
#[derive(Debug, Clone)]
pub struct GithubActions {
    /// The repository's checkout (`GITHUB_WORKSPACE`): annotations name
    /// paths from here.
    pub workspace: PathBuf,
    /// The job summary file (`GITHUB_STEP_SUMMARY`), where set.
    pub summary: Option<PathBuf>,
}

impl GithubActions {
    /// `Some` where `GITHUB_ACTIONS=true`. The workspace defaults to the
    /// current folder, as the job's steps start there.
    pub fn from_env() -> Option<GithubActions> {
        if std::env::var("GITHUB_ACTIONS").ok()?.trim() != "true" {
            return None;
        }
        let workspace = std::env::var_os("GITHUB_WORKSPACE")
            .filter(|w| !w.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::current_dir().ok())?;
        let summary = std::env::var_os("GITHUB_STEP_SUMMARY").filter(|s| !s.is_empty()).map(PathBuf::from);
        Some(GithubActions { workspace, summary })
    }
}

/// The `file:line` the report points at: its verdict layer's biggest site
/// where one was named, else the test itself. The path is from
/// `workspace` where the file is inside it.
pub fn place(report: &Report, workspace: &Path) -> Option<(String, u32)> {
    let location = report.top_site().and_then(|site| site.location.clone()).or_else(|| report.context.location.clone())?;
    let (file, line) = location.rsplit_once(':')?;
    let line: u32 = line.parse().ok()?;
    let absolute = match &report.context.crate_root {
        Some(root) if Path::new(file).is_relative() => Path::new(root).join(file),
        _ => PathBuf::from(file),
    };
    let shown = match absolute.strip_prefix(workspace) {
        Ok(inside) => inside.to_path_buf(),
        Err(_) => absolute,
    };
    Some((shown.to_string_lossy().replace('\\', "/"), line))
}

/// One line of what failed: the verdict, its bytes per iteration where it
/// is a leak, and where.
pub fn headline(report: &Report) -> String {
    let place = super::text::place(report);
    match &report.verdict {
        Verdict::Leak(leak) => format!("leak: {} per iteration on {place}", per_iteration_bytes(leak.bytes_per_iteration)),
        other => format!("{} on {place}", other.label()),
    }
}

/// The workflow command that annotates the report's line:
/// `::error file=…,line=…,title=…::…`. `None` for a passing report, or one
/// whose failure is expected.
pub fn annotation(report: &Report, workspace: &Path) -> Option<String> {
    if report.passed() || report.context.expected_failure {
        return None;
    }
    let place = place(report, workspace)
        .map(|(file, line)| format!("file={},line={line},", escape_property(&file)))
        .unwrap_or_default();
    Some(format!("::error {place}title={}::{}", escape_property(&report.test), escape_data(&headline(report))))
}

/// What `gpu-leak-test-annotate` found in report folders.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Annotations {
    /// One workflow command per failing report, in file order.
    pub lines: Vec<String>,
    /// Each `.json` that could not be read as a report, with why, and
    /// whether the folder's index says that report failed (`None`: the
    /// index does not list it).
    pub unreadable: Vec<(PathBuf, String, Option<bool>)>,
}

impl Annotations {
    /// A report that could not be read and was not known to pass: a
    /// failure may be hidden in it, so the step must fail.
    pub fn may_hide_a_failure(&self) -> bool {
        self.unreadable.iter().any(|(_, _, failed)| *failed != Some(false))
    }
}

/// Reads every report (`*.json`) in `dir` and collects the annotations of
/// the failing ones, and every file it could not read. An error names the
/// folder that could not be listed.
pub fn annotate_dir(dir: &Path, workspace: &Path, found: &mut Annotations) -> std::io::Result<()> {
    let failed_by_stem = super::index::failed_by_stem(dir);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    paths.sort();
    for path in paths {
        let read = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|text| super::json::from_json(&text).map_err(|e| e.to_string()));
        match read {
            Ok(file) => found.lines.extend(annotation(&file.report, workspace)),
            Err(why) => {
                let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
                found.unreadable.push((path, why, failed_by_stem.get(&stem).copied()));
            }
        }
    }
    Ok(())
}

/// The job summary's row for a failing report.
pub fn summary_row(report: &Report, workspace: &Path) -> String {
    let verdict = match &report.verdict {
        Verdict::Leak(leak) => format!("leak, {} per iteration", per_iteration_bytes(leak.bytes_per_iteration)),
        other => other.label().to_string(),
    };
    let site = place(report, workspace).map(|(file, line)| format!("`{file}:{line}`")).unwrap_or_default();
    let page = report
        .files
        .as_ref()
        .map(|files| format!("[report]({})", link_target(&files.page.display().to_string())))
        .unwrap_or_default();
    let cell = |text: &str| text.replace('|', "\\|").replace('\n', " ");
    format!(
        "| `{}` | {} | {} | {} | {} |\n",
        cell(&report.test),
        cell(&verdict),
        cell(&super::text::place(report)),
        cell(&site),
        page
    )
}

/// A path as a Markdown link's target, on one line of a table row: what
/// would end the link, the cell or the line is percent-encoded.
fn link_target(path: &str) -> String {
    path.chars()
        .map(|c| match c {
            ' ' | '\n' | '\r' | '(' | ')' | '|' | '<' | '>' | '`' | '[' | ']' => format!("%{:02X}", c as u32),
            c => c.to_string(),
        })
        .collect()
}

const SUMMARY_HEADER: &str =
    "\n### gpu-leak-test: failing leak tests\n\n| test | verdict | where | site | page |\n| --- | --- | --- | --- | --- |\n";

/// GitHub Actions shows at most 1 MiB of a step's summary: the header is
/// looked for no further.
const SUMMARY_READ_LIMIT: u64 = 1 << 20;

/// Appends `row` to the job summary, with the table's header where this
/// file has none yet. Tests append from many processes at once: the file
/// is locked around the check and the write, so rows never interleave and
/// the header is written once.
///
/// Only a regular file is written: a device or a pipe (`/dev/full`,
/// `/dev/stdout` under a runner) is an error, which the caller shows as a
/// warning, since reading one for the header could wait or grow forever.
/// At most 1 MiB is read to find the header.
pub fn append_summary_row(summary: &Path, row: &str) -> std::io::Result<()> {
    use std::io::Read as _;
    use std::os::fd::AsRawFd as _;
    match std::fs::metadata(summary) {
        Ok(meta) if !meta.is_file() => {
            return Err(std::io::Error::other(format!("{} is not a regular file; GITHUB_STEP_SUMMARY names one", summary.display())));
        }
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(summary)?;
    // SAFETY: flock on a file descriptor this function owns; released when
    // the file closes.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut head = Vec::new();
    std::fs::File::open(summary)?.take(SUMMARY_READ_LIMIT).read_to_end(&mut head)?;
    let has_header = String::from_utf8_lossy(&head).contains(SUMMARY_HEADER.trim_start());
    let text = if has_header { row.to_string() } else { format!("{SUMMARY_HEADER}{row}") };
    file.write_all(text.as_bytes())
}

/// What a failing test shows under GitHub Actions: its annotation, and its
/// summary row. Nothing outside GitHub Actions, or for a passing report.
pub(crate) fn show(report: &Report) {
    let Some(actions) = GithubActions::from_env() else { return };
    let Some(annotation) = annotation(report, &actions.workspace) else { return };
    println!("{annotation}");
    if let Some(summary) = &actions.summary {
        if let Err(why) = append_summary_row(summary, &summary_row(report, &actions.workspace)) {
            eprintln!("gpu-leak-test: warning: the job summary {} was not written: {why}", summary.display());
        }
    }
}

/// Workflow commands end their message at a newline, and `%` escapes.
fn escape_data(text: &str) -> String {
    text.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

/// Properties also end at `,` and `:`.
fn escape_property(text: &str) -> String {
    escape_data(text).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_folder_with_a_newline_or_a_bar_stays_one_link_in_one_cell() {
        assert_eq!(link_target("/tmp/a b\nc|d(e).html"), "/tmp/a%20b%0Ac%7Cd%28e%29.html");
    }

    #[test]
    fn a_summary_that_is_no_regular_file_is_an_error_at_once_not_a_read_without_end() {
        let started = std::time::Instant::now();
        let err = append_summary_row(Path::new("/dev/full"), "| row |\n").unwrap_err();
        assert!(err.to_string().contains("/dev/full is not a regular file"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    #[test]
    fn an_unreadable_report_is_named_and_fails_the_step_unless_the_index_says_it_passed() {
        let dir = std::env::temp_dir().join(format!("glt-annotate-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cut.cpu.00000001.json"), "{\"schema\": 3, \"report\": {\"test\": \"cu").unwrap();
        let mut found = Annotations::default();
        annotate_dir(&dir, &dir, &mut found).unwrap();
        assert!(found.lines.is_empty());
        assert_eq!(found.unreadable.len(), 1);
        assert!(found.unreadable[0].0.ends_with("cut.cpu.00000001.json") && found.unreadable[0].2.is_none());
        assert!(found.may_hide_a_failure());
        // The index says it passed: named, but no failure is hidden.
        let row = r#"{"stem":"cut.cpu.00000001","test":"cut","device":"cpu","verdict":"clean","passed":true,"expected_failure":false,"retained_growth_bytes":0,"bytes_per_iteration":null,"peak_bytes":null,"site":null,"plot":null,"run":"r","written_at":0}"#;
        std::fs::write(dir.join("index.rows"), format!("{row}\n")).unwrap();
        let mut found = Annotations::default();
        annotate_dir(&dir, &dir, &mut found).unwrap();
        assert_eq!(found.unreadable[0].2, Some(false));
        assert!(!found.may_hide_a_failure());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn properties_escape_what_ends_them_and_messages_keep_one_line() {
        assert_eq!(escape_property("a::b, c%"), "a%3A%3Ab%2C c%25");
        assert_eq!(escape_data("line\nnext: 50%"), "line%0Anext: 50%25");
    }

    #[test]
    fn summary_rows_append_under_one_header_from_many_threads() {
        let dir = std::env::temp_dir().join(format!("glt-summary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let summary = dir.join("summary.md");
        let _ = std::fs::remove_file(&summary);
        std::thread::scope(|scope| {
            for i in 0..16 {
                let summary = &summary;
                scope.spawn(move || append_summary_row(summary, &format!("| `t{i}` | leak | cpu | | |\n")).unwrap());
            }
        });
        let text = std::fs::read_to_string(&summary).unwrap();
        assert_eq!(text.matches("| test | verdict |").count(), 1, "{text}");
        assert_eq!(text.lines().filter(|l| l.starts_with("| `t")).count(), 16, "{text}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
