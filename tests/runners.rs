//! One verdict under every runner: the leak tests in `shapes` keep tensors
//! made on threads they start (a std::thread, a rayon pool, a tokio
//! runtime's worker, a long-lived worker behind a channel), pass clean next
//! to them, or leave a thread running. The test below runs them as `cargo
//! test` does (parallel threads), with `--test-threads=1`, and as cargo
//! nextest does (a process per test), and checks that each gets the same
//! verdict and the same first line of its report, naming the line and the
//! thread. The shapes are `#[ignore]`d: they fail on purpose, and only the
//! runs below start them.
mod common;

use std::collections::BTreeMap;
use std::process::Command;

mod shapes {
    use gpu_leak_test::gpu_leak_test;
    use std::sync::mpsc;
    use tch::{Device, Kind, Tensor};

    #[gpu_leak_test(device = "auto")]
    #[ignore = "fails on purpose; run by every_runner_gives_the_same_verdict_and_first_line"]
    fn keeps_a_tensor_from_a_std_thread(device: Device) -> impl FnMut() {
        let mut kept = Vec::new();
        move || {
            let loader = std::thread::Builder::new().name("loader".into());
            let made = loader.spawn(move || Tensor::zeros([300], (Kind::Float, device))).unwrap(); // site: loader
            kept.push(made.join().unwrap());
        }
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "fails on purpose; run by every_runner_gives_the_same_verdict_and_first_line"]
    fn keeps_a_tensor_from_a_rayon_pool(device: Device) -> impl FnMut() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).thread_name(|i| format!("pool-{i}")).build().unwrap();
        let mut kept = Vec::new();
        move || kept.push(pool.install(|| Tensor::zeros([300], (Kind::Float, device)))) // site: rayon
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "fails on purpose; run by every_runner_gives_the_same_verdict_and_first_line"]
    fn keeps_a_result_from_a_tokio_worker(device: Device) -> impl FnMut() {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("tokio-worker").build().unwrap();
        let mut kept = Vec::new();
        move || {
            let task = runtime.spawn(async move { Tensor::zeros([300], (Kind::Float, device)) }); // site: tokio
            kept.push(runtime.block_on(task).unwrap());
        }
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "fails on purpose; run by every_runner_gives_the_same_verdict_and_first_line"]
    fn keeps_what_a_long_lived_worker_sends(device: Device) -> impl FnMut() {
        let (requests, inbox) = mpsc::channel::<()>();
        let (outbox, replies) = mpsc::channel::<Tensor>();
        std::thread::Builder::new()
            .name("batcher".into())
            .spawn(move || {
                for () in inbox {
                    let batch = Tensor::zeros([300], (Kind::Float, device)); // site: batcher
                    if outbox.send(batch).is_err() {
                        break;
                    }
                }
            })
            .unwrap();
        let mut never_drained = Vec::new();
        move || {
            requests.send(()).unwrap();
            never_drained.push(replies.recv().unwrap());
        }
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "run by every_runner_gives_the_same_verdict_and_first_line"]
    fn clean_next_to_the_others(device: Device) {
        let sum = std::thread::spawn(move || Tensor::ones([300], (Kind::Float, device)).sum(Kind::Float).double_value(&[]));
        assert_eq!(sum.join().unwrap(), 300.0);
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "run by every_runner_gives_the_same_verdict_and_first_line"]
    fn leaves_a_thread_running(device: Device) -> impl FnMut() {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            let (ready, wait) = mpsc::channel();
            std::thread::Builder::new()
                .name("sleeper".into())
                .spawn(move || {
                    let held = Tensor::zeros([1000], (Kind::Float, device));
                    ready.send(()).unwrap();
                    loop {
                        std::thread::park();
                        let _ = held.size();
                    }
                })
                .unwrap();
            wait.recv().unwrap();
        });
        || {}
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "crashes on purpose; run by a_child_that_aborts_fails_with_its_signal"]
    fn aborts(device: Device) {
        let _ = Tensor::ones([64], (Kind::Float, device));
        // No core file: where the shell allows them, one would land in the
        // crate's folder, and a CUDA process's core is slow to write beside
        // the tests that run meanwhile.
        let none = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: setrlimit only reads the limit it is given.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
        std::process::abort();
    }

    #[gpu_leak_test(device = "auto")]
    #[ignore = "run by every_runner_gives_the_same_verdict_and_first_line"]
    fn runs_after_a_thread_was_left_running(device: Device) {
        let _ = Tensor::ones([64], (Kind::Float, device)).sum(Kind::Float).double_value(&[]);
    }
}

