//! Memory allocated through the CUDA driver, seen through CUPTI's callbacks
//! on the driver's allocation calls (csrc/driver_calls.cpp): what code
//! outside libtorch's allocators allocates (layer
//! [`Layer::OutsideLibtorch`](crate::layer::Layer::OutsideLibtorch)), and what
//! libtorch's CUDA allocator asks the driver for, which counts tensors
//! where the allocator reports nothing else (caching switched off, the
//! `cudaMallocAsync` backend on the hook).
//!
//! CUPTI takes one subscriber per process; it is held only while a
//! process-scope observation is open, so a profiler run later in the
//! process can have it.
use super::ffi;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Counting what is allocated through the CUDA driver (CUPTI's callbacks),
/// on unless this is 0: memory outside libtorch's allocators is a judged
/// layer, and CUDA tensors are counted from libtorch's own driver calls
/// where its allocator reports nothing else (caching off, the
/// `cudaMallocAsync` backend).
pub(crate) const DRIVER_CALLS_VAR: &str = "GPU_LEAK_TEST_DRIVER_CALLS";

/// Whether `GPU_LEAK_TEST_DRIVER_CALLS` leaves the count on: unless it says 0.
fn variable_leaves_it_on() -> crate::error::Result<bool> {
    match crate::environment::env_var(DRIVER_CALLS_VAR)? {
        Some(value) => crate::environment::parse_bool(DRIVER_CALLS_VAR, &value),
        None => Ok(true),
    }
}

static SWITCHED_OFF: AtomicBool = AtomicBool::new(false);
/// Set by [`force`]: 0 follows the variable, 1 counts, 2 does not.
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Whether the driver's calls are counted: unless
/// `GPU_LEAK_TEST_DRIVER_CALLS=0`, or where [`turn_on`] was called. `Err`
/// where the variable is not a boolean.
pub(crate) fn enabled() -> crate::error::Result<bool> {
    match FORCED.load(Ordering::Relaxed) {
        1 => Ok(true),
        2 => Ok(false),
        _ => variable_leaves_it_on(),
    }
}

/// Counts the driver's calls in this process from now on, whatever
/// `GPU_LEAK_TEST_DRIVER_CALLS` says: for this crate's tests of the layer.
/// Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn turn_on() {
    force(Some(true));
}

/// Counts the driver's calls (`Some(true)`), does not (`Some(false)`), or
/// follows `GPU_LEAK_TEST_DRIVER_CALLS` again (`None`), for observations
/// opened from now on: for the benchmark's variants. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn force(on: Option<bool>) {
    FORCED.store(on.map_or(0, |on| if on { 1 } else { 2 }), Ordering::Relaxed);
}

fn reason(why: *mut c_char) -> Result<(), String> {
    ffi::take_string(why).map_or(Ok(()), Err)
}

/// Starts counting (subscribing to CUPTI for the first user). `Err` says
/// what stands in the way: another subscriber, no CUPTI, a build without
/// CUDA headers. Balance each `Ok` with one [`stop`].
pub(crate) fn start() -> Result<(), String> {
    let mut why = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the shim hands over the string.
    unsafe { ffi::glt_driver_calls_start(&mut why) };
    reason(why)
}

/// Subscribes to CUPTI ahead of [`start`], where counting is on and
/// nothing holds CUPTI yet, so its start-up can run on another thread while
/// CUDA starts. Nothing is counted until `start`; [`release_unused`] hands
/// a subscription no `start` took back.
pub(crate) fn subscribe_ahead() {
    if enabled() == Ok(true) {
        // SAFETY: no arguments; the shim serialises it with start and stop.
        unsafe { ffi::glt_driver_calls_subscribe_ahead() };
    }
}

/// Unsubscribes what [`subscribe_ahead`] subscribed, where no [`start`]
/// took it over.
pub(crate) fn release_unused() {
    // SAFETY: no arguments; the shim serialises it with start and stop.
    unsafe { ffi::glt_driver_calls_release_unused() };
}

/// One user fewer; the last hands CUPTI back.
pub(crate) fn stop() {
    // SAFETY: no arguments; balanced against a successful start.
    unsafe { ffi::glt_driver_calls_stop() };
}

/// Allocates `bytes` through the driver on `cuda:index` from outside
/// libtorch (pinned host memory where `pinned`) and frees it again: the
/// canary that proves the layer is counted. `Ok(walked)`: whether the
/// caller's stack could be walked from CUPTI's callback back through the
/// driver's frames, which telling libtorch's calls from others needs.
/// `Err` where the driver failed.
pub(crate) fn canary(index: usize, bytes: i64, pinned: bool) -> Result<bool, String> {
    let (mut walked, mut why) = (0, std::ptr::null_mut());
    // SAFETY: valid out-pointers; the shim hands over the string.
    unsafe { ffi::glt_driver_calls_canary(index as c_int, bytes, pinned as c_int, &mut walked, &mut why) };
    reason(why).map(|()| walked == 1)
}

/// Counts what libtorch's CUDA allocator asks the driver for, as that
/// device's tensors: for backends that report nothing else.
pub(crate) fn count_cuda_allocator_calls() {
    // SAFETY: sets an atomic flag.
    unsafe { ffi::glt_driver_calls_count_cuda_allocator(1) };
}

/// Makes the driver's allocation calls uncounted (`off = true`) or counted
/// again: for tests of the "cannot measure" verdict. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn switch_off(off: bool) {
    SWITCHED_OFF.store(off, Ordering::Relaxed);
    // SAFETY: sets an atomic flag.
    unsafe { ffi::glt_driver_calls_switch_off(off as c_int) };
}

pub(crate) fn is_switched_off() -> bool {
    SWITCHED_OFF.load(Ordering::Relaxed)
}

/// CUPTI held by a stand-in for a profiler until dropped: for tests of what
/// a leak test says when another subscriber has CUPTI. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub struct ProfilerStandIn(());

#[cfg(feature = "internals")]
impl ProfilerStandIn {
    /// Subscribes to CUPTI as torch.profiler's Kineto would. `Err` where it
    /// could not (another subscriber is there already, no CUPTI).
    pub fn hold_cupti() -> Result<ProfilerStandIn, String> {
        let mut why = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the shim hands over the string.
        unsafe { ffi::glt_driver_calls_hold_cupti_as_profiler(1, &mut why) };
        reason(why).map(|()| ProfilerStandIn(()))
    }
}

#[cfg(feature = "internals")]
impl Drop for ProfilerStandIn {
    fn drop(&mut self) {
        let mut why = std::ptr::null_mut();
        // SAFETY: as in hold_cupti; releasing cannot fail in a way that matters.
        unsafe { ffi::glt_driver_calls_hold_cupti_as_profiler(0, &mut why) };
        let _ = ffi::take_string(why);
    }
}
