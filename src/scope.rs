//! Whose allocations a leak test counts, and the lock that keeps
//! process-scope tests from measuring each other.
//!
//! - `thread`: the per-thread hook on the test's thread, the autograd threads
//!   that run its `backward()`, and threads it brings in
//!   ([`crate::threads::TestThreads`]). Tests in parallel threads do not disturb each
//!   other; a tensor made on a thread the test spawned and did not bring in
//!   is not counted, and the report flags device-global growth that the
//!   hooked threads do not explain.
//! - `process`: every thread of the process, through the counting CPU
//!   allocator and the CUDA allocator's trace tracker. Process-scope tests run
//!   one at a time among leak tests.
//! - `auto` (default): `process` where each test has a process of its own
//!   (cargo nextest, and the child process the attribute's check runs in
//!   under `cargo test`: see `isolation.rs`) or libtest runs one test at a
//!   time; `thread` for a hand-written check under `cargo test`'s parallel
//!   threads.
use crate::error::InvalidValue;
use std::fmt;
use std::str::FromStr;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The `scope` setting before it is resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Scope {
    /// `process` where no other test shares the process, else `thread`.
    #[default]
    Auto,
    /// The test's thread, autograd's threads during its `backward()`, and
    /// threads brought in with [`crate::threads::current_test`].
    Thread,
    /// Every thread of the process.
    Process,
}

impl FromStr for Scope {
    type Err = InvalidValue;

    fn from_str(text: &str) -> Result<Self, InvalidValue> {
        use gpu_leak_test_options::rules::ScopeValue;
        Ok(match gpu_leak_test_options::rules::parse_scope(text).map_err(InvalidValue::new)? {
            ScopeValue::Auto => Scope::Auto,
            ScopeValue::Thread => Scope::Thread,
            ScopeValue::Process => Scope::Process,
        })
    }
}

/// In `gpu-leak-test.yaml`: the text the attribute takes.
impl<'de> serde::Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        crate::error::deserialize_text(deserializer, "scope")
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::Auto => "auto",
            Scope::Thread => "thread",
            Scope::Process => "process",
        })
    }
}

/// The scope a test runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResolvedScope {
    Thread,
    /// `alongside_other_tests`: libtest may be running other (non-leak)
    /// tests in parallel threads, whose allocations are counted too.
    Process { alongside_other_tests: bool },
}

impl ResolvedScope {
    pub(crate) fn is_process(self) -> bool {
        matches!(self, ResolvedScope::Process { .. })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ResolvedScope::Thread => "thread",
            ResolvedScope::Process { .. } => "process",
        }
    }
}

/// How the test binary runs its tests, read from the environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Runner {
    /// cargo nextest: one process per test.
    pub(crate) process_per_test: bool,
    /// libtest with one test thread (`--test-threads=1`, RUST_TEST_THREADS=1).
    pub(crate) one_test_thread: bool,
}

impl Runner {
    pub(crate) fn detect() -> Runner {
        let var = |name: &str| std::env::var(name).ok();
        let process_per_test = var("NEXTEST_EXECUTION_MODE").as_deref() == Some("process-per-test")
            || (var("NEXTEST").as_deref() == Some("1") && var("NEXTEST_EXECUTION_MODE").is_none());
        let args: Vec<String> = std::env::args().collect();
        let from_args = args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix("--test-threads") {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_string()),
            Some("") => args.get(i + 1).cloned(),
            _ => None,
        });
        let threads = from_args.or_else(|| var("RUST_TEST_THREADS"));
        Runner { process_per_test, one_test_thread: threads.as_deref().map(str::trim) == Some("1") }
    }
}

impl Scope {
    /// `auto` becomes `process` where no other test shares the process.
    pub(crate) fn resolve(self, runner: Runner) -> ResolvedScope {
        let alone = runner.process_per_test || runner.one_test_thread;
        match self {
            Scope::Thread => ResolvedScope::Thread,
            Scope::Auto if !alone => ResolvedScope::Thread,
            Scope::Auto | Scope::Process => ResolvedScope::Process { alongside_other_tests: !alone },
        }
    }
}

/// Held for a whole leak test: thread-scope tests share it, a process-scope
/// test holds it alone, so no other leak test's allocations land in its
/// count.
pub(crate) enum ScopeLock {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

pub(crate) fn lock(scope: ResolvedScope) -> ScopeLock {
    static LOCK: RwLock<()> = RwLock::new(());
    // A test that panicked while holding it has unwound; its poison says
    // nothing about the next one.
    match scope {
        ResolvedScope::Thread => ScopeLock::Shared(LOCK.read().unwrap_or_else(|e| e.into_inner())),
        ResolvedScope::Process { .. } => ScopeLock::Exclusive(LOCK.write().unwrap_or_else(|e| e.into_inner())),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    // The three runners, as isolation.rs's tests see them too.
    pub(crate) const CARGO_TEST: Runner = Runner { process_per_test: false, one_test_thread: false };
    pub(crate) const NEXTEST: Runner = Runner { process_per_test: true, one_test_thread: false };
    pub(crate) const ONE_THREAD: Runner = Runner { process_per_test: false, one_test_thread: true };

    #[test]
    fn auto_is_process_scope_where_each_test_has_the_process_to_itself() {
        assert_eq!(Scope::Auto.resolve(NEXTEST), ResolvedScope::Process { alongside_other_tests: false });
        assert_eq!(Scope::Auto.resolve(ONE_THREAD), ResolvedScope::Process { alongside_other_tests: false });
    }

    #[test]
    fn auto_is_thread_scope_under_parallel_cargo_test() {
        assert_eq!(Scope::Auto.resolve(CARGO_TEST), ResolvedScope::Thread);
    }

    #[test]
    fn process_scope_under_parallel_cargo_test_knows_it_is_not_alone() {
        assert_eq!(Scope::Process.resolve(CARGO_TEST), ResolvedScope::Process { alongside_other_tests: true });
        assert_eq!(Scope::Thread.resolve(NEXTEST), ResolvedScope::Thread);
    }

    #[test]
    fn scope_names_parse_and_bad_ones_say_what_to_write() {
        assert_eq!("process".parse(), Ok(Scope::Process));
        assert_eq!(" thread ".parse(), Ok(Scope::Thread));
        let err = "global".parse::<Scope>().unwrap_err();
        assert!(err.contains("\"global\"") && err.contains("\"process\""), "{err}");
    }
}