/// What each shape must get: a leak naming its line and thread, or a pass.
const EXPECTED: &[(&str, Option<(&str, &str)>)] = &[
    ("keeps_a_tensor_from_a_std_thread", Some(("loader", "loader"))),
    ("keeps_a_tensor_from_a_rayon_pool", Some(("rayon", "pool-"))),
    ("keeps_a_result_from_a_tokio_worker", Some(("tokio", "tokio-worker"))),
    ("keeps_what_a_long_lived_worker_sends", Some(("batcher", "batcher"))),
    ("clean_next_to_the_others", None),
    ("leaves_a_thread_running", None),
    ("runs_after_a_thread_was_left_running", None),
];

/// Each shape's outcome in one run's output: the first line of its report
/// where it failed, else "passed".
fn outcomes(output: &str) -> BTreeMap<&'static str, String> {
    common::shape_outcomes(EXPECTED.iter().map(|&(name, _)| name), output, "LEAK in")
}

#[test]
fn every_runner_gives_the_same_verdict_and_first_line() {
    let source = std::fs::read_to_string(common::manifest_dir().join("tests/runners.rs")).unwrap();
    let line_of = |mark: &str| {
        let needle = format!("// site: {mark}");
        source.lines().position(|line| line.trim_end().ends_with(&needle)).map(|i| i + 1).unwrap()
    };
    // libtest's own default number of threads, as a plain `cargo test` runs.
    let parallel = common::run_this_binary(&["shapes::", "--ignored", "--nocapture"], false);
    let one_thread = common::run_this_binary(&["shapes::", "--ignored", "--test-threads=1", "--nocapture"], false);
    let mut per_process = String::new();
    for &(name, _) in EXPECTED {
        let full = format!("shapes::{name}");
        per_process += &common::run_this_binary(&[&full, "--exact", "--ignored", "--nocapture"], true);
    }
    let runs = [("cargo test", &parallel), ("--test-threads=1", &one_thread), ("nextest's way", &per_process)];
    let first = outcomes(&parallel);
    for &(name, expected) in EXPECTED {
        let outcome = &first[name];
        match expected {
            Some((mark, thread)) => {
                assert!(outcome.contains("LEAK in"), "{name} under cargo test: {outcome}\n{parallel}");
                let site = format!("tests/runners.rs:{}", line_of(mark));
                let report = parallel.split(&format!("LEAK in `shapes::{name}`")).nth(1).unwrap();
                let report = report.split("LEAK in `").next().unwrap();
                assert!(report.contains(&site), "{name}: the report does not name {site}:\n{report}");
                assert!(report.contains(&format!("on thread `{thread}")), "{name}: no thread `{thread}`:\n{report}");
            }
            None => assert_eq!(outcome, "passed", "{name} under cargo test:\n{parallel}"),
        }
    }
    for (runner, output) in runs {
        assert_eq!(outcomes(output), first, "{runner} gives other verdicts than cargo test's threads:\n{output}");
        assert!(
            output.contains("thread `sleeper` (id") && output.contains("started during this test and was still running"),
            "{runner}: the thread left running is not named:\n{output}"
        );
    }
}

