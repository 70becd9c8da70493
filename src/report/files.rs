//! Writing reports beside the build: `<dir>/<test>.json` and its page for
//! every leak test, `<dir>/<test>.svg` for failing ones (or all, on
//! request), and its row in the folder's index (`super::index`). Each file is
//! written to a temporary name and renamed, so a reader never sees half a
//! file; a failed write is a warning and never changes a verdict.
use crate::layer::device_name;
use super::json;
use crate::disk::{append, create_folder, fnv1a, write_atomically};
use super::{svg, Report};
use crate::config::Plots;
use std::path::{Path, PathBuf};

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
    let manifest_dir = crate::protocol::crate_folder(None)?;
    let is_workspace = |dir: &Path| {
        std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|text| text.lines().any(|l| l.trim() == "[workspace]"))
    };
    let outermost = manifest_dir.ancestors().filter(|dir| is_workspace(dir)).last().map(Path::to_path_buf);
    Some(outermost.unwrap_or(manifest_dir))
}

/// The readable part of a file name keeps at most this many characters; the
/// hash after it keeps names unique.
const READABLE_NAME_CHARS: usize = 100;

/// A file name for a test on a device (`row1_keeps_losses.cuda0.3f9a61c2`):
/// the readable test name (letters, digits, `-`, `_`, shortened), the device
/// (the same test runs on the CPU and on CUDA), and a hash of the crate, the
/// test binary, the full test name and the device, so that names alike
/// after cleaning (`_x` and `x`, two Unicode names, two tests of one name in
/// two binaries) and long names never share a file.
pub fn file_stem(test: &str, device: &str) -> String {
    file_stem_in(&crate::test_binary::TestBinary::current().identity(), test, device)
}

/// [`file_stem`] for a test binary named by `identity`.
fn file_stem_in(identity: &str, test: &str, device: &str) -> String {
    let clean: String = test.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let clean: String = clean.trim_matches('_').chars().take(READABLE_NAME_CHARS).collect();
    let readable = if clean.is_empty() { "leak_test".to_string() } else { clean };
    let hash = fnv1a(&format!("{identity}\0{test}\0{device}"));
    format!("{readable}.{}.{:08x}", device.replace(':', ""), hash as u32)
}

/// Writes the JSON report, the plot when `plots` asks for one, and the
/// refreshed index. Errors say which file and why.
pub fn write_report(report: &Report, dir: &Path, plots: Plots) -> crate::Result<ReportFiles> {
    write_report_files(report, dir, plots).map_err(|message| crate::Error::ReportFiles { message })
}

