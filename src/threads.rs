//! Bringing threads a test spawns into the running leak test's accounting.
//!
//! In process scope every thread counts already. In thread scope only the
//! test's thread (and autograd's, during its `backward()`) does; a worker
//! thread that makes tensors the test keeps must be brought in, or the leak
//! goes unseen (the report then flags growth it cannot explain).
//!
//! ```no_run
//! # use gpu_leak_test::threads::current_test;
//! // Inside a leak test's body:
//! let test = current_test().expect("inside a leak test");
//! // A std::thread:
//! let kept = test.spawn(|| tch::Tensor::zeros([256], tch::kind::FLOAT_CPU)).join().unwrap();
//! // A pool: every worker joins when it starts (rayon's `start_handler`,
//! // tokio's `on_thread_start`).
//! let test_for_workers = test.clone();
//! let start_handler = move |_index: usize| test_for_workers.attach_current_thread();
//! # let _ = (kept, start_handler);
//! ```
use crate::error::Result;
use crate::probe::{HookGuard, Tracker};
use std::cell::RefCell;

/// The running leak test, as a handle that can travel to other threads.
/// Get it with [`current_test`] inside the test.
#[derive(Clone)]
pub struct TestThreads {
    /// `None` in process scope, where every thread is counted anyway.
    tracker: Option<Tracker>,
    /// The running test's name.
    test: std::sync::Arc<str>,
}

thread_local! {
    static CURRENT: RefCell<Option<TestThreads>> = const { RefCell::new(None) };
    /// Guards of [`TestThreads::attach_current_thread`], dropped when the
    /// thread ends (or by [`detach_current_thread`]).
    static ATTACHED: RefCell<Vec<ThreadGuard>> = const { RefCell::new(Vec::new()) };
}

/// The leak test running on this thread (or that this thread was brought
/// into), if any.
pub fn current_test() -> Option<TestThreads> {
    CURRENT.with(|current| current.borrow().clone())
}

/// Ends what [`TestThreads::attach_current_thread`] started on this thread.
pub fn detach_current_thread() {
    let guards = ATTACHED.with(|attached| std::mem::take(&mut *attached.borrow_mut()));
    drop(guards.into_iter().rev().collect::<Vec<_>>());
}

/// Counts this thread's allocations for the test until it drops. Must drop
/// on the thread that made it.
#[must_use = "the thread stops counting as soon as the guard drops"]
pub struct ThreadGuard {
    _hook: Option<HookGuard>,
    previous: Option<TestThreads>,
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        let _ = CURRENT.try_with(|current| *current.borrow_mut() = previous);
    }
}

impl TestThreads {
    pub(crate) fn new(tracker: Option<Tracker>, test: &str) -> TestThreads {
        TestThreads { tracker, test: test.into() }
    }

    /// The running test's name.
    pub(crate) fn test_name(&self) -> &str {
        &self.test
    }

    /// Makes this the current test on this thread until the guard drops (the
    /// protocol does this on the test's thread).
    pub(crate) fn set_current(&self) -> ThreadGuard {
        let previous = CURRENT.with(|current| current.borrow_mut().replace(self.clone()));
        ThreadGuard { _hook: None, previous }
    }

    /// Counts the current thread's allocations for the test until the guard
    /// drops.
    pub fn enter(&self) -> Result<ThreadGuard> {
        let hook = self.tracker.as_ref().map(Tracker::enter).transpose()?;
        let previous = CURRENT.with(|current| current.borrow_mut().replace(self.clone()));
        Ok(ThreadGuard { _hook: hook, previous })
    }

    /// Counts the current thread's allocations for the test until the thread
    /// ends: for pool threads, from rayon's `start_handler` or tokio's
    /// `on_thread_start`. A failure is printed, not raised: those handlers
    /// cannot return errors.
    pub fn attach_current_thread(&self) {
        match self.enter() {
            Ok(guard) => ATTACHED.with(|attached| attached.borrow_mut().push(guard)),
            Err(error) => eprintln!("gpu-leak-test: warning: this thread's allocations are not counted: {error}"),
        }
    }

    /// `std::thread::spawn`, with the new thread counted for the test.
    pub fn spawn<F, T>(&self, f: F) -> std::thread::JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let test = self.clone();
        std::thread::spawn(move || {
            let _guard = test.enter();
            f()
        })
    }
}

/// A thread that started during a leak test, was still running when the
/// test ended, and holds memory it allocated: the test's own finding (a
/// test owns the threads it starts, as goleak has it for goroutines).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct ThreadLeftRunning {
    /// The operating system's name of the thread (at most 15 bytes).
    pub name: String,
    /// Its id, as `/proc/self/task` lists it.
    pub tid: u32,
    /// Bytes it allocated during the test that were still alive at its end.
    pub live_bytes: u64,
    /// Blocks behind those bytes.
    pub live_blocks: u64,
}

/// The ids of the process's threads now; empty where `/proc` is missing.
pub(crate) fn alive() -> std::collections::BTreeSet<u32> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Default::default() };
    tasks.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// Threads alive now that were not at `started`, holding memory the
/// tracker saw them allocate; biggest first.
pub(crate) fn left_running(started: &std::collections::BTreeSet<u32>, tracker: &Tracker) -> Vec<ThreadLeftRunning> {
    let new: Vec<u32> = alive().into_iter().filter(|tid| !started.contains(tid)).collect();
    if new.is_empty() {
        return Vec::new();
    }
    let live = tracker.live_by_thread();
    let mut left: Vec<ThreadLeftRunning> = new
        .into_iter()
        .filter_map(|tid| {
            let &(live_bytes, live_blocks) = live.get(&tid)?;
            let name = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok()?.trim_end().to_string();
            Some(ThreadLeftRunning { name, tid, live_bytes, live_blocks })
        })
        .collect();
    left.sort_by(|a, b| b.live_bytes.cmp(&a.live_bytes).then(a.tid.cmp(&b.tid)));
    left
}
