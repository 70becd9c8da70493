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
//! The sources:
//! - thread scope: the per-thread hook, on every device;
//! - process scope: the counting CPU allocator on the CPU, plus the bytes
//!   CUDA's caching host allocator holds where CUDA is loaded (a pinned
//!   tensor is a CPU tensor); on CUDA the
//!   caching allocator's trace tracker where it attaches (the native and
//!   `expandable_segments` backends), else the allocator's own device
//!   statistics (`backend:cudaMallocAsync`: exact bytes for the whole
//!   process, but no per-allocation events, so no sites).
use super::hook::Tracker;
use super::{cuda, process::Coverage};
use std::sync::atomic::{AtomicU32, Ordering};
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
        }
    }

    /// True where the source sees each allocation, so survivors can be
    /// grouped by site; statistics give totals only.
    pub fn attributable(self) -> bool {
        !matches!(self, Source::CudaStatistics)
    }

    /// The memory it counts, as the report names the layer.
    pub fn layer(device: Device) -> &'static str {
        match device {
            Device::Cpu => "host memory through libtorch's CPU allocator",
            _ => "device memory through libtorch's CUDA allocator",
        }
    }

    /// The verdict where this source cannot back one on `device`, and why.
    pub(crate) fn cannot_measure(self, device: Device, reason: String) -> crate::verdict::Verdict {
        crate::verdict::Verdict::CannotMeasure { layer: Self::layer(device).to_string(), source: self.name().to_string(), reason }
    }
}

/// The source that counts `device` in this scope.
pub(crate) fn choose(device: Device, process_scope: bool, coverage: &Coverage) -> Source {
    match (device, process_scope) {
        (_, false) => Source::Hook,
        (Device::Cpu, true) if cuda::pinned_held_bytes().is_some() => Source::CpuAndPinnedAllocators,
        (Device::Cpu, true) => Source::CountingCpuAllocator,
        (_, true) if coverage.cuda.is_ok() => Source::CudaTrace,
        (_, true) => Source::CudaStatistics,
    }
}

/// Live bytes on `device` as `source` counts them now.
pub(crate) fn level(source: Source, device: Device, tracker: &Tracker) -> i64 {
    match (source, device) {
        // The tracker drops a switched-off device's events itself.
        (Source::CudaStatistics, _) if is_switched_off(device) => 0,
        (Source::CudaStatistics, Device::Cuda(index)) => {
            cuda::allocator_stats(index).map(|s| s.allocated_bytes.current as i64).unwrap_or(0)
        }
        (Source::CpuAndPinnedAllocators, _) => {
            tracker.live_bytes(device) + cuda::pinned_held_bytes().map_or(0, |s| s.current as i64)
        }
        _ => tracker.live_bytes(device),
    }
}

/// The highest live bytes on `device` since the last [`reset_peak`].
pub(crate) fn peak(source: Source, device: Device, tracker: &Tracker) -> i64 {
    match (source, device) {
        (Source::CudaStatistics, Device::Cuda(index)) => {
            cuda::allocator_stats(index).map(|s| s.allocated_bytes.peak as i64).unwrap_or(0)
        }
        // Two peaks taken apart: their sum bounds the peak of the sum.
        (Source::CpuAndPinnedAllocators, _) => {
            tracker.view(device).peak_bytes + cuda::pinned_held_bytes().map_or(0, |s| s.peak as i64)
        }
        _ => tracker.view(device).peak_bytes,
    }
}

/// Starts a new peak window on `device`. For the allocator's statistics this
/// resets libtorch's own peak (`torch.cuda.reset_peak_memory_stats`), which
/// a process-scope test has to itself.
pub(crate) fn reset_peak(source: Source, device: Device, tracker: &Tracker) {
    match (source, device) {
        (Source::CudaStatistics, Device::Cuda(index)) => {
            let _ = cuda::reset_peak_stats(index);
        }
        _ => tracker.reset_peak(device),
    }
}

/// Bytes of the canary: one block of the caching allocator, and exact on the CPU.
const CANARY_BYTES: i64 = 512;