fn write_report_files(report: &Report, dir: &Path, plots: Plots) -> Result<ReportFiles, String> {
    create_folder(dir)?;
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
    // A thinned report names the CSV that has every sample.
    let mut report = report.clone();
    if let Some(thinned) = &mut report.figures.thinned {
        let name = format!("{stem}.series.csv");
        let path = dir.join(&name);
        write_atomically(&path, thinned.csv.as_bytes()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        thinned.full_series = Some(name);
    }
    let report = &report;
    let text = json::to_json(report, plot_name.as_deref()).map_err(|e| format!("cannot serialise the report: {e}"))?;
    let json_path = dir.join(format!("{stem}.json"));
    write_atomically(&json_path, text.as_bytes()).map_err(|e| format!("cannot write {}: {e}", json_path.display()))?;
    let page = dir.join(format!("{stem}.html"));
    write_atomically(&page, super::page::render(report).as_bytes()).map_err(|e| format!("cannot write {}: {e}", page.display()))?;
    let index = super::index::add_row(dir, super::index::IndexRow::of(report, &stem, plot_name.as_deref()))?;
    Ok(ReportFiles { json: json_path, plot, index, page })
}

/// Appends one line to `file` (GPU_LEAK_TEST_TIMINGS): the test's wall
/// time from the start of `check*` to its files written (`total`), and where
/// it went. `other` is the rest: verdicts, building the report, releasing
/// the locks, in one [`append`].
pub(crate) fn append_timing(file: &Path, report: &Report, report_writing: std::time::Duration, total: std::time::Duration) {
    let time = &report.context.harness_time;
    let parts = [time.body, time.waiting, time.prewarm, time.sampling, time.attribution, report_writing];
    let other = parts.iter().fold(total, |left, part| left.saturating_sub(*part));
    let line = serde_json::json!({
        "test": report.test,
        "device": device_name(report.device),
        "scope": report.context.scope,
        "verdict": report.verdict.label(),
        "total": total.as_secs_f64(),
        "body": time.body.as_secs_f64(),
        "waiting": time.waiting.as_secs_f64(),
        "prewarm": time.prewarm.as_secs_f64(),
        "cuda_startup": time.cuda_startup.as_secs_f64(),
        "prewarm_settings": time.prewarm_parts.settings.as_secs_f64(),
        "prewarm_libtorch_check": time.prewarm_parts.libtorch_check.as_secs_f64(),
        "prewarm_cpu_size_table": time.prewarm_parts.cpu_size_table.as_secs_f64(),
        "prewarm_cuda_state": time.prewarm_parts.cuda_state.as_secs_f64(),
        "cuda_state_cublas_here": time.prewarm_parts.cuda_state_by_part.cublas_here.as_secs_f64(),
        "cuda_state_callers_queue": time.prewarm_parts.cuda_state_by_part.callers_queue.as_secs_f64(),
        "cuda_state_waiting_beside": time.prewarm_parts.cuda_state_by_part.waiting_beside.as_secs_f64(),
        "cuda_state_autograd_worker": time.prewarm_parts.cuda_state_by_part.autograd_worker.as_secs_f64(),
        "cuda_state_device_queue": time.prewarm_parts.cuda_state_by_part.device_queue.as_secs_f64(),
        "prewarm_nvml_and_cupti": time.prewarm_parts.nvml_and_cupti.as_secs_f64(),
        "prewarm_sources": time.prewarm_parts.sources.as_secs_f64(),
        "prewarm_canaries": time.prewarm_parts.canaries.as_secs_f64(),
        "canary_tensors": time.prewarm_parts.canaries_by_layer.tensors.as_secs_f64(),
        "canary_host_objects": time.prewarm_parts.canaries_by_layer.host_objects.as_secs_f64(),
        "canary_outside_libtorch": time.prewarm_parts.canaries_by_layer.outside_libtorch.as_secs_f64(),
        "canary_rust_heap": time.prewarm_parts.canaries_by_layer.rust_heap.as_secs_f64(),
        "sampling": time.sampling.as_secs_f64(),
        "sampling_settle": time.sampling_parts.settle.as_secs_f64(),
        "sampling_synchronize": time.sampling_parts.synchronize.as_secs_f64(),
        "sampling_driver": time.sampling_parts.driver.as_secs_f64(),
        "sampling_host_heap": time.sampling_parts.host_heap.as_secs_f64(),
        "attribution": time.attribution.as_secs_f64(),
        "attribution_naming": time.attribution_naming.as_secs_f64(),
        "report_writing": report_writing.as_secs_f64(),
        "other": other.as_secs_f64(),
        // Before this process started, so in none of the parts above.
        "waited_in_parent": crate::isolation::waited_in_parent().as_secs_f64(),
        // When the line was written, on the wall clock: it places the line
        // in a runner's stamped log, a child's that shares a name too.
        "ended_unix": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64(),
    })
    .to_string()
        + "\n";
    if let Err(why) = append(file, &line) {
        eprintln!("gpu-leak-test: warning: cannot append to {} ({why}); set {} to a writable file", file.display(), crate::config::TIMINGS_VAR);
    }
}

/// Writes the report's files where `settings` say, setting
/// [`Report::files`]; a failure to write is a warning on stderr, since the
/// verdict stands without them.
pub(crate) fn write_or_warn(report: &mut Report, settings: &crate::config::Settings) {
    let dir = settings.report_dir.clone().unwrap_or_else(default_report_dir);
    match write_report(report, &dir, settings.plots) {
        Ok(files) => report.files = Some(files),
        Err(why) => eprintln!(
            "gpu-leak-test: warning: {}: the report was not written ({why}); the verdict stands. \
             Set GPU_LEAK_TEST_REPORT_DIR to a writable folder.",
            report.test
        ),
    }
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
    fn a_report_folder_that_is_a_looping_link_is_named_as_one() {
        let dir = std::env::temp_dir().join(format!("glt-loop-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        std::os::unix::fs::symlink(&dir, &dir).unwrap();
        let err = create_folder(&dir.join("reports")).unwrap_err();
        let direct = create_folder(&dir).unwrap_err();
        std::fs::remove_file(&dir).unwrap();
        assert!(direct.contains("is a symbolic link that leads to no folder"), "{direct}");
        assert!(err.starts_with("cannot create"), "{err}");
    }
}

