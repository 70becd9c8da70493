//! `gpu-leak-test-annotate DIR...`: prints a GitHub Actions annotation for
//! every failing leak test whose report is in DIR (a runner's
//! `target/gpu-leak-test`, or a merged folder), on the line that holds its
//! memory. For a step after `cargo nextest run`, which indents what tests
//! print, so their own annotations do not reach the log at the start of a
//! line. Paths are from `GITHUB_WORKSPACE`, else the current folder.
use gpu_leak_test::report::{ci, json};
use std::path::PathBuf;

fn main() {
    let dirs: Vec<PathBuf> = std::env::args_os().skip(1).map(Into::into).collect();
    if dirs.is_empty() {
        eprintln!("usage: gpu-leak-test-annotate DIR...\n  prints an ::error annotation for each failing report in DIR...");
        std::process::exit(2);
    }
    let workspace = std::env::var_os("GITHUB_WORKSPACE")
        .filter(|w| !w.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::current_dir().unwrap_or_default());
    let mut failing = 0;
    for dir in &dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(why) => {
                eprintln!("gpu-leak-test-annotate: {}: {why}", dir.display());
                std::process::exit(1);
            }
        };
        let mut paths: Vec<PathBuf> =
            entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|e| e == "json")).collect();
        paths.sort();
        for path in paths {
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            // Other JSON beside the reports (none is written today) is not a report.
            let Ok(file) = json::from_json(&text) else { continue };
            if let Some(annotation) = ci::annotation(&file.report, &workspace) {
                println!("{annotation}");
                failing += 1;
            }
        }
    }
    eprintln!("gpu-leak-test-annotate: {failing} failing leak tests annotated");
}
