//! `gpu-leak-test-annotate DIR...`: prints a GitHub Actions annotation for
//! every failing leak test whose report is in DIR (a runner's
//! `target/gpu-leak-test`, or a merged folder), on the line that holds its
//! memory. For a step after `cargo nextest run`, which indents what tests
//! print, so their own annotations do not reach the log at the start of a
//! line. Paths are from `GITHUB_WORKSPACE`, else the current folder.
//!
//! Every report it cannot read is named; it exits 1 where one of them may
//! be a failing test's (the folder's index does not say it passed).
use gpu_leak_test::report::ci;
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
    let mut found = ci::Annotations::default();
    for dir in &dirs {
        if let Err(why) = ci::annotate_dir(dir, &workspace, &mut found) {
            eprintln!("gpu-leak-test-annotate: cannot list {}: {why}", dir.display());
            std::process::exit(1);
        }
    }
    for line in &found.lines {
        println!("{line}");
    }
    eprintln!("gpu-leak-test-annotate: {} failing leak tests annotated", found.lines.len());
    for (path, why, failed) in &found.unreadable {
        let known = match failed {
            Some(true) => "the index says this test failed",
            Some(false) => "the index says this test passed",
            None => "the index does not list it",
        };
        eprintln!("gpu-leak-test-annotate: cannot read the report {} ({why}); {known}", path.display());
    }
    if found.may_hide_a_failure() {
        eprintln!(
            "gpu-leak-test-annotate: a report it could not read may hold a failure; run the tests again to write it whole"
        );
        std::process::exit(1);
    }
}