/// A test whose process dies is a failure that says how it died, never a
/// pass; the tests after it still run.
#[test]
fn a_child_that_aborts_fails_with_its_signal() {
    for threads in ["--test-threads=2", "--test-threads=1"] {
        let output = common::run_this_binary(&["shapes::aborts", "shapes::runs_after", "--ignored", threads], false);
        assert!(output.lines().any(|line| line == "    shapes::aborts"), "{threads}: not listed as failed:\n{output}");
        assert!(output.contains("was killed by signal 6 (SIGABRT"), "{threads}: the signal is not named:\n{output}");
        assert!(output.contains("test shapes::runs_after_a_thread_was_left_running ... ok"), "{threads}:\n{output}");
    }
}

/// Run only by the tests below, each by its exact name.
mod alone {
    use gpu_leak_test::gpu_leak_test;
    use tch::{Device, Kind, Tensor};

    #[gpu_leak_test(device = "cpu", warmup = 0, iterations = 2)]
    #[ignore = "runs for 10 s and is killed on purpose; run by a_cancelled_run_leaves_no_test_running_and_no_file_behind"]
    fn sleeps(device: Device) {
        println!("sleeping in process {}", std::process::id());
        let _ = Tensor::ones([16], (Kind::Float, device));
        std::thread::sleep(std::time::Duration::from_secs(5));
    }

    #[gpu_leak_test(device = "cpu")]
    #[ignore = "run by a_missing_tmpdir_changes_nothing"]
    fn clean(device: Device) {
        let _ = Tensor::ones([16], (Kind::Float, device)).sum(Kind::Float).double_value(&[]);
    }
}

/// Where the `alone` tests' reports go: not the suite's own folder, whose
/// index lists the suite's tests (CI compares it with a partitioned run's).
fn alone_reports() -> std::path::PathBuf {
    common::manifest_dir().join("target/test-scratch/runners-alone")
}

/// What a CI runner does on cancel: SIGTERM to the test binary. Its child
/// (the test's own process under `cargo test`) dies with it, rather than
/// run on under PID 1 and write a report that makes the real run look
/// stale; what the child printed reached the parent as it came, not at its
/// exit; and no file is left in the temporary folder.
#[test]
fn a_cancelled_run_leaves_no_test_running_and_no_file_behind() {
    use std::io::BufRead;
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["alone::sleeps", "--exact", "--ignored", "--nocapture"])
        .env_remove("NEXTEST")
        .env_remove("NEXTEST_EXECUTION_MODE")
        .env("GPU_LEAK_TEST_REPORT_DIR", alone_reports())
        .stdout(std::process::Stdio::piped());
    let mut parent = command.spawn().unwrap();
    let (lines, received) = std::sync::mpsc::channel();
    let stdout = parent.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    // The child's first line arrives while it runs: relayed live.
    let child: i32 = loop {
        let line = received.recv_timeout(std::time::Duration::from_secs(60)).expect("the child's line was not relayed while it ran");
        if let Some(pid) = line.split("sleeping in process ").nth(1) {
            break pid.trim().parse().unwrap();
        }
    };
    assert_ne!(child as u32, parent.id(), "the test should run in a process of its own");
    // SAFETY: signals a process this test started and has not yet reaped.
    unsafe { libc::kill(parent.id() as i32, libc::SIGTERM) };
    let _ = parent.wait();
    let alive = |pid: i32| {
        // A zombie no one reaped yet (PID 1 in a container may not) is dead.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| !rest.trim_start().starts_with('Z')))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while alive(child) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!alive(child), "the child {child} runs on after its parent {} was terminated", parent.id());
    let prefix = format!("gpu-leak-test-{}-", parent.id());
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.starts_with(&prefix))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `TMPDIR=/nonexistent` once failed a clean test under `cargo test`: the
/// child's output went through a file there. Nothing does now.
#[test]
fn a_missing_tmpdir_changes_nothing() {
    let output = Command::new(std::env::current_exe().unwrap())
        .args(["alone::clean", "--exact", "--ignored"])
        .env_remove("NEXTEST")
        .env_remove("NEXTEST_EXECUTION_MODE")
        .env("TMPDIR", "/nonexistent")
        .env("GPU_LEAK_TEST_REPORT_DIR", alone_reports())
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && text.contains("test alone::clean ... ok"), "{text}");
}
