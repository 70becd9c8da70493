//! Process scope: every allocation and free of the process, from any thread,
//! fed into one [`Tracker`].
//!
//! Two sources report to it: a counting wrapper around libtorch's CPU
//! allocator (installed once, it keeps the wrapped allocator's deleters),
//! and the CUDA caching allocator's trace tracker (attached once; the
//! allocator's own history recording is left as the user set it). They feed
//! the sink only while an observation is open. The C++ heap (libtorch's
//! host objects, through the shim's operator new) is counted in the shim
//! itself while an observation is open, without a lock
//! (`host_objects`); it feeds the sink only while attribution records
//! sites (`record_host_object_sites`). Thread-scope tests open a shared observation
//! too and read it as the device-global view, to notice growth that their
//! hooked threads do not explain.
use super::hook::{Tracker, TrackerState};
use crate::error::{Error, Result};
use super::ffi;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

/// The tracker the sink feeds; null while no observation is open. The
/// pointee is kept alive by `Observer::tracker` while set, and by the
/// graveyard afterwards (an event can still be in flight when it is unset).
static SINK_TARGET: AtomicPtr<TrackerState> = AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_process_event(ptr: *mut c_void, size: i64, device_type: i32, device_index: i32) {
    let target = SINK_TARGET.load(Ordering::Acquire);
    if target.is_null() {
        return;
    }
    // SAFETY: a tracker state, once published here, is never freed (see
    // `close`), so the pointer stays valid even after it is unset.
    let state = unsafe { &*target };
    let _harness = crate::layer::rust_heap::harness();
    // Unwinding into libtorch would abort the process; drop the event instead.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        state.on_event(ptr as usize, size, device_type, device_index)
    }));
}

/// Feeds one of the Rust heap's events to the observation's tracker, to be
/// kept with its stack while attribution records the Rust heap's sites:
/// `size` is negative for a free. Called from the counting allocator, on
/// the allocating thread, in harness mode.
pub(crate) fn feed_rust_heap(address: usize, size: i64) {
    let target = SINK_TARGET.load(Ordering::Acquire);
    if target.is_null() {
        return;
    }
    // SAFETY: as in on_process_event.
    let state = unsafe { &*target };
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        state.on_event(address, size, super::hook::DEVICE_TYPE_RUST_HEAP, -1)
    }));
}

/// The process's C++ heap counted since the observation opened: live bytes
/// of the blocks allocated since, and how many allocations and frees were
/// counted (the shim does not tell them apart).
pub(crate) fn host_objects() -> (i64, u64) {
    let (mut bytes, mut events) = (0i64, 0u64);
    // SAFETY: plain out-parameters.
    unsafe { ffi::glt_process_host_objects(&mut bytes, &mut events) };
    (bytes, events)
}

/// Feeds the C++ heap's events to the observation's tracker too (`on`),
/// so attribution can keep each block with its stack.
pub(crate) fn record_host_object_sites(on: bool) {
    // SAFETY: sets an atomic flag.
    unsafe { ffi::glt_process_record_host_object_sites(on as c_int) };
}

/// Which process-wide sources are feeding the observation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Coverage {
    /// The counting CPU allocator is the CPU allocator in force.
    pub cpu: bool,
    /// The CUDA trace tracker is attached; `Err` says why not (CUDA not
    /// loaded, a build without CUDA headers, an allocator without trace
    /// support).
    pub cuda: std::result::Result<(), String>,
    /// CUPTI counts the CUDA driver's allocation calls (where CUDA is
    /// loaded); `Err` says why not (another subscriber, no CUPTI).
    pub driver: std::result::Result<(), String>,
}

struct Observer {
    /// Open observations; the sources run while it is above zero.
    users: usize,
    tracker: Option<Tracker>,
    coverage: Coverage,
}

static OBSERVER: Mutex<Observer> = Mutex::new(Observer {
    users: 0,
    tracker: None,
    coverage: Coverage { cpu: false, cuda: Ok(()), driver: Ok(()) },
});
/// Tracker states that were published to the sink, kept so that an event in
/// flight when they were unset never reads freed memory. Their block maps
/// are emptied: what stays is a few hundred bytes per observation.
static GRAVEYARD: Mutex<Vec<Tracker>> = Mutex::new(Vec::new());

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn install_cpu() -> Result<bool> {
    let mut installed: c_int = 0;
    // SAFETY: the out-pointer is valid for the call.
    ffi::check("glt_process_install_cpu", unsafe { ffi::glt_process_install_cpu(&mut installed) })?;
    Ok(installed == 1)
}