/// Allocates and frees a canary tensor on `device` (on this thread) and
/// checks that `source` saw both, up to three tries (another thread's
/// allocation in between can hide it once). Host memory that counts pinned
/// bytes too is also proved with a pinned canary, where the body runs on
/// CUDA (`body`). `Err` says why it is blind.
pub(crate) fn prove(source: Source, device: Device, body: Device, tracker: &Tracker, coverage: &Coverage) -> Result<(), String> {
    let sync = || {
        if let Device::Cuda(index) = device {
            let _ = cuda::synchronize(index);
        }
    };
    let seen = (0..3).any(|_| {
        let before = level(source, device, tracker);
        let canary = tch::Tensor::zeros([CANARY_BYTES / 4], (tch::Kind::Float, device));
        sync();
        let with = level(source, device, tracker);
        drop(canary);
        sync();
        let after = level(source, device, tracker);
        with - before >= CANARY_BYTES && with - after >= CANARY_BYTES
    });
    if !seen {
        return Err(blind_reason(source, device, coverage));
    }
    reset_peak(source, device, tracker);
    match (source, body) {
        (Source::CpuAndPinnedAllocators, Device::Cuda(_)) => prove_pinned(body),
        _ => Ok(()),
    }
}

/// The pinned half of host memory, where the body runs on `cuda` (its
/// context exists, so pinning starts nothing new). The host allocator
/// counts the bytes it holds, so the proof is a block made and returned:
/// its cache is emptied around a pinned canary, which must raise the count
/// and, emptied again, lower it.
fn prove_pinned(cuda: Device) -> Result<(), String> {
    let held = || cuda::pinned_held_bytes().map_or(0, |s| s.current as i64);
    for _ in 0..3 {
        let _ = cuda::pinned_empty_cache();
        let before = held();
        let canary = tch::Tensor::zeros([CANARY_BYTES / 4], (tch::Kind::Float, Device::Cpu)).pin_memory(cuda);
        let with = held();
        drop(canary);
        let _ = cuda::pinned_empty_cache();
        if with - before >= CANARY_BYTES && with - held() >= CANARY_BYTES {
            return Ok(());
        }
    }
    Err(format!(
        "before the body ran, a {CANARY_BYTES} B pinned canary tensor (pin_memory) was not seen by the pinned host \
         allocator's statistics"
    ))
}

/// Why `source` missed the canary on `device`, and what to do.
fn blind_reason(source: Source, device: Device, coverage: &Coverage) -> String {
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
                       for #[gpu_leak_test]), which counts it from the allocator's statistics";
        } else if let Ok(conf) = std::env::var("PYTORCH_CUDA_ALLOC_CONF") {
            reason += &format!(" (PYTORCH_CUDA_ALLOC_CONF={conf}); run leak tests without that setting");
        }
    }
    reason
}

/// Devices whose sources a test switched off ([`switch_off`]), one bit per
/// tracker slot: the CPU is bit 0, cuda:N bit N+1.
static SWITCHED_OFF: AtomicU32 = AtomicU32::new(0);

fn bit(device: Device) -> u32 {
    match device {
        Device::Cpu => 1,
        Device::Cuda(index) if index < 31 => 1 << (index + 1),
        _ => 0,
    }
}

/// Makes every source blind on `device` (`off = true`) or sighted again:
/// for tests of the "cannot measure" verdict. Not for users.
#[doc(hidden)]
pub fn switch_off(device: Device, off: bool) {
    if off {
        SWITCHED_OFF.fetch_or(bit(device), Ordering::Relaxed);
    } else {
        SWITCHED_OFF.fetch_and(!bit(device), Ordering::Relaxed);
    }
}

fn is_switched_off(device: Device) -> bool {
    SWITCHED_OFF.load(Ordering::Relaxed) & bit(device) != 0
}

/// True where events of tracker slot `slot` (0 the CPU, N+1 cuda:N) are
/// to be dropped: one relaxed load per event, zero outside such tests.
#[inline]
pub(crate) fn slot_switched_off(slot: usize) -> bool {
    let mask = SWITCHED_OFF.load(Ordering::Relaxed);
    mask != 0 && slot < 32 && mask & (1 << slot) != 0
}
