//! A process of its own for every `#[gpu_leak_test]` under `cargo test`.
//!
//! cargo nextest gives each test a process, where process scope counts every
//! thread and nothing another test does can land in the count. libtest runs
//! tests as threads of one process; there a leak made on a thread the test
//! spawned would go unseen in thread scope, and a thread one test leaves
//! running would be counted against the next. So under libtest (any number
//! of test threads) a leak test made by the attribute re-runs its own test
//! binary for that one test (`NAME --exact --test-threads=1`), which is how
//! nextest runs it too: same scope, same verdict, same first line.
//!
//! The parent relays the child's output and its verdict: it panics with the
//! child's report where the child's verdict failed (so `#[should_panic]` and
//! the index see what they would in one process), and a child that crashes,
//! aborts or is killed fails the test with its exit status and output.
//!
//! Only a check that is the whole test can move into a child, since the
//! child re-runs the whole test function: the attribute's expansion is
//! ([`crate::LeakTest::for_test_function`]). A hand-written `LeakTest::new`
//! check runs where it is called, and `scope = "thread"` keeps a test in
//! its thread by choice.
//!
//! rusty-fork (proptest's) forks the same way, but it names the child test
//! from `module_path!()` and its own macro; here the name is libtest's own
//! (the test thread's), rstest cases included, and the verdict must travel
//! back as data, not as an exit code, so `#[should_panic]` keeps working.
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Set in a child to the file its verdict goes to.
const CHILD_VAR: &str = "GPU_LEAK_TEST_CHILD_RESULT";

/// How the child's test ended, as it writes it for the parent.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) enum ChildOutcome {
    /// Passed, or skipped (the skip line is in its output).
    Passed,
    /// Failed: the panic message, the report.
    Failed(String),
}

/// True in a child process made by [`run_in_child`].
pub(crate) fn is_child() -> bool {
    std::env::var_os(CHILD_VAR).is_some()
}

/// In a child: writes the outcome for the parent and ends the process
/// without unwinding, so libtest prints nothing after it and the parent's
/// relay carries the test's own output only. Returns where this is no child.
pub(crate) fn finish_child(outcome: &ChildOutcome) {
    let Some(path) = std::env::var_os(CHILD_VAR) else { return };
    let written = serde_json::to_vec(outcome).map_err(|e| e.to_string()).and_then(|json| {
        // Written beside and renamed, so the parent never reads half a file.
        let partial = PathBuf::from(format!("{}.partial", Path::new(&path).display()));
        std::fs::write(&partial, json).and_then(|()| std::fs::rename(&partial, &path)).map_err(|e| e.to_string())
    });
    let ok = written.is_ok();
    if let Err(why) = written {
        eprintln!("gpu-leak-test: could not hand the verdict to the parent process ({why})");
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: ends the process at once; the report files are written and
    // closed, and skipping libtorch's static destructors is what the parent
    // wants (they can crash at exit on some CUDA drivers).
    unsafe { libc::_exit(if ok { 0 } else { 101 }) }
}

/// The libtest name to re-run in a child, where this check should move
/// into one: under libtest (not nextest, not a child already), for a check
/// that is the whole test, outside thread scope.
pub(crate) fn child_test_name(libtest_name: Option<&str>, runner: crate::scope::Runner, thread_scope: bool) -> Option<String> {
    if is_child() || runner.process_per_test || thread_scope {
        return None;
    }
    libtest_name.map(str::to_string)
}

/// Runs the test `name` of this test binary in a process of its own and
/// relays its output. Returns the child's outcome; `None` where the binary
/// has no libtest test of that name (it ran none); or why the child ended
/// without a verdict (its exit status and output).
pub(crate) fn run_in_child(name: &str) -> Result<Option<ChildOutcome>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the test binary's path is unknown ({e})"))?;
    let scratch = Scratch::new();
    let output = std::fs::File::create(&scratch.output).map_err(|e| format!("{}: {e}", scratch.output.display()))?;
    let stderr = output.try_clone().map_err(|e| e.to_string())?;
    let status = Command::new(&exe)
        .args([name, "--exact", "--test-threads=1", "--nocapture", "--include-ignored"])
        .env(CHILD_VAR, &scratch.result)
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(stderr)
        .status()
        .map_err(|e| format!("could not start {} for this test ({e})", exe.display()))?;
    let mut text = String::new();
    let _ = std::fs::File::open(&scratch.output).and_then(|mut f| f.read_to_string(&mut text));
    let verdict = std::fs::read(&scratch.result);
    if verdict.is_err() && status.success() && text.lines().any(|line| line == "running 0 tests") {
        return Ok(None);
    }
    let relayed = without_libtest_lines(&text, name);
    // print! goes to libtest's capture: shown on failure or with --nocapture.
    print!("{relayed}");
    match verdict {
        Ok(json) => serde_json::from_slice(&json).map(Some).map_err(|e| format!("its verdict could not be read ({e})")),
        Err(_) => Err(format!(
            "the test's own process ({} {name} --exact) {} before it reached a verdict. Its output:\n{relayed}",
            exe.display(),
            describe(status)
        )),
    }
}

