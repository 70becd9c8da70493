//! Property tests: random allocation programs run with real libtorch CPU
//! tensors through the harness, checked against ground truth computed from
//! the program itself.
//!
//! A program is what one iteration does: a list of allocations, each with a
//! size, a call site, and what happens to it: dropped at once, kept for good
//! (a leak), kept for a few iterations and freed later (bounded), or made on
//! a helper thread (invisible to a per-thread test: neither counted nor a
//! leak). The harness must find exactly the kept-for-good bytes per
//! iteration, and attribution must name exactly their sites.
use gpu_leak_test::{LeakTest, Report, Verdict};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use std::collections::{BTreeSet, VecDeque};
use tch::{Device, Kind, Tensor};

const WARMUP: u32 = 2;
const ATTRIBUTION_ITERATIONS: u32 = 4;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fate {
    Dropped,
    KeptForGood,
    /// Freed this many iterations later; at most the warm-up length, so the
    /// level is flat by the first measured iteration.
    KeptFor(u32),
    OnHelperThread { kept: bool },
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Allocation {
    elements: i64,
    site: usize,
    fate: Fate,
}

fn allocation() -> impl Strategy<Value = Allocation> {
    let fate = prop_oneof![
        3 => Just(Fate::Dropped),
        2 => Just(Fate::KeptForGood),
        2 => (1..=WARMUP).prop_map(Fate::KeptFor),
        1 => any::<bool>().prop_map(|kept| Fate::OnHelperThread { kept }),
    ];
    (1i64..=2048, 0usize..4, fate).prop_map(|(elements, site, fate)| Allocation { elements, site, fate })
}

fn program() -> impl Strategy<Value = Vec<Allocation>> {
    prop::collection::vec(allocation(), 0..8)
}

/// Allocates at one of four distinct lines, so attribution can tell sites
/// apart. Returns the tensor and its line.
#[inline(never)]
fn allocate_at(site: usize, elements: i64) -> (Tensor, u32) {
    let options = (Kind::Float, Device::Cpu);
    match site {
        0 => (Tensor::zeros([elements], options), line!()),
        1 => (Tensor::zeros([elements], options), line!()),
        2 => (Tensor::zeros([elements], options), line!()),
        _ => (Tensor::zeros([elements], options), line!()),
    }
}

/// What the harness must find in `scope`: retained bytes per iteration and
/// the lines that retain them. Process scope also counts what helper
/// threads allocate and the test keeps.
fn ground_truth(program: &[Allocation], scope: &str) -> (u64, BTreeSet<u32>) {
    let kept_for_good = |a: &&Allocation| {
        a.fate == Fate::KeptForGood || (scope == "process" && a.fate == Fate::OnHelperThread { kept: true })
    };
    let kept: Vec<&Allocation> = program.iter().filter(kept_for_good).collect();
    let bytes = kept.iter().map(|a| a.elements as u64 * 4).sum();
    let lines = kept.iter().map(|a| allocate_at(a.site, 1).1).collect();
    (bytes, lines)
}

/// One program at a time, its tensors freed before the next starts. The
/// tests here run on libtest's parallel threads, and a thread-scope run's
/// tensors, dropped after its check, landed in a process-scope run's
/// count: in its canary once (CI: CANNOT MEASURE after 205 clean cases).
/// Each program's oracle assumes it is alone in the process.
static ONE_PROGRAM_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_program(program: &[Allocation], scope: &str) -> Report {
    // Declared first, so released last: after the program's tensors.
    let _alone = ONE_PROGRAM_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut kept_for_good = Vec::new();
    let mut expiring: VecDeque<(u32, Tensor)> = VecDeque::new();
    let mut helper_kept = Vec::new();
    let mut iteration = 0u32;
    LeakTest::new("property")
        .device(tch::Device::Cpu)
        .scope(scope.parse::<gpu_leak_test::settings::Scope>().unwrap())
        .warmup(WARMUP)
        .iterations(5)
        .attribution_iterations(ATTRIBUTION_ITERATIONS)
        .location(format!("{}:{}", file!(), line!()), env!("CARGO_MANIFEST_DIR"))
        .run(|_| {
            iteration += 1;
            while expiring.front().is_some_and(|(until, _)| *until <= iteration) {
                expiring.pop_front();
            }
            for a in program {
                match a.fate {
                    Fate::Dropped => drop(allocate_at(a.site, a.elements)),
                    Fate::KeptForGood => kept_for_good.push(allocate_at(a.site, a.elements).0),
                    Fate::KeptFor(n) => expiring.push_back((iteration + n, allocate_at(a.site, a.elements).0)),
                    Fate::OnHelperThread { kept } => {
                        let (site, elements) = (a.site, a.elements);
                        let tensor = std::thread::spawn(move || allocate_at(site, elements).0).join().unwrap();
                        if kept {
                            helper_kept.push(tensor);
                        }
                    }
                }
            }
            // Keep the queue ordered by expiry.
            expiring.make_contiguous().sort_by_key(|(until, _)| *until);
        })
        .unwrap()
}

fn check_program(program: &[Allocation], scope: &str) -> Result<(), TestCaseError> {
    // The oracle makes a tensor per line it names: alone too, or that
    // tensor's records land in a process-scope run on the other test's
    // thread, in its canary or its samples (CI, once in 256 cases: a kept
    // tensor's 368 B of records per iteration judged a leak of their own,
    // which the canary's measure of one tensor's records should explain).
    let (bytes_per_iteration, lines) = {
        let _alone = ONE_PROGRAM_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        ground_truth(program, scope)
    };
    let report = run_program(program, scope);
    if bytes_per_iteration == 0 {
        prop_assert!(report.passed(), "nothing kept for good, yet:\n{report}");
        prop_assert!(!matches!(report.verdict, Verdict::Leak(_)));
        return Ok(());
    }
    let Verdict::Leak(leak) = &report.verdict else {
        return Err(TestCaseError::fail(format!("expected a leak of {bytes_per_iteration} B/iteration:\n{report}")));
    };
    prop_assert_eq!(leak.bytes_per_iteration, bytes_per_iteration as f64, "\n{}", report);
    // Sites with survivors from every attribution iteration are the ones
    // that retain for good; bounded ones survive only the last few. (Host
    // objects that grow irregularly beside the leak, such as libtorch's own
    // map of live blocks, can make attribution run more iterations than
    // asked for.) The kept tensors' host records share their lines.
    let attribution = report.findings.attribution.as_ref().unwrap();
    let every_iteration: Vec<u32> = (1..=attribution.iterations.max(ATTRIBUTION_ITERATIONS)).collect();
    let persistent: BTreeSet<u32> = attribution
        .sites
        .iter()
        .filter(|s| s.survivors.iterations == every_iteration)
        .map(|s| {
            let location = s.location.as_deref().unwrap_or_default();
            location.rsplit(':').next().unwrap().parse::<u32>().unwrap()
        })
        .collect();
    prop_assert_eq!(persistent, lines, "\n{}", report);
    Ok(())
}

/// Cases per property: 100, or `PROPTEST_CASES` (CI runs more).
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(100)
}

