//! A device's tensors: what libtorch's allocators hand out for tensor
//! storage, on the CPU (pinned host memory too) and on each CUDA device.
//!
//! Its sources:
//! - thread scope: the per-thread hook;
//! - process scope, on the CPU: the counting CPU allocator, plus the bytes
//!   CUDA's caching host allocator holds where CUDA is loaded (a pinned
//!   tensor is a CPU tensor);
//! - process scope, on CUDA: the caching allocator's trace tracker where it
//!   attaches (the native and `expandable_segments` backends), else what
//!   the allocator asks the driver for, through CUPTI
//!   (`backend:cudaMallocAsync`, caching switched off), and last the
//!   allocator's own statistics (exact bytes for the whole process, but no
//!   per-allocation events, so no sites).
//!
//! Its canary is a 512-byte tensor allocated and freed on the device; a
//! source that misses it falls back along that chain, and where every one
//! is blind the test is "cannot measure", naming the setting behind it.
use super::{Counting, Home, Layer, Peaks, Proof, CANARY_BYTES, HOOK};
use crate::probe::cuda;
use crate::probe::hook::{HookView, Tracker};
use crate::probe::process::Coverage;
use tch::Device;

/// The home of [`Layer::Tensors`].
pub(crate) struct Tensors;

impl Home for Tensors {
    fn name(&self, device: Device) -> String {
        super::device_name(device)
    }

    fn parse(&self, name: &str) -> Option<Layer> {
        super::device_from_name(name).map(Layer::Tensors)
    }

    fn plain_name(&self, device: Device) -> String {
        format!("tensors on {}", super::device_name(device))
    }

    fn description(&self, device: Device) -> &'static str {
        match device {
            Device::Cpu => "host memory through libtorch's CPU allocator (tensor storage)",
            _ => "device memory through libtorch's CUDA allocator",
        }
    }

    fn place(&self, device: Device) -> String {
        super::device_name(device)
    }

    fn what_grew(&self) -> Option<&'static str> {
        None
    }

    fn site_label(&self) -> Option<&'static str> {
        None
    }

    fn event_kind(&self, device: Device) -> Option<(i32, i32)> {
        use crate::probe::hook::{DEVICE_TYPE_CPU, DEVICE_TYPE_CUDA};
        match device {
            Device::Cpu => Some((DEVICE_TYPE_CPU, -1)),
            Device::Cuda(index) => Some((DEVICE_TYPE_CUDA, index as i32)),
            // libtorch's other devices (MPS, XPU) share one slot.
            _ => None,
        }
    }

    fn keeps_peak(&self) -> bool {
        true
    }

    fn count(&self, device: Device, process_scope: bool, coverage: &Coverage) -> Box<dyn Counting> {
        Box::new(Counted { device, source: choose(device, process_scope, coverage) })
    }
}

/// What counts one device's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
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
    /// What libtorch's CUDA allocator asks the driver for, through CUPTI:
    /// each tensor, where caching is off or the `cudaMallocAsync` backend
    /// reports nothing else. The hook's share on its threads in thread
    /// scope, the whole process's in process scope.
    CudaAllocatorCalls,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Hook => HOOK,
            Source::CountingCpuAllocator => "the counting CPU allocator",
            Source::CpuAndPinnedAllocators => {
                "the counting CPU allocator and the pinned host allocator's statistics (bytes it holds)"
            }
            Source::CudaTrace => "the CUDA caching allocator's trace",
            Source::CudaStatistics => "the CUDA allocator's statistics",
            Source::CudaAllocatorCalls => "libtorch's CUDA allocator's calls to the driver, seen through CUPTI",
        }
    }
}

/// The source that counts `device`'s tensors in this scope.
fn choose(device: Device, process_scope: bool, coverage: &Coverage) -> Source {
    match (device, process_scope) {
        (_, false) => Source::Hook,
        (Device::Cpu, true) if cuda::pinned_held_bytes().is_some() => Source::CpuAndPinnedAllocators,
        (Device::Cpu, true) => Source::CountingCpuAllocator,
        (_, true) if coverage.cuda.is_ok() => Source::CudaTrace,
        // Where the trace cannot attach (the cudaMallocAsync backend), the
        // allocator's own driver calls still count each tensor, and name its
        // site, which the statistics cannot.
        (_, true) if coverage.driver.is_ok() => Source::CudaAllocatorCalls,
        (_, true) => Source::CudaStatistics,
    }
}

