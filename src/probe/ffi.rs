//! Declarations of csrc/shim.cpp and the one helper that turns its error
//! strings into [`Error`]s.
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawStat {
    pub current: i64,
    pub peak: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RawAllocatorStats {
    pub allocated_bytes: RawStat,
    pub reserved_bytes: RawStat,
    pub active_bytes: RawStat,
    pub requested_bytes: RawStat,
    pub allocations: RawStat,
    pub segments: RawStat,
    pub num_alloc_retries: i64,
    pub num_ooms: i64,
}

pub(crate) type EventFn = extern "C" fn(*mut c_void, *mut c_void, i64, i32, i32);
pub(crate) type OomFn = extern "C" fn(*mut c_void, i64, i32, i32);
pub(crate) type ReleaseFn = extern "C" fn(*mut c_void);
pub(crate) type ProcessEventFn = extern "C" fn(*mut c_void, i64, i32, i32);

extern "C" {
    fn glt_free_string(text: *mut c_char);
    pub(crate) fn glt_load_torch_cuda(loaded: *mut c_int, why: *mut *mut c_char) -> *mut c_char;
    pub(crate) fn glt_torch_cuda_loaded(loaded: *mut c_int) -> *mut c_char;
    pub(crate) fn glt_cuda_device_count(count: *mut i32) -> *mut c_char;
    pub(crate) fn glt_cuda_allocator_stats(device: i32, out: *mut RawAllocatorStats) -> *mut c_char;
    #[cfg(feature = "internals")]
    pub(crate) fn glt_cuda_empty_cache() -> *mut c_char;
    pub(crate) fn glt_cuda_reset_peak_stats(device: i32) -> *mut c_char;
    pub(crate) fn glt_cuda_synchronize(device: i32) -> *mut c_char;
    pub(crate) fn glt_cuda_driver_memory(device: i32, free: *mut u64, total: *mut u64) -> *mut c_char;
    pub(crate) fn glt_cuda_process_memory(
        device: i32,
        bytes: *mut u64,
        available: *mut c_int,
        why: *mut *mut c_char,
    ) -> *mut c_char;
    #[cfg(feature = "internals")]
    pub(crate) fn glt_cuda_clear_cublas_workspaces(available: *mut c_int) -> *mut c_char;
    pub(crate) fn glt_cuda_ready_blas_here(device: i32, ready: *mut c_int) -> *mut c_char;
    pub(crate) fn glt_cuda_ready_blas_on_worker(device: i32, ready: *mut c_int) -> *mut c_char;
    pub(crate) fn glt_grow_autograd_ready_queue(device: i32, tasks: i32) -> *mut c_char;
    pub(crate) fn glt_drain_autograd_ready_queue() -> *mut c_char;
    pub(crate) fn glt_cuda_allocator_backend(name: *mut *mut c_char) -> *mut c_char;
    pub(crate) fn glt_cuda_pinned_held_bytes(current: *mut i64, peak: *mut i64, available: *mut c_int) -> *mut c_char;
    #[cfg(feature = "internals")]
    pub(crate) fn glt_cuda_pinned_empty_cache() -> *mut c_char;
    pub(crate) fn glt_cuda_pinned_reset_peak() -> *mut c_char;
    pub(crate) fn glt_libtorch_version() -> *const c_char;
    pub(crate) fn glt_loaded_libtorch_folder(folder: *mut *mut c_char) -> *mut c_char;
    pub(crate) fn glt_cuda_device_kind(
        device: i32,
        name: *mut *mut c_char,
        major: *mut c_int,
        minor: *mut c_int,
        available: *mut c_int,
    ) -> *mut c_char;
    pub(crate) fn glt_cuda_pinned_canary(bytes: i64, before: *mut i64, with: *mut i64, after: *mut i64) -> *mut c_char;
    pub(crate) fn glt_hook_push(
        on_event: EventFn,
        on_oom: OomFn,
        on_release: ReleaseFn,
        context: *mut c_void,
        tag: c_int,
    ) -> *mut c_char;
    pub(crate) fn glt_hook_pop() -> *mut c_char;
    pub(crate) fn glt_grow_cpu_size_table(blocks: i64) -> *mut c_char;
    pub(crate) fn glt_host_objects_acquire_tag() -> c_int;
    pub(crate) fn glt_host_objects_release_tag(tag: c_int);
    pub(crate) fn glt_host_objects_of_tag(tag: c_int, bytes: *mut i64, allocations: *mut u64, frees: *mut u64);
    pub(crate) fn glt_host_objects_record_tag(tag: c_int, record: c_int);
    pub(crate) fn glt_process_set_sink(sink: Option<ProcessEventFn>);
    pub(crate) fn glt_process_observe_host_objects(observed: c_int);
    #[cfg(feature = "internals")]
    pub(crate) fn glt_host_objects_switch_off(off: c_int);
    pub(crate) fn glt_process_host_objects(bytes: *mut i64, events: *mut u64);
    pub(crate) fn glt_process_record_host_object_sites(record: c_int);
    pub(crate) fn glt_process_install_cpu(installed: *mut c_int) -> *mut c_char;
    pub(crate) fn glt_process_attach_cuda_trace(available: *mut c_int) -> *mut c_char;
    pub(crate) fn glt_driver_calls_start(why: *mut *mut c_char);
    pub(crate) fn glt_driver_calls_stop();
    pub(crate) fn glt_driver_calls_subscribe_ahead();
    pub(crate) fn glt_driver_calls_release_unused();
    pub(crate) fn glt_match_function_symbols(
        symbols: *const u8,
        count: usize,
        wanted: *const u64,
        wanted_count: usize,
        best_sizes: *mut u64,
        best_names: *mut u32,
    );
    #[cfg(feature = "internals")]
    pub(crate) fn glt_driver_calls_switch_off(off: c_int);
    pub(crate) fn glt_driver_calls_count_cuda_allocator(on: c_int);
    #[cfg(feature = "internals")]
    pub(crate) fn glt_driver_calls_hold_cupti_as_profiler(hold: c_int, why: *mut *mut c_char);
    pub(crate) fn glt_driver_calls_canary(device: c_int, bytes: i64, pinned: c_int, walked: *mut c_int, why: *mut *mut c_char);
}

/// Takes ownership of a string the shim allocated (null is fine).
pub(crate) fn take_string(text: *mut c_char) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // SAFETY: the shim returns NUL-terminated strings from malloc and gives
    // up ownership; we free each exactly once.
    let owned = unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned();
    unsafe { glt_free_string(text) };
    Some(owned)
}

/// Converts a shim return value into a Result, naming the call on failure.
pub(crate) fn check(call: &'static str, error: *mut c_char) -> Result<()> {
    match take_string(error) {
        None => Ok(()),
        Some(message) => Err(Error::Libtorch { call, message }),
    }
}
