//! Which source counts each followed device, and the proof that it counts
//! there: no verdict comes from a source that could not see.
//!
//! Before a leak test's body runs, a 512-byte canary tensor is allocated and
//! freed on the CPU and on the body's CUDA device, on the test's thread, and
//! the chosen source must see both. Where it does not (an allocator backend
//! without the events the source needs, caching switched off, a source
//! switched off), the test fails as "cannot measure", naming the device, the
//! layer, the setting behind it and what to do. It is never "clean".
//!
//! libtorch's host objects (its C++ heap, counted through the shim's
//! operator new) are proved by the same CPU canary: libtorch allocates the
//! tensor's own records (`TensorImpl`, `StorageImpl`) there, so a binary
//! where the replacement did not take is "cannot measure" too.
//!
//! The sources:
//! - thread scope: the per-thread hook, on every layer (the C++ heap of the
//!   hooked threads through the shim's operator new);
//! - process scope: operator new for the whole process's C++ heap; the
//!   counting CPU allocator on the CPU, plus the bytes
//!   CUDA's caching host allocator holds where CUDA is loaded (a pinned
//!   tensor is a CPU tensor); on CUDA the
//!   caching allocator's trace tracker where it attaches (the native and
//!   `expandable_segments` backends), else what the allocator asks the
//!   driver for (below; `backend:cudaMallocAsync`), and last the
//!   allocator's own statistics (exact bytes for the whole process, but no
//!   per-allocation events, so no sites);
//! - unless `GPU_LEAK_TEST_DRIVER_CALLS=0`, CUPTI's callbacks on the CUDA
//!   driver's allocation calls (see `driver.rs`): memory outside libtorch's
//!   allocators, proved by a raw driver canary; and what libtorch's CUDA
//!   allocator asks the driver for, each tensor where the allocator
//!   reports nothing else (caching switched off, `cudaMallocAsync`), tried
//!   before the device is called blind.
use super::hook::{HookView, Tracker};
use super::{cuda, process::Coverage};
use crate::layer::Layer;
use std::sync::atomic::{AtomicBool, Ordering};
use tch::Device;

/// What counts one device's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// libtorch's per-thread memory reporting (thread scope).
    Hook,
    /// The counting wrapper around libtorch's CPU allocator (process scope).
    CountingCpuAllocator,
    /// That, plus pinned host memory from the CUDA caching host allocator's
    /// statistics (process scope where CUDA is loaded): a pinned tensor is a
    /// CPU tensor, so it is judged with host memory. Sites come from the CPU
    /// allocator only.
    CpuAndPinnedAllocators,
    /// The CUDA caching allocator's trace tracker (process scope).
    CudaTrace,
    /// The CUDA allocator's device statistics: `allocated_bytes`, for the
    /// whole process (process scope, where no trace tracker attaches).
    CudaStatistics,
    /// The shim's replacement of operator new, for the whole process's C++
    /// heap (process scope): counted in the shim, without a lock or a map.
    OperatorNew,
    /// CUPTI's callbacks on the CUDA driver's allocation calls, for the
    /// whole process (process scope): memory outside libtorch's allocators.
    DriverCalls,
    /// What libtorch's CUDA allocator asks the driver for, through CUPTI:
    /// each tensor, where caching is off or the `cudaMallocAsync` backend
    /// reports nothing else. The hook's share on its threads in thread
    /// scope, the whole process's in process scope.
    CudaAllocatorCalls,
}

impl Source {
    /// The source as the report names it.
    pub fn name(self) -> &'static str {
        match self {
            Source::Hook => "the per-thread allocation hook",
            Source::CountingCpuAllocator => "the counting CPU allocator",
            Source::CpuAndPinnedAllocators => {
                "the counting CPU allocator and the pinned host allocator's statistics (bytes it holds)"
            }
            Source::CudaTrace => "the CUDA caching allocator's trace",
            Source::CudaStatistics => "the CUDA allocator's statistics",
            Source::OperatorNew => "operator new (the process's C++ heap)",
            Source::DriverCalls => "CUPTI's callbacks on the CUDA driver's allocation calls",
            Source::CudaAllocatorCalls => "libtorch's CUDA allocator's calls to the driver, seen through CUPTI",
        }
    }

    /// True where the source sees each allocation, so survivors can be
    /// grouped by site; statistics give totals only.
    pub fn attributable(self) -> bool {
        !matches!(self, Source::CudaStatistics)
    }

    /// The verdict where this source cannot back one on `layer`, and why.
    pub(crate) fn cannot_measure(self, layer: Layer, reason: String) -> crate::verdict::Verdict {
        crate::verdict::Verdict::CannotMeasure { layer: layer.description().to_string(), source: self.name().to_string(), reason }
    }
}