/// The source to try after `source` was blind on CUDA tensors. The chain
/// ends: the statistics come last.
fn fall_back(source: Source, device: Device, process_scope: bool, coverage: &Coverage) -> Option<Source> {
    if !device.is_cuda() {
        return None;
    }
    match source {
        Source::Hook | Source::CudaTrace if coverage.driver.is_ok() => Some(Source::CudaAllocatorCalls),
        Source::CudaAllocatorCalls if process_scope => Some(Source::CudaStatistics),
        Source::Hook
        | Source::CudaTrace
        | Source::CudaAllocatorCalls
        | Source::CountingCpuAllocator
        | Source::CpuAndPinnedAllocators
        | Source::CudaStatistics => None,
    }
}

/// One device's tensors as one source counts them.
struct Counted {
    device: Device,
    source: Source,
}

impl Counted {
    fn layer_view(&self, tracker: &Tracker) -> HookView {
        tracker.layer_view(Layer::Tensors(self.device))
    }

    /// The CUDA device's statistics, where the source reads them.
    fn statistics(&self) -> Option<cuda::AllocatorStats> {
        match self.device {
            Device::Cuda(index) => cuda::allocator_stats(index).ok(),
            _ => None,
        }
    }
}

impl Counting for Counted {
    fn layer(&self) -> Layer {
        Layer::Tensors(self.device)
    }