/// libtest's own lines around one test's output in the child.
fn without_libtest_lines(text: &str, name: &str) -> String {
    let ok_line = format!("test {name} ... ");
    let mut kept: Vec<&str> = Vec::new();
    for line in text.lines() {
        // With --nocapture the test's first line follows libtest's
        // `test NAME ... ` on the same line: keep it, from its start.
        if let Some(rest) = line.strip_prefix(&ok_line) {
            let status = ["ok", "FAILED", "ignored"].iter().any(|s| rest.starts_with(s));
            if !status && !rest.is_empty() {
                kept.push(rest);
            }
            continue;
        }
        let libtest = line == "running 1 test" || line == "running 0 tests" || line.starts_with("test result: ");
        if !libtest {
            kept.push(line);
        }
    }
    let body = kept.join("\n");
    let body = body.trim_matches('\n');
    if body.is_empty() {
        String::new()
    } else {
        format!("{body}\n")
    }
}

fn describe(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (_, Some(signal)) => format!("was killed by signal {signal}{}", signal_name(signal)),
        (Some(code), None) => format!("exited with status {code}"),
        (None, None) => "ended".into(),
    }
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGABRT => " (SIGABRT: an abort, such as a C++ exception nobody caught)",
        libc::SIGSEGV => " (SIGSEGV: a crash)",
        libc::SIGKILL => " (SIGKILL: killed, often by the out-of-memory killer)",
        libc::SIGBUS => " (SIGBUS: a crash)",
        _ => "",
    }
}

/// The child's output and verdict files, removed when the parent is done.
struct Scratch {
    output: PathBuf,
    result: PathBuf,
}

impl Scratch {
    fn new() -> Scratch {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let stem = format!("gpu-leak-test-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let dir = std::env::temp_dir();
        Scratch { output: dir.join(format!("{stem}.out")), result: dir.join(format!("{stem}.verdict")) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.output);
        let _ = std::fs::remove_file(&self.result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scope::tests::{CARGO_TEST, NEXTEST, ONE_THREAD};

    #[test]
    fn a_whole_test_moves_into_a_child_under_libtest_with_any_number_of_threads() {
        assert_eq!(child_test_name(Some("m::t"), CARGO_TEST, false).as_deref(), Some("m::t"));
        assert_eq!(child_test_name(Some("m::t"), ONE_THREAD, false).as_deref(), Some("m::t"));
    }

    #[test]
    fn nextest_thread_scope_and_hand_written_checks_stay_where_they_are() {
        assert_eq!(child_test_name(Some("m::t"), NEXTEST, false), None);
        assert_eq!(child_test_name(Some("m::t"), CARGO_TEST, true), None);
        assert_eq!(child_test_name(None, CARGO_TEST, false), None);
    }

    #[test]
    fn the_relay_drops_libtests_own_lines_and_keeps_the_tests() {
        let text = "\nrunning 1 test\npassed m::t: clean\n  hint: x\ntest m::t ... ok\n\ntest result: ok. 1 passed\n";
        assert_eq!(without_libtest_lines(text, "m::t"), "passed m::t: clean\n  hint: x\n");
        // The test's first line, printed after libtest's `test NAME ... `.
        let text = "\nrunning 1 test\ntest m::t ... ::error file=a.rs,line=1::leak\n";
        assert_eq!(without_libtest_lines(text, "m::t"), "::error file=a.rs,line=1::leak\n");
        assert_eq!(without_libtest_lines("\nrunning 1 test\n", "m::t"), "");
    }
}