/// The source that counts `layer` in this scope.
pub(crate) fn choose(layer: Layer, process_scope: bool, coverage: &Coverage) -> Source {
    match (layer, process_scope) {
        (_, false) => Source::Hook,
        (Layer::OutsideLibtorch(_), true) => Source::DriverCalls,
        (Layer::HostObjects, true) => Source::OperatorNew,
        (Layer::Tensors(Device::Cpu), true) if cuda::pinned_held_bytes().is_some() => Source::CpuAndPinnedAllocators,
        (Layer::Tensors(Device::Cpu), true) => Source::CountingCpuAllocator,
        (_, true) if coverage.cuda.is_ok() => Source::CudaTrace,
        // Where the trace cannot attach (the cudaMallocAsync backend), the
        // allocator's own driver calls still count each tensor, and name its
        // site, which the statistics cannot.
        (_, true) if coverage.driver.is_ok() => Source::CudaAllocatorCalls,
        (_, true) => Source::CudaStatistics,
    }
}

/// The tracker's figures for `layer` as `source` counts them: what
/// libtorch's CUDA allocator asked the driver for, or the layer's own slot.
pub(crate) fn view(source: Source, layer: Layer, tracker: &Tracker) -> HookView {
    match (source, layer) {
        (Source::CudaAllocatorCalls, Layer::Tensors(Device::Cuda(index))) => tracker.cuda_allocator_calls_view(index),
        _ => tracker.layer_view(layer),
    }
}

/// Live bytes in `layer` as `source` counts them now.
pub(crate) fn level(source: Source, layer: Layer, tracker: &Tracker) -> i64 {
    match (source, layer) {
        // The tracker drops a switched-off device's events itself.
        (Source::CudaStatistics, _) if is_switched_off(layer.device()) => 0,
        (Source::CudaStatistics, Layer::Tensors(Device::Cuda(index))) => {
            cuda::allocator_stats(index).map(|s| s.allocated_bytes.current as i64).unwrap_or(0)
        }
        (Source::CpuAndPinnedAllocators, _) => {
            tracker.layer_view(layer).live_bytes + cuda::pinned_held_bytes().map_or(0, |s| s.current as i64)
        }
        (Source::OperatorNew, _) => super::process::host_objects().0,
        // The hook's threads' pinned host memory is host memory too.
        (Source::Hook, Layer::Tensors(Device::Cpu)) => {
            tracker.layer_view(layer).live_bytes + tracker.pinned_view().live_bytes
        }
        _ => view(source, layer, tracker).live_bytes,
    }
}

/// Allocations and frees `source` counted in `layer` so far.
pub(crate) fn events(source: Source, layer: Layer, tracker: &Tracker) -> u64 {
    match (source, layer) {
        (Source::OperatorNew, _) => super::process::host_objects().1,
        _ => {
            let view = view(source, layer, tracker);
            view.allocations + view.frees
        }
    }
}

/// The highest live bytes in `layer` since the last [`reset_peak`].
pub(crate) fn peak(source: Source, layer: Layer, tracker: &Tracker) -> i64 {
    match (source, layer) {
        (Source::CudaStatistics, Layer::Tensors(Device::Cuda(index))) => {
            cuda::allocator_stats(index).map(|s| s.allocated_bytes.peak as i64).unwrap_or(0)
        }
        // Two peaks taken apart: their sum bounds the peak of the sum.
        (Source::CpuAndPinnedAllocators, _) => {
            tracker.layer_view(layer).peak_bytes + cuda::pinned_held_bytes().map_or(0, |s| s.peak as i64)
        }
        // The shim's sums keep no peak; no budget is set on this layer.
        (Source::OperatorNew, _) => super::process::host_objects().0,
        (Source::Hook, Layer::Tensors(Device::Cpu)) => {
            tracker.layer_view(layer).peak_bytes + tracker.pinned_view().peak_bytes
        }
        _ => view(source, layer, tracker).peak_bytes,
    }
}

