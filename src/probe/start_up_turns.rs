//! Turns to start CUDA, shared by every process on the machine: at most
//! [`AT_ONCE`] leak tests start CUDA and ready the harness's one-time state
//! (cuBLAS handles, canaries) together.
//!
//! Start-ups barely overlap. Thirteen processes starting CUDA together took
//! 2.8 to 4.5 s each on an H200, where one alone takes about 0.35 s, and
//! the driver calls after a start-up waited on the others' too: up to
//! 945 ms of the harness's own time, against 23 to 54 ms one at a time.
//! nextest starts as many test processes as it has threads, and plain
//! `cargo test` starts a child per test thread, so a suite's first wave is
//! such a burst. A turn is taken before the test's device is resolved
//! (which starts the driver) and given back once its canaries have passed,
//! so its own figures are its own; the wait is its `waiting` time.
//!
//! A turn is an abstract Unix socket name, bound while the turn lasts. The
//! kernel frees it when the process ends, however it ends; nothing is left
//! on disk, and no folder has to be writable (a file lock would need
//! both). Where no name can be bound at all (a sandbox without sockets),
//! or no turn comes in [`GIVE_UP_AFTER`], the test goes ahead without one:
//! a turn only spares time, it never decides a verdict.
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

/// How many processes on the machine start CUDA at once. With four per
/// `cargo test` binary, the suite's slowest leak test went from 732-945 to
/// 205-257 ms of the harness's own time on an H200 (benches/RESULTS.md).
pub(crate) const AT_ONCE: usize = 4;

/// The longest a test waits for a turn: past it, something holds every
/// turn for far longer than a start-up takes (0.35 s alone, 4.5 s in the
/// worst burst measured), and waiting on would only add to the job's time.
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);

/// How often a waiting test tries the turns again: well under a start-up.
const RETRY_EVERY: Duration = Duration::from_millis(5);

/// A turn held (or none needed), and how long taking it took.
#[must_use = "the turn is given back when this is dropped"]
pub(crate) struct StartUpTurn {
    _held: Option<UnixListener>,
    waited: Duration,
}

impl StartUpTurn {
    /// No turn: the test does not start CUDA.
    pub(crate) fn not_needed() -> StartUpTurn {
        StartUpTurn { _held: None, waited: Duration::ZERO }
    }

    /// Waits for a turn where this test may start CUDA and this process has
    /// not started it yet.
    pub(crate) fn take(may_start_cuda: bool) -> StartUpTurn {
        if !may_start_cuda || super::cuda::has_started() {
            return StartUpTurn::not_needed();
        }
        take_one_of(AT_ONCE, "cuda-start-up", GIVE_UP_AFTER)
    }

    /// How long the test waited for its turn.
    pub(crate) fn waited(&self) -> Duration {
        self.waited
    }

    #[cfg(test)]
    fn is_held(&self) -> bool {
        self._held.is_some()
    }
}

/// The first free one of `count` turns named `kind`, waiting up to `limit`.
fn take_one_of(count: usize, kind: &str, limit: Duration) -> StartUpTurn {
    let asked = Instant::now();
    loop {
        for slot in 0..count {
            match bind(kind, slot) {
                Ok(held) => return StartUpTurn { _held: Some(held), waited: asked.elapsed() },
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
                // No turn can be had on this machine: none is waited for.
                Err(_) => return StartUpTurn { _held: None, waited: asked.elapsed() },
            }
        }
        if asked.elapsed() >= limit {
            return StartUpTurn { _held: None, waited: asked.elapsed() };
        }
        std::thread::sleep(RETRY_EVERY);
    }
}

#[cfg(target_os = "linux")]
fn bind(kind: &str, slot: usize) -> std::io::Result<UnixListener> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("gpu-leak-test/{kind}/{slot}");
    UnixListener::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?)
}

/// Abstract socket names are Linux's alone: elsewhere no turn is taken.
#[cfg(not(target_os = "linux"))]
fn bind(_kind: &str, _slot: usize) -> std::io::Result<UnixListener> {
    Err(std::io::ErrorKind::Unsupported.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A name no other test (or process) uses, per test.
    fn kind(test: &str) -> String {
        format!("test-{}-{test}", std::process::id())
    }

    #[test]
    fn a_test_that_cannot_start_cuda_takes_no_turn() {
        let turn = StartUpTurn::take(false);
        assert!(!turn.is_held());
        assert_eq!(turn.waited(), Duration::ZERO);
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn no_more_than_the_limit_hold_turns_at_once() {
        let kind = kind("limit");
        let first = take_one_of(2, &kind, Duration::from_secs(5));
        let second = take_one_of(2, &kind, Duration::from_secs(5));
        assert!(first.is_held() && second.is_held());
        let third = take_one_of(2, &kind, Duration::from_millis(50));
        assert!(!third.is_held(), "a third turn of two was given");
        assert!(third.waited() >= Duration::from_millis(50), "gave up after {:?}", third.waited());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn many_waiters_all_get_a_turn_and_never_more_than_the_limit_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let kind = kind("many");
        let (now, most, done) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    let turn = take_one_of(2, &kind, Duration::from_secs(30));
                    assert!(turn.is_held(), "gave up after {:?}", turn.waited());
                    most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(10));
                    now.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        assert_eq!(done.load(Ordering::SeqCst), 8);
        assert!(most.load(Ordering::SeqCst) <= 2, "{} at once", most.load(Ordering::SeqCst));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_turn_given_back_goes_to_the_one_waiting() {
        let kind = kind("handover");
        let held = take_one_of(1, &kind, Duration::from_secs(5));
        assert!(held.is_held());
        let waiter = {
            let kind = kind.clone();
            std::thread::spawn(move || take_one_of(1, &kind, Duration::from_secs(30)))
        };
        std::thread::sleep(Duration::from_millis(100));
        drop(held);
        let taken = waiter.join().unwrap();
        assert!(taken.is_held(), "the waiter gave up instead");
        assert!(taken.waited() >= Duration::from_millis(100), "it waited only {:?}", taken.waited());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_turn_held_by_a_process_that_ended_is_free() {
        // The kernel frees the name with the process: a child that binds it
        // and exits leaves it free, without anyone giving it back.
        let kind = kind("ended");
        let name = format!("gpu-leak-test/{kind}/0");
        let status = std::process::Command::new("python3")
            .args(["-c", &format!("import socket; s = socket.socket(socket.AF_UNIX); s.bind(b'\\0{name}')")])
            .status()
            .expect("python3 runs (this suite needs it for libtorch)");
        assert!(status.success(), "the other process could not bind {name}");
        let turn = take_one_of(1, &kind, Duration::from_millis(200));
        assert!(turn.is_held());
        assert!(turn.waited() < Duration::from_millis(100));
    }
}