proptest! {
    #![proptest_config(Config { cases: cases(), ..Config::default() })]

    #[test]
    fn verdict_bytes_and_sites_match_the_program_in_thread_scope(program in program()) {
        check_program(&program, "thread")?;
    }

    #[test]
    fn verdict_bytes_and_sites_match_the_program_in_process_scope(program in program()) {
        check_program(&program, "process")?;
    }
}

/// A failure shrinks to a minimal program: with a deliberately wrong oracle
/// ("nothing ever leaks"), proptest reduces any leaking program to one
/// allocation of one element, kept for good.
#[test]
fn a_failure_shrinks_to_a_minimal_program() {
    let mut runner = TestRunner::new(Config { cases: 64, failure_persistence: None, ..Config::default() });
    let result = runner.run(&program(), |program| {
        let report = run_program(&program, "thread");
        prop_assert!(!matches!(report.verdict, Verdict::Leak(_)), "leak");
        Ok(())
    });
    let Err(TestError::Fail(_, minimal)) = result else { panic!("the wrong oracle should fail: {result:?}") };
    assert_eq!(minimal, vec![Allocation { elements: 1, site: 0, fate: Fate::KeptForGood }]);
}

/// A clean clone once failed CI on the first program: one-off growth of
/// 2,132 B was averaged into the rate (830.4 B per iteration for a 404 B
/// leak), and later a one-off in libtorch's host objects outranked the
/// kept tensor. The H200 failed on the second the same way (a 9.5 KiB
/// rehash among 800 B of records). The rate is the leak's exact step, in
/// the kept tensors' layer, in both scopes.
#[test]
fn a_one_off_rise_beside_a_steady_leak_is_not_averaged_into_its_rate() {
    let programs = [
        vec![Allocation { elements: 1257, site: 1, fate: Fate::Dropped }, Allocation { elements: 101, site: 0, fate: Fate::KeptForGood }],
        vec![
            Allocation { elements: 101, site: 2, fate: Fate::KeptForGood },
            Allocation { elements: 210, site: 3, fate: Fate::KeptForGood },
            Allocation { elements: 1402, site: 2, fate: Fate::Dropped },
            Allocation { elements: 866, site: 3, fate: Fate::KeptFor(1) },
            Allocation { elements: 819, site: 3, fate: Fate::OnHelperThread { kept: true } },
        ],
    ];
    for program in &programs {
        for scope in ["thread", "process"] {
            for _ in 0..5 {
                check_program(program, scope).unwrap_or_else(|e| panic!("{scope} scope: {e}"));
            }
        }
    }
}