/// The highest live bytes in `layer` since the last [`reset_peak`], as far
/// as that repeats from one run of the same code to the next: beside
/// pinned host memory, the CPU tensors' own peak plus what the pinned
/// cache holds now, not its peak. When the pinned cache can reuse a block
/// depends on when the GPU's events complete, so its peak moves between
/// identical runs: on an H200 a trainer's step that checkpoints to the CPU
/// read 8 B in one run and 1.8 MiB in the next. Memory baselines read this.
pub(crate) fn repeatable_peak(source: Source, layer: Layer, tracker: &Tracker) -> i64 {
    match (source, layer) {
        (Source::CpuAndPinnedAllocators, _) => {
            tracker.layer_view(layer).peak_bytes + cuda::pinned_held_bytes().map_or(0, |s| s.current as i64)
        }
        (Source::Hook, Layer::Tensors(Device::Cpu)) => {
            tracker.layer_view(layer).peak_bytes + tracker.pinned_view().live_bytes
        }
        _ => peak(source, layer, tracker),
    }
}

/// Starts a new peak window in `layer`. For the allocator's statistics this
/// resets libtorch's own peak (`torch.cuda.reset_peak_memory_stats`), which
/// a process-scope test has to itself.
pub(crate) fn reset_peak(source: Source, layer: Layer, tracker: &Tracker) {
    match (source, layer) {
        (Source::CudaStatistics, Layer::Tensors(Device::Cuda(index))) => {
            let _ = cuda::reset_peak_stats(index);
        }
        (Source::OperatorNew, _) => {}
        (Source::CudaAllocatorCalls, Layer::Tensors(Device::Cuda(index))) => tracker.reset_cuda_allocator_calls_peak(index),
        (Source::CpuAndPinnedAllocators, _) => {
            tracker.reset_peak(layer);
            let _ = cuda::pinned_reset_peak();
        }
        _ => tracker.reset_peak(layer),
    }
}

/// Bytes of the canary: one block of the caching allocator, and exact on the CPU.
const CANARY_BYTES: i64 = 512;
/// The least a CPU canary's own records add to the C++ heap: its
/// `TensorImpl` and `StorageImpl` (libtorch's operator new calls; about
/// 300 B in 2.11), more than tch's own 8-byte handle (a 24 B block), which
/// the test binary allocates itself and would count even where libtorch's
/// calls did not reach the replacement.
const HOST_RECORDS_CANARY_BYTES: i64 = 128;

/// A source that saw its canary, and what the canary added to the layer
/// (for the C++ heap, one tensor's records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proved {
    pub source: Source,
    pub added: i64,
}

/// Proves that `source` counts `layer` (see [`prove_one`]). Where it does
/// not and the layer is CUDA tensors, what libtorch's CUDA allocator asks
/// the driver for is tried next (caching switched off, or the
/// `cudaMallocAsync` backend on the hook), then in process scope the
/// allocator's statistics. `Err` is why the first source was blind.
pub(crate) fn prove(
    source: Source,
    layer: Layer,
    body: Device,
    process_scope: bool,
    tracker: &Tracker,
    coverage: &Coverage,
) -> Result<Proved, String> {
    let mut tried = source;
    let mut why = match prove_one(source, layer, body, tracker, coverage) {
        Ok(added) => return Ok(Proved { source, added }),
        // The first source's reason leads: it is the one a user sets up.
        Err(why) => why,
    };
    while let Some(next) = fall_back(tried, layer, process_scope, coverage) {
        match prove_one(next, layer, body, tracker, coverage) {
            Ok(added) => return Ok(Proved { source: next, added }),
            Err(blind) => why += &format!(". Next, {} was tried, and was blind too: {blind}", next.name()),
        }
        tried = next;
    }
    if let (Err(driver), Layer::Tensors(Device::Cuda(_)), Source::Hook | Source::CudaTrace) = (&coverage.driver, layer, source) {
        why += &format!(". Counting what libtorch's CUDA allocator asks the driver for instead is not possible either: {driver}");
    }
    Err(why)
}