/// Attaches the CUDA trace tracker (once per process; later calls only say
/// whether it is attached).
fn attach_cuda_trace() -> std::result::Result<(), String> {
    if !super::cuda::is_loaded() {
        // Nothing in the process can allocate on CUDA (see cuda::is_loaded).
        return Err("CUDA is not loaded in this process".into());
    }
    let mut available: c_int = 0;
    // SAFETY: the out-pointer is valid for the call.
    let error = unsafe { ffi::glt_process_attach_cuda_trace(&mut available) };
    ffi::check("glt_process_attach_cuda_trace", error).map_err(|e| e.to_string())?;
    if available == 1 {
        Ok(())
    } else {
        Err("this build of gpu-leak-test found no CUDA runtime headers (see the build warning)".into())
    }
}

/// Subscribes to the driver's allocation calls where CUDA is loaded, unless
/// `GPU_LEAK_TEST_DRIVER_CALLS=0`.
fn start_driver_calls() -> std::result::Result<(), String> {
    match super::driver::enabled() {
        Ok(true) => {}
        Ok(false) => return Err(format!("{}=0 switches counting them off", super::driver::DRIVER_CALLS_VAR)),
        Err(e) => return Err(e.to_string()),
    }
    if !super::cuda::is_loaded() {
        return Err("CUDA is not loaded in this process".into());
    }
    super::driver::start()
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage { cpu: false, cuda: Err("not observed".into()), driver: Err("not observed".into()) }
    }
}

/// An open observation: while it lives, the process-wide sources feed its
/// tracker. Observations opened at the same time share one tracker.
pub struct Observation {
    tracker: Tracker,
    coverage: Coverage,
}

impl Observation {
    /// Opens an observation, starting the sources if none was open. `fresh`
    /// asks for a tracker of its own, owned by the calling thread: it
    /// fails if another observation is open (process-scope tests hold an
    /// exclusive lock first, so none is).
    pub fn open(fresh: bool) -> Result<Observation> {
        let mut observer = lock(&OBSERVER);
        if fresh && observer.users > 0 {
            return Err(Error::Hook {
                message: "a process-scope observation needs the process to itself, and another leak test is \
                          measuring"
                    .into(),
            });
        }
        if observer.users == 0 {
            let cpu = install_cpu()?;
            let cuda = attach_cuda_trace();
            let tracker = Tracker::new();
            SINK_TARGET.store(Arc::as_ptr(&tracker.state) as *mut TrackerState, Ordering::Release);
            // SAFETY: the sink is a plain extern "C" function that never unwinds.
            unsafe { ffi::glt_process_set_sink(Some(on_process_event)) };
            // SAFETY: sets an atomic flag.
            unsafe { ffi::glt_process_observe_host_objects(1) };
            // After the sink is set: the driver's calls report to it.
            let driver = start_driver_calls();
            observer.coverage = Coverage { cpu, cuda, driver };
            observer.tracker = Some(tracker);
        } else {
            // Opened by a test on the CPU before CUDA was loaded; a CUDA test
            // joining now brings it, and the tracker sees its events from here.
            if observer.coverage.cuda.is_err() {
                observer.coverage.cuda = attach_cuda_trace();
            }
            if observer.coverage.driver.is_err() {
                observer.coverage.driver = start_driver_calls();
            }
        }
        observer.users += 1;
        Ok(Observation { tracker: observer.tracker.clone().expect("set while users > 0"), coverage: observer.coverage.clone() })
    }

    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    pub fn coverage(&self) -> &Coverage {
        &self.coverage
    }
}

impl Drop for Observation {
    fn drop(&mut self) {
        let mut observer = lock(&OBSERVER);
        observer.users -= 1;
        if observer.users > 0 {
            return;
        }
        // SAFETY: sets an atomic flag.
        unsafe { ffi::glt_process_observe_host_objects(0) };
        if observer.coverage.driver.is_ok() {
            super::driver::stop();
            observer.coverage.driver = Err("not observed".into());
        }
        SINK_TARGET.store(std::ptr::null_mut(), Ordering::Release);
        if let Some(tracker) = observer.tracker.take() {
            tracker.forget_blocks();
            lock(&GRAVEYARD).push(tracker);
        }
    }
}
