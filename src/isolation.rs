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
//!
//! Children that may start CUDA run at most [`CUDA_CHILDREN_AT_ONCE`] at a
//! time under one parent. libtest starts as many tests as it has threads,
//! and a dozen processes starting CUDA together each take seconds to do it;
//! the driver calls that follow wait on the others' start-ups too (on an
//! H200, 239 to 945 ms of the harness's own time against 23 to 54 ms for the
//! same tests one at a time). A child waits for its turn before it starts,
//! so its own figures are its own; the wait is in its timing line. It keeps
//! the turn for its whole life, not only through its start-up. Bodies and
//! sampling wait on one another too: where turns lasted only through the
//! start-up (machine-wide, with three parents at once), the children's own
//! harness time on an H200 had medians of 50-67 ms, and the whole suite's
//! went from 17-21 to 25-36 ms (benches/RESULTS.md).
//!
//! The child dies with its parent (`PR_SET_PDEATHSIG`, so a runner that
//! cancels the job with SIGTERM leaves no test running on), and talks to it
//! through pipes only: its output, relayed line by line as it comes, and its
//! verdict on a descriptor of its own. No file is left behind, whatever
//! kills either process, and `TMPDIR` plays no part.
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Set in a child to the descriptor its verdict goes to (`fd:N`).
const CHILD_VAR: &str = "GPU_LEAK_TEST_CHILD_RESULT";

/// Set in a child to the seconds its parent waited before starting it.
const WAITED_VAR: &str = "GPU_LEAK_TEST_CHILD_WAITED";

/// How many children that may start CUDA one parent runs at once.
/// Start-ups barely overlap: thirteen children starting CUDA together took
/// 2.8 to 4.5 s each on an H200, where one alone takes about 0.35 s, and
/// their driver calls after it waited on the others'. With four, and this
/// repository's three `cargo test` runs one at a time, the suite's slowest
/// leak test under the native allocator went from 732-945 to 205-257 ms of
/// the harness's own (benches/RESULTS.md).
const CUDA_CHILDREN_AT_ONCE: usize = 4;

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

/// The verdict's descriptor in a child.
fn verdict_fd() -> Option<i32> {
    std::env::var(CHILD_VAR).ok()?.strip_prefix("fd:")?.parse().ok()
}