/// The source to try on CUDA tensors after `source` was blind. The chain
/// ends: the statistics come last.
fn fall_back(source: Source, layer: Layer, process_scope: bool, coverage: &Coverage) -> Option<Source> {
    match (source, layer) {
        (Source::Hook | Source::CudaTrace, Layer::Tensors(Device::Cuda(_))) if coverage.driver.is_ok() => {
            Some(Source::CudaAllocatorCalls)
        }
        (Source::CudaAllocatorCalls, Layer::Tensors(Device::Cuda(_))) if process_scope => Some(Source::CudaStatistics),
        _ => None,
    }
}

/// Allocates and frees a canary on `layer` (on this thread) and checks
/// that `source` saw both, up to three tries (another thread's allocation
/// in between can hide it once). A tensor on `layer`'s device for tensors;
/// for the C++ heap a CPU tensor, whose records libtorch allocates there;
/// a raw driver allocation made from outside libtorch for memory outside
/// it. Host memory that counts pinned bytes too is also proved with a
/// pinned canary, where the body runs on CUDA (`body`). `Ok` is what the
/// canary added to the layer; `Err` says why it is blind.
fn prove_one(source: Source, layer: Layer, body: Device, tracker: &Tracker, coverage: &Coverage) -> Result<i64, String> {
    if let Layer::OutsideLibtorch(on) = layer {
        return prove_driver_calls(source, layer, on, body, tracker, coverage);
    }
    if source == Source::CudaAllocatorCalls {
        super::driver::count_cuda_allocator_calls();
    }
    let device = layer.device();
    let sync = || {
        if let Device::Cuda(index) = device {
            let _ = cuda::synchronize(index);
        }
    };
    let least = if layer == Layer::HostObjects { HOST_RECORDS_CANARY_BYTES } else { CANARY_BYTES };
    let seen = (0..3).find_map(|_| {
        let before = level(source, layer, tracker);
        let canary = tch::Tensor::zeros([CANARY_BYTES / 4], (tch::Kind::Float, device));
        sync();
        let with = level(source, layer, tracker);
        drop(canary);
        sync();
        let after = level(source, layer, tracker);
        (with - before >= least && with - after >= least).then_some(with - before)
    });
    let Some(added) = seen else {
        return Err(match layer {
            Layer::HostObjects => host_objects_blind_reason(source),
            Layer::Tensors(device) | Layer::OutsideLibtorch(device) => blind_reason(source, device, coverage),
        });
    };
    reset_peak(source, layer, tracker);
    match (source, body) {
        (Source::CpuAndPinnedAllocators, Device::Cuda(_)) => prove_pinned().map(|()| added),
        _ => Ok(added),
    }
}

/// Memory outside libtorch, on `on` (the CPU: pinned host memory), while
/// the body runs on CUDA: a raw driver allocation from outside libtorch
/// must raise the count by its size, and its free lower it again.
fn prove_driver_calls(
    source: Source,
    layer: Layer,
    on: Device,
    body: Device,
    tracker: &Tracker,
    coverage: &Coverage,
) -> Result<i64, String> {
    let what = if on == Device::Cpu { "pinned host" } else { "device" };
    let blind = |why: &str| {
        format!("before the body ran, a {CANARY_BYTES} B {what} canary allocated through the CUDA driver was not counted by {}: {why}", source.name())
    };
    if let Err(why) = &coverage.driver {
        return Err(blind(why));
    }
    let index = match body {
        Device::Cuda(index) => index,
        _ => 0,
    };
    for _ in 0..3 {
        reset_peak(source, layer, tracker);
        let before = tracker.layer_view(layer);
        let walked = super::driver::canary(index, CANARY_BYTES, on == Device::Cpu).map_err(|why| blind(&why))?;
        let after = tracker.layer_view(layer);
        if !walked && after.allocations > before.allocations {
            return Err(blind(
                "CUPTI reported the call, but the caller's stack could not be walked back through the CUDA \
                 driver's frames from its callback, so libtorch's own driver calls (its allocators' segments) \
                 cannot be told from others here",
            ));
        }
        let seen = after.allocations > before.allocations
            && after.frees > before.frees
            && after.peak_bytes - before.live_bytes >= CANARY_BYTES;
        if seen {
            reset_peak(source, layer, tracker);
            return Ok(CANARY_BYTES);
        }
    }
    Err(blind(if super::driver::is_switched_off() {
        "the count was switched off for a test (gpu_leak_test::internals::probe::driver::switch_off)"
    } else {
        "CUPTI did not report the call. A tool that intercepts the driver (an injection library, a wrapper that \
         calls the driver through cuGetProcAddress tables of its own) can hide calls from CUPTI; run leak tests \
         without it"
    }))
}