    fn source_name(&self) -> &'static str {
        self.source.name()
    }

    fn attributable(&self) -> bool {
        self.source != Source::CudaStatistics
    }

    fn counts_events(&self) -> bool {
        self.source != Source::CudaStatistics
    }

    fn level(&self, tracker: &Tracker) -> i64 {
        match self.source {
            // The tracker drops a switched-off device's events itself.
            Source::CudaStatistics if is_switched_off(self.device) => 0,
            Source::CudaStatistics => self.statistics().map_or(0, |s| s.allocated_bytes.current as i64),
            Source::CpuAndPinnedAllocators => {
                self.layer_view(tracker).live_bytes + cuda::pinned_held_bytes().map_or(0, |s| s.current as i64)
            }
            // The hook's threads' pinned host memory is host memory too.
            Source::Hook if self.device == Device::Cpu => self.layer_view(tracker).live_bytes + tracker.pinned_view().live_bytes,
            Source::Hook | Source::CountingCpuAllocator | Source::CudaTrace | Source::CudaAllocatorCalls => {
                self.view(tracker).live_bytes
            }
        }
    }

    fn level_process_wide(&self, global: &Tracker) -> i64 {
        self.view(global).live_bytes
    }

    fn peaks(&self, tracker: &Tracker) -> Option<Peaks> {
        let own = self.layer_view(tracker).peak_bytes;
        Some(match self.source {
            Source::CudaStatistics => {
                let peak = self.statistics().map_or(0, |s| s.allocated_bytes.peak as i64);
                Peaks { peak, repeatable: peak }
            }
            // Two peaks taken apart: their sum bounds the peak of the sum.
            // When the pinned cache can reuse a block depends on when the
            // GPU's events complete, so its peak moves between identical
            // runs (on an H200 a trainer's step that checkpoints to the CPU
            // read 8 B in one run and 1.8 MiB in the next): what baselines
            // read takes what it holds now.
            Source::CpuAndPinnedAllocators => {
                let pinned = cuda::pinned_held_bytes();
                Peaks {
                    peak: own + pinned.map_or(0, |s| s.peak as i64),
                    repeatable: own + pinned.map_or(0, |s| s.current as i64),
                }
            }
            Source::Hook if self.device == Device::Cpu => {
                let pinned = tracker.pinned_view();
                Peaks { peak: own + pinned.peak_bytes, repeatable: own + pinned.live_bytes }
            }
            Source::Hook | Source::CountingCpuAllocator | Source::CudaTrace | Source::CudaAllocatorCalls => {
                let peak = self.view(tracker).peak_bytes;
                Peaks { peak, repeatable: peak }
            }
        })
    }

    /// For the allocator's statistics this resets libtorch's own peak
    /// (`torch.cuda.reset_peak_memory_stats`), which a process-scope test
    /// has to itself.
    fn reset_peak(&self, tracker: &Tracker) {
        match (self.source, self.device) {
            (Source::CudaStatistics, Device::Cuda(index)) => {
                let _ = cuda::reset_peak_stats(index);
            }
            (Source::CudaAllocatorCalls, Device::Cuda(index)) => tracker.reset_cuda_allocator_calls_peak(index),
            (Source::CpuAndPinnedAllocators, _) => {
                tracker.reset_peak(self.layer());
                let _ = cuda::pinned_reset_peak();
            }
            (
                Source::Hook
                | Source::CountingCpuAllocator
                | Source::CudaTrace
                | Source::CudaStatistics
                | Source::CudaAllocatorCalls,
                _,
            ) => tracker.reset_peak(self.layer()),
        }
    }

    fn events(&self, tracker: &Tracker) -> u64 {
        let view = self.view(tracker);
        view.allocations + view.frees
    }

    fn view(&self, tracker: &Tracker) -> HookView {
        match (self.source, self.device) {
            (Source::CudaAllocatorCalls, Device::Cuda(index)) => tracker.cuda_allocator_calls_view(index),
            (Source::CudaStatistics, _) => {
                let view = self.layer_view(tracker);
                match self.statistics() {
                    Some(s) => HookView {
                        live_bytes: s.allocated_bytes.current as i64,
                        peak_bytes: s.allocated_bytes.peak as i64,
                        ..view
                    },
                    None => view,
                }
            }
            (
                Source::Hook
                | Source::CountingCpuAllocator
                | Source::CpuAndPinnedAllocators
                | Source::CudaTrace
                | Source::CudaAllocatorCalls,
                _,
            ) => self.layer_view(tracker),
        }
    }

    fn watch_peak(&self, tracker: &Tracker) {
        tracker.watch_peak(self.layer(), self.source == Source::CudaAllocatorCalls);
    }

    /// Where the first source is blind on CUDA tensors, what libtorch's
    /// CUDA allocator asks the driver for is tried next (caching switched
    /// off, or the `cudaMallocAsync` backend on the hook), then in process
    /// scope the allocator's statistics. The first source's reason leads:
    /// it is the one a user sets up.
    fn prove(&mut self, proof: Proof<'_>) -> Result<i64, String> {
        let first = self.source;
        let mut why = match self.prove_once(proof) {
            Ok(added) => return Ok(added),
            Err(why) => why,
        };
        while let Some(next) = fall_back(self.source, self.device, proof.process_scope, proof.coverage) {
            self.source = next;
            match self.prove_once(proof) {
                Ok(added) => return Ok(added),
                Err(blind) => why += &format!(". Next, {} was tried, and was blind too: {blind}", next.name()),
            }
        }
        self.source = first;
        if let (Err(driver), Device::Cuda(_), Source::Hook | Source::CudaTrace) = (&proof.coverage.driver, self.device, first) {
            why += &format!(". Counting what libtorch's CUDA allocator asks the driver for instead is not possible either: {driver}");
        }
        Err(why)
    }

    fn coverage_note(&self, coverage: &Coverage) -> Option<String> {
        match (self.source, &coverage.cuda) {
            (Source::CudaStatistics, Err(why)) => Some(format!(
                "{} was counted from the CUDA allocator's statistics (exact bytes for the whole process): its trace \
                 tracker could not attach ({why}), so no sites can be named there",
                self.layer()
            )),
            _ => None,
        }
    }
}