/// In a child, as the test starts: the verdict's descriptor is not handed
/// on to what the test itself starts, so a process the test leaves running
/// cannot keep the parent waiting for the verdict to end.
pub(crate) fn keep_verdict_descriptor_to_this_process() {
    if let Some(fd) = verdict_fd() {
        // SAFETY: sets a flag on a descriptor the parent opened for this
        // process; an invalid one makes fcntl fail, which changes nothing.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// In a child: writes the outcome for the parent and ends the process
/// without unwinding, so libtest prints nothing after it and the parent's
/// relay carries the test's own output only. Returns where this is no child.
pub(crate) fn finish_child(outcome: &ChildOutcome) {
    if !is_child() {
        return;
    }
    let written = match verdict_fd() {
        Some(fd) => serde_json::to_vec(outcome).map_err(|e| e.to_string()).and_then(|json| {
            // SAFETY: the parent opened this descriptor for the verdict and
            // nothing else in this process uses it; it is written once, and
            // closed as the process ends.
            let mut pipe = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
            pipe.write_all(&json).map_err(|e| e.to_string())
        }),
        None => Err(format!("{CHILD_VAR} names no descriptor")),
    };
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

/// In a child: how long its parent waited for a turn before starting it
/// (zero elsewhere), for the timing line.
pub(crate) fn waited_in_parent() -> std::time::Duration {
    let seconds = std::env::var(WAITED_VAR).ok().and_then(|s| s.parse::<f64>().ok());
    seconds.filter(|s| s.is_finite() && *s >= 0.0).map(std::time::Duration::from_secs_f64).unwrap_or_default()
}

/// A counting semaphore: at most `limit` holders at once, the rest wait.
/// std has none, and the async crates' ones need a runtime in a test
/// thread; this is a mutex and a condition variable.
struct Turns {
    running: std::sync::Mutex<usize>,
    freed: std::sync::Condvar,
    limit: usize,
}

/// A held turn; dropping it lets the next waiter start.
struct Turn<'a>(&'a Turns);

impl Turns {
    const fn new(limit: usize) -> Turns {
        Turns { running: std::sync::Mutex::new(0), freed: std::sync::Condvar::new(), limit }
    }

    fn take(&self) -> Turn<'_> {
        // A panic while holding the mutex leaves only a count behind, which
        // stays right: poison says nothing here.
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        while *running >= self.limit {
            running = self.freed.wait(running).unwrap_or_else(|e| e.into_inner());
        }
        *running += 1;
        Turn(self)
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        *self.0.running.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        self.0.freed.notify_one();
    }
}

/// How often the relay looks whether the child has ended.
const POLL_MS: i32 = 50;

/// Runs the test `name` of this test binary in a process of its own and
/// relays its output as it comes. Returns the child's outcome; `None` where
/// the binary has no libtest test of that name (it ran none); or why the
/// child ended without a verdict (its exit status and output). A child that
/// `may_start_cuda` waits for one of [`CUDA_CHILDREN_AT_ONCE`] turns.
pub(crate) fn run_in_child(name: &str, may_start_cuda: bool) -> Result<Option<ChildOutcome>, String> {
    static CUDA_TURNS: Turns = Turns::new(CUDA_CHILDREN_AT_ONCE);
    let waiting = std::time::Instant::now();
    let _turn = may_start_cuda.then(|| CUDA_TURNS.take());
    let waited = waiting.elapsed();
    let exe = std::env::current_exe().map_err(|e| format!("the test binary's path is unknown ({e})"))?;
    let pipe_error = |e: std::io::Error| format!("could not open a pipe to this test's own process ({e})");
    let (output, output_writer) = os_pipe::pipe().map_err(pipe_error)?;
    let (verdict, verdict_writer) = os_pipe::pipe().map_err(pipe_error)?;
    let verdict_fd = verdict_writer.as_raw_fd();
    let parent = std::process::id() as libc::pid_t;
    let mut command = Command::new(&exe);
    command
        .args([name, "--exact", "--test-threads=1", "--nocapture", "--include-ignored"])
        .env(CHILD_VAR, format!("fd:{verdict_fd}"))
        .env(WAITED_VAR, waited.as_secs_f64().to_string())
        .stdin(Stdio::null())
        .stdout(output_writer.try_clone().map_err(pipe_error)?)
        .stderr(output_writer);
    // SAFETY: between fork and exec the closure makes only async-signal-safe
    // calls (prctl, getppid, fcntl, _exit) and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            // Dies with the thread that started it, which waits for it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before the line above: then no
            // signal comes, and this process must not run on alone.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            // The verdict's write end, open in the child only.
            if libc::fcntl(verdict_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut child = command.spawn().map_err(|e| format!("could not start {} for this test ({e})", exe.display()))?;
    // The parent's copies of the write ends: the pipes end with the child.
    drop(command);
    drop(verdict_writer);
    let mut relay = Relay::new(name);
    let mut verdict_bytes = Vec::new();
    let status = match pump(&mut child, output, verdict, |bytes| relay.feed(bytes), &mut verdict_bytes) {
        Ok(status) => status,
        Err(e) => {
            // Not left running unheard.
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("lost the output of this test's own process ({e})"));
        }
    };
    relay.finish();
    if verdict_bytes.is_empty() && status.success() && relay.ran_no_test {
        return Ok(None);
    }
    if verdict_bytes.is_empty() {
        return Err(format!(
            "the test's own process ({} {name} --exact) {} before it reached a verdict. Its output:\n{}",
            exe.display(),
            describe(status),
            relay.relayed
        ));
    }
    serde_json::from_slice(&verdict_bytes).map(Some).map_err(|e| format!("its verdict could not be read ({e})"))
}

/// Reads the child's output and verdict pipes as they fill, handing output
/// to `on_output`, until the child has ended and both pipes are drained. A
/// process the test started and left running may hold the output pipe
/// open: what it writes after the child ended is not waited for.
fn pump(
    child: &mut std::process::Child,
    output: os_pipe::PipeReader,
    verdict: os_pipe::PipeReader,
    mut on_output: impl FnMut(&[u8]),
    verdict_bytes: &mut Vec<u8>,
) -> std::io::Result<std::process::ExitStatus> {
    let mut pipes = [(output, false), (verdict, false)];
    for (pipe, _) in &pipes {
        // SAFETY: sets a flag on a descriptor this function owns.
        if unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        // Checked before draining: all the child wrote is in the pipes once
        // it has ended.
        let ended = child.try_wait()?;
        for (i, (pipe, closed)) in pipes.iter_mut().enumerate() {
            while !*closed {
                match pipe.read(&mut buffer) {
                    Ok(0) => *closed = true,
                    Ok(n) if i == 0 => on_output(&buffer[..n]),
                    Ok(n) => verdict_bytes.extend_from_slice(&buffer[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if let Some(status) = ended {
            return Ok(status);
        }
        let mut waiting: Vec<libc::pollfd> = pipes
            .iter()
            .filter(|(_, closed)| !closed)
            .map(|(pipe, _)| libc::pollfd { fd: pipe.as_raw_fd(), events: libc::POLLIN, revents: 0 })
            .collect();
        // SAFETY: `waiting` is a live array of as many pollfd as passed.
        unsafe { libc::poll(waiting.as_mut_ptr(), waiting.len() as libc::nfds_t, POLL_MS) };
    }
}

/// The child's output, relayed line by line as it comes: through `print!`,
/// so libtest shows it where it shows the test's own output (at once under
/// `--nocapture`, else with the failure), without libtest's own lines.
struct Relay {
    name: String,
    partial: Vec<u8>,
    /// Blank lines held back until a line follows them.
    blank_lines: usize,
    /// Everything relayed, for the message of a child that ended early.
    relayed: String,
    ran_no_test: bool,
}

impl Relay {
    fn new(name: &str) -> Relay {
        Relay { name: name.to_string(), partial: Vec::new(), blank_lines: 0, relayed: String::new(), ran_no_test: false }
    }

    fn feed(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            self.line(&String::from_utf8_lossy(&line[..end]));
        }
    }

    fn finish(&mut self) {
        if !self.partial.is_empty() {
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
            self.line(&line);
        }
    }

    fn line(&mut self, line: &str) {
        self.ran_no_test |= line == "running 0 tests";
        let Some(kept) = relayed_line(line, &self.name) else { return };
        if kept.is_empty() {
            self.blank_lines += usize::from(!self.relayed.is_empty());
            return;
        }
        let text = format!("{}{kept}\n", "\n".repeat(std::mem::take(&mut self.blank_lines)));
        // print! goes to libtest's capture: shown on failure or with --nocapture.
        print!("{text}");
        self.relayed.push_str(&text);
    }
}

/// One line of the child's output as the parent relays it: `None` for
/// libtest's own lines around the test's output.
fn relayed_line<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    // With --nocapture the test's first line follows libtest's
    // `test NAME ... ` on the same line: keep it, from its start.
    if let Some(rest) = line.strip_prefix(&format!("test {name} ... ")) {
        let status = ["ok", "FAILED", "ignored"].iter().any(|s| rest.starts_with(s));
        return (!status && !rest.is_empty()).then_some(rest);
    }
    let libtest = line == "running 1 test" || line == "running 0 tests" || line.starts_with("test result: ");
    (!libtest).then_some(line)
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
    fn a_third_child_waits_while_two_hold_the_turns_and_starts_when_one_ends() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let turns = Turns::new(2);
        let (first, second) = (turns.take(), turns.take());
        let third_started = AtomicBool::new(false);
        std::thread::scope(|s| {
            let third = s.spawn(|| {
                let _turn = turns.take();
                third_started.store(true, Ordering::SeqCst);
            });
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!third_started.load(Ordering::SeqCst), "a third turn while two were held");
            drop(first);
            third.join().unwrap();
        });
        assert!(third_started.load(Ordering::SeqCst));
        drop(second);
    }

    #[test]
    fn many_waiters_all_get_a_turn_and_never_more_than_the_limit_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let turns = Turns::new(2);
        let (now, most, done) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let _turn = turns.take();
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(2));
                    now.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 8);
        assert!(most.load(Ordering::SeqCst) <= 2, "{} at once", most.load(Ordering::SeqCst));
    }

    #[test]
    fn the_relay_drops_libtests_own_lines_and_keeps_the_tests() {
        let relay = |text: &str| {
            let mut relay = Relay::new("m::t");
            // Fed in pieces that split lines, as a pipe hands them over.
            for piece in text.as_bytes().chunks(5) {
                relay.feed(piece);
            }
            relay.finish();
            relay.relayed
        };
        assert_eq!(relay("\nrunning 1 test\npassed m::t: clean\n  hint: x\ntest m::t ... ok\n\ntest result: ok. 1 passed\n"), "passed m::t: clean\n  hint: x\n");
        // The test's first line, printed after libtest's `test NAME ... `.
        assert_eq!(relay("\nrunning 1 test\ntest m::t ... ::error file=a.rs,line=1::leak\n"), "::error file=a.rs,line=1::leak\n");
        assert_eq!(relay("\nrunning 1 test\n"), "");
        assert_eq!(relay("a\n\nb\n\n"), "a\n\nb\n");
    }
}