/// The pinned half of host memory, where the body runs on `cuda` (its
/// context exists, so pinning starts nothing new). The host allocator
/// counts the bytes it holds, so the proof is a block made and returned:
/// its cache is emptied around a pinned canary, which must raise the count
/// and, emptied again, lower it.
fn prove_pinned() -> Result<(), String> {
    for _ in 0..3 {
        if let Ok((before, with, after)) = cuda::pinned_canary(CANARY_BYTES) {
            if with - before >= CANARY_BYTES && with - after >= CANARY_BYTES {
                return Ok(());
            }
        }
    }
    Err(format!(
        "before the body ran, a {CANARY_BYTES} B pinned canary block taken from libtorch's pinned host allocator was \
         not seen by its statistics"
    ))
}

/// Why the C++ heap missed the canary's records, and what to do.
fn host_objects_blind_reason(source: Source) -> String {
    let mut reason = format!(
        "before the body ran, the {HOST_RECORDS_CANARY_BYTES} B or more of C++ objects libtorch allocates for a \
         canary tensor (its TensorImpl and StorageImpl) were not seen by {}",
        source.name()
    );
    if HOST_OBJECTS_SWITCHED_OFF.load(Ordering::Relaxed) {
        reason += ": the C++ heap's count was switched off for a test \
                   (gpu_leak_test::internals::probe::sources::switch_off_host_objects)";
    } else {
        reason += ". gpu-leak-test counts libtorch's host objects by replacing operator new in the test binary, \
                   and libtorch's calls did not reach it: the binary links the C++ runtime statically, or another \
                   library in it replaces operator new too (a memory profiler, tcmalloc or jemalloc's C++ \
                   interposition). Link libstdc++ dynamically in test binaries, or load the other allocator only \
                   outside leak tests";
    }
    reason
}

/// Why `source` missed the canary on `device`, and what to do.
fn blind_reason(source: Source, device: Device, coverage: &Coverage) -> String {
    if source == Source::CudaAllocatorCalls && super::driver::is_switched_off() {
        return format!(
            "before the body ran, a {CANARY_BYTES} B canary tensor allocated on it was not seen by {}: the driver's \
             calls were switched off for a test (gpu_leak_test::internals::probe::driver::switch_off)",
            source.name()
        );
    }
    if is_switched_off(device) {
        return format!(
            "before the body ran, a {CANARY_BYTES} B canary tensor allocated on it was not seen by {}: the source \
             was switched off for a test (gpu_leak_test::internals::probe::sources::switch_off)",
            source.name()
        );
    }
    let mut reason =
        format!("before the body ran, a {CANARY_BYTES} B canary tensor allocated on it was not seen by {}", source.name());
    if let (Source::CudaStatistics, Err(why)) = (source, &coverage.cuda) {
        reason += &format!(" (the allocator's trace tracker could not attach: {why})");
    }
    if device.is_cuda() {
        let backend = cuda::allocator_backend().unwrap_or_else(|e| format!("unknown ({e})"));
        reason += &format!(". libtorch's CUDA allocator backend here is `{backend}`");
        if std::env::var("PYTORCH_NO_CUDA_MEMORY_CACHING").is_ok_and(|v| v.trim() != "0" && !v.trim().is_empty()) {
            reason += ", with caching switched off (PYTORCH_NO_CUDA_MEMORY_CACHING is set): every CUDA tensor is \
                       then a raw cudaMalloc that libtorch neither counts nor reports. Unset \
                       PYTORCH_NO_CUDA_MEMORY_CACHING for leak tests (keep it for compute-sanitizer runs)";
        } else if source == Source::Hook {
            reason += ", which reports no per-thread events to the hook. Use scope = \"process\" (the default \
                       for #[gpu_leak_test]), which counts it from the allocator's statistics where CUPTI is not \
                       free to count its driver calls";
        } else if let Ok(conf) = std::env::var("PYTORCH_CUDA_ALLOC_CONF") {
            reason += &format!(" (PYTORCH_CUDA_ALLOC_CONF={conf}); run leak tests without that setting");
        }
    }
    reason
}