impl Counted {
    /// A canary tensor on the device, which the source must see come and
    /// go; host memory that counts pinned bytes too is also proved with a
    /// pinned canary where the body runs on CUDA.
    fn prove_once(&self, proof: Proof<'_>) -> Result<i64, String> {
        if self.source == Source::CudaAllocatorCalls {
            crate::probe::driver::count_cuda_allocator_calls();
        }
        let added = super::canary_tensor(self.device, CANARY_BYTES, || self.level(proof.tracker))?
            .ok_or_else(|| self.blind_reason(proof.coverage))?;
        self.reset_peak(proof.tracker);
        match (self.source, proof.body) {
            (Source::CpuAndPinnedAllocators, Device::Cuda(_)) => prove_pinned().map(|()| added),
            _ => Ok(added),
        }
    }

    /// Why the source missed the canary, and what to do.
    fn blind_reason(&self, coverage: &Coverage) -> String {
        let (source, device) = (self.source, self.device);
        let missed = format!("before the body ran, a {CANARY_BYTES} B canary tensor allocated on it was not seen by {}", source.name());
        if source == Source::CudaAllocatorCalls && crate::probe::driver::is_switched_off() {
            return format!(
                "{missed}: the driver's calls were switched off for a test (gpu_leak_test::internals::probe::driver::switch_off)"
            );
        }
        if is_switched_off(device) {
            return format!("{missed}: the source was switched off for a test (gpu_leak_test::internals::switches::switch_off)");
        }
        let mut reason = missed;
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
}

/// The pinned half of host memory, where the body runs on CUDA (its
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

/// Makes every source blind on `device` (`off = true`) or sighted again:
/// for tests of the "cannot measure" verdict. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn switch_off(device: Device, off: bool) {
    crate::probe::hook::switch_off_device(device, off);
}

use crate::probe::hook::is_device_switched_off as is_switched_off;

#[cfg(test)]
mod tests {
    use super::*;

    fn coverage(driver: bool) -> Coverage {
        Coverage { cpu: true, cuda: Ok(()), driver: if driver { Ok(()) } else { Err("not set".into()) } }
    }

    #[test]
    fn a_blind_cuda_source_falls_back_to_the_allocators_driver_calls_then_to_its_statistics() {
        let cuda = Device::Cuda(0);
        let counted = coverage(true);
        assert_eq!(fall_back(Source::Hook, cuda, false, &counted), Some(Source::CudaAllocatorCalls));
        assert_eq!(fall_back(Source::CudaTrace, cuda, true, &counted), Some(Source::CudaAllocatorCalls));
        assert_eq!(fall_back(Source::CudaAllocatorCalls, cuda, true, &counted), Some(Source::CudaStatistics));
        assert_eq!(fall_back(Source::CudaStatistics, cuda, true, &counted), None);
        // The hook's threads have no statistics of their own, and nothing
        // else falls back: the first source's reason stands.
        assert_eq!(fall_back(Source::CudaAllocatorCalls, cuda, false, &counted), None);
        assert_eq!(fall_back(Source::Hook, Device::Cpu, false, &counted), None);
        assert_eq!(fall_back(Source::Hook, cuda, false, &coverage(false)), None);
    }

    #[test]
    fn where_the_trace_cannot_attach_cuda_tensors_are_counted_by_the_allocators_driver_calls_before_its_statistics() {
        let cuda = Device::Cuda(0);
        let untraced = |driver| Coverage { cuda: Err("cudaMallocAsync".into()), ..coverage(driver) };
        assert_eq!(choose(cuda, true, &coverage(true)), Source::CudaTrace);
        assert_eq!(choose(cuda, true, &untraced(true)), Source::CudaAllocatorCalls);
        assert_eq!(choose(cuda, true, &untraced(false)), Source::CudaStatistics);
        assert_eq!(choose(cuda, false, &coverage(true)), Source::Hook);
    }

    #[test]
    fn only_the_allocators_statistics_name_no_sites() {
        let statistics = Counted { device: Device::Cuda(0), source: Source::CudaStatistics };
        let calls = Counted { device: Device::Cuda(0), source: Source::CudaAllocatorCalls };
        assert!(!statistics.attributable() && !statistics.counts_events());
        assert!(calls.attributable() && calls.counts_events());
    }
}