/// Makes every source blind on `device` (`off = true`) or sighted again:
/// for tests of the "cannot measure" verdict. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn switch_off(device: Device, off: bool) {
    super::hook::switch_off_device(device, off);
}

/// The C++ heap's count, switched off by a test.
static HOST_OBJECTS_SWITCHED_OFF: AtomicBool = AtomicBool::new(false);

/// Makes libtorch's host objects uncounted (`off = true`: operator new
/// reports nothing, and costs nothing more) or counted again: for tests of
/// the "cannot measure" verdict, and the benchmark's variants without the
/// layer. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn switch_off_host_objects(off: bool) {
    HOST_OBJECTS_SWITCHED_OFF.store(off, Ordering::Relaxed);
    // SAFETY: sets an atomic flag.
    unsafe { super::ffi::glt_host_objects_switch_off(off as std::ffi::c_int) };
}

use super::hook::is_device_switched_off as is_switched_off;

#[cfg(test)]
mod tests {
    use super::*;

    fn coverage(driver: bool) -> Coverage {
        Coverage { cpu: true, cuda: Ok(()), driver: if driver { Ok(()) } else { Err("not set".into()) } }
    }

    #[test]
    fn a_blind_cuda_source_falls_back_to_the_allocators_driver_calls_then_to_its_statistics() {
        let cuda = Layer::Tensors(Device::Cuda(0));
        let counted = coverage(true);
        assert_eq!(fall_back(Source::Hook, cuda, false, &counted), Some(Source::CudaAllocatorCalls));
        assert_eq!(fall_back(Source::CudaTrace, cuda, true, &counted), Some(Source::CudaAllocatorCalls));
        assert_eq!(fall_back(Source::CudaAllocatorCalls, cuda, true, &counted), Some(Source::CudaStatistics));
        assert_eq!(fall_back(Source::CudaStatistics, cuda, true, &counted), None);
        // The hook's threads have no statistics of their own, and nothing
        // else falls back: the first source's reason stands.
        assert_eq!(fall_back(Source::CudaAllocatorCalls, cuda, false, &counted), None);
        assert_eq!(fall_back(Source::Hook, Layer::Tensors(Device::Cpu), false, &counted), None);
        assert_eq!(fall_back(Source::DriverCalls, Layer::OutsideLibtorch(Device::Cuda(0)), true, &counted), None);
        assert_eq!(fall_back(Source::Hook, cuda, false, &coverage(false)), None);
    }

    #[test]
    fn memory_outside_libtorch_is_counted_by_cuptis_callbacks_in_process_scope_and_the_hook_in_thread_scope() {
        let outside = Layer::OutsideLibtorch(Device::Cuda(1));
        assert_eq!(choose(outside, true, &coverage(true)), Source::DriverCalls);
        assert_eq!(choose(outside, false, &coverage(true)), Source::Hook);
        assert!(Source::DriverCalls.attributable() && Source::CudaAllocatorCalls.attributable());
    }

    #[test]
    fn where_the_trace_cannot_attach_cuda_tensors_are_counted_by_the_allocators_driver_calls_before_its_statistics() {
        let cuda = Layer::Tensors(Device::Cuda(0));
        let untraced = |driver| Coverage { cuda: Err("cudaMallocAsync".into()), ..coverage(driver) };
        assert_eq!(choose(cuda, true, &coverage(true)), Source::CudaTrace);
        assert_eq!(choose(cuda, true, &untraced(true)), Source::CudaAllocatorCalls);
        assert_eq!(choose(cuda, true, &untraced(false)), Source::CudaStatistics);
    }
}
