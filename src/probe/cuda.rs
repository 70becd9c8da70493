//! What the CUDA caching allocator and the driver say, through the shim.
//!
//! Every function here loads libtorch's CUDA library on first use (linkers
//! drop it with `--as-needed` when nothing names it) and answers
//! [`Error::NoCudaDevice`] on a machine without CUDA, never a panic.
use crate::error::{Error, Result};
use super::ffi;
use std::ffi::{c_char, c_int};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Current and peak value of one allocator statistic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    pub current: u64,
    pub peak: u64,
}

impl From<ffi::RawStat> for Stat {
    fn from(raw: ffi::RawStat) -> Self {
        Stat { current: raw.current.max(0) as u64, peak: raw.peak.max(0) as u64 }
    }
}

/// The caching allocator's statistics for one device (all pools together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes in blocks handed out to tensors (`torch.cuda.memory_allocated`).
    pub allocated_bytes: Stat,
    /// Bytes the allocator holds from the driver, used or cached
    /// (`torch.cuda.memory_reserved`).
    pub reserved_bytes: Stat,
    /// Bytes in active blocks: allocated, or freed but still in use by a stream.
    pub active_bytes: Stat,
    /// Bytes tensors asked for, before rounding to block sizes.
    pub requested_bytes: Stat,
    /// Number of live allocations.
    pub live_allocations: Stat,
    /// Number of segments obtained from the driver.
    pub segments: Stat,
    /// Allocations that failed once and succeeded after freeing the cache.
    pub alloc_retries: u64,
    /// Allocations that failed with out-of-memory.
    pub ooms: u64,
}

/// The driver's view of a device (`cudaMemGetInfo`), which includes other
/// processes, the CUDA context and everything the caching allocator keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverMemory {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

impl DriverMemory {
    pub fn used_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.free_bytes)
    }
}

/// Whether clearing cuBLAS workspaces did anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg(feature = "internals")]
pub enum CublasWorkspaces {
    Cleared,
    /// libtorch has no `at::cuda::clearCublasWorkspaces` (a CPU-only build).
    NotAvailable,
}

/// Whether this machine has an NVIDIA driver at all: its device nodes, its
/// `/proc` entry, or its library (WSL has only the library). Asked before
/// loading libtorch's CUDA library: PyPI's torch wheel is the CUDA build, and
/// loading it on a CPU-only machine costs each test process about 170 ms (a
/// gigabyte of CUDA libraries) only to find no device.
pub(crate) fn nvidia_driver_present() -> bool {
    let nodes = ["/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia"];
    nodes.iter().any(|path| std::path::Path::new(path).exists()) || {
        // SAFETY: a NUL-terminated name; the handle is kept, since libtorch's
        // CUDA runtime loads the same library anyway where it exists.
        !unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }.is_null()
    }
}

/// Nanoseconds this process spent starting CUDA: loading libtorch's CUDA
/// library, initialising the driver (counting devices), creating each
/// device's context. Any CUDA code pays them once per process; the harness
/// reports them apart from its own time.
static STARTUP_NANOS: AtomicU64 = AtomicU64::new(0);

/// CUDA's start-up time in this process so far (see `STARTUP_NANOS`).
pub fn startup_time() -> Duration {
    Duration::from_nanos(STARTUP_NANOS.load(Ordering::Relaxed))
}

fn add_startup(since: Instant) {
    STARTUP_NANOS.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// Why CUDA is unusable, decided once per process (on first use).
static REASON: OnceLock<Option<String>> = OnceLock::new();

fn cuda_unavailable_reason() -> Option<&'static str> {
    REASON
        .get_or_init(|| {
            if !nvidia_driver_present() {
                return Some("no NVIDIA driver on this machine (no /dev/nvidiactl, no libcuda.so.1)".into());
            }
            let started = Instant::now();
            let reason = load_and_count();
            add_startup(started);
            reason
        })
        .as_deref()
}

/// Loads libtorch's CUDA library and asks the driver for devices.
fn load_and_count() -> Option<String> {
    let mut loaded: c_int = 0;
    let mut why: *mut c_char = std::ptr::null_mut();
    // SAFETY: plain out-parameters.
    let error = unsafe { ffi::glt_load_torch_cuda(&mut loaded, &mut why) };
    let why = ffi::take_string(why);
    if let Err(e) = ffi::check("glt_load_torch_cuda", error) {
        return Some(e.to_string());
    }
    if loaded == 0 {
        return Some(format!(
            "libtorch_cuda.so could not be loaded ({})",
            why.unwrap_or_else(|| "no reason given".into())
        ));
    }
    let mut count = 0i32;
    // SAFETY: plain out-parameter.
    match ffi::check("glt_cuda_device_count", unsafe { ffi::glt_cuda_device_count(&mut count) }) {
        Err(e) => Some(e.to_string()),
        Ok(()) if count <= 0 => Some("the CUDA driver reports no device".into()),
        Ok(()) => None,
    }
}

/// True where CUDA is usable and libtorch's CUDA library is in the process
/// already: loaded for a CUDA test, or by the test binary's own link.
/// Without it no code in the process can make a CUDA tensor (tch's
/// `Cuda::is_available()` is false), so a test on the CPU neither follows
/// CUDA devices nor starts CUDA to find out: on a GPU runner that start
/// costs each CPU test's process 0.2 to 0.5 s, and the CPU test sees what it
/// sees on a machine without a GPU.
pub fn is_loaded() -> bool {
    if REASON.get().is_some() {
        return is_available();
    }
    let mut loaded: c_int = 0;
    // SAFETY: plain out-parameter.
    let asked = ffi::check("glt_torch_cuda_loaded", unsafe { ffi::glt_torch_cuda_loaded(&mut loaded) });
    asked.is_ok() && loaded == 1 && is_available()
}

/// [`device_count`] where CUDA is loaded already ([`is_loaded`]), else 0.
pub fn loaded_device_count() -> usize {
    if is_loaded() {
        device_count()
    } else {
        0
    }
}

/// Number of CUDA devices this process sees; 0 without CUDA.
pub fn device_count() -> usize {
    if cuda_unavailable_reason().is_some() {
        return 0;
    }
    let mut count = 0i32;
    // SAFETY: plain out-parameter.
    match ffi::check("glt_cuda_device_count", unsafe { ffi::glt_cuda_device_count(&mut count) }) {
        Ok(()) => count.max(0) as usize,
        Err(_) => 0,
    }
}

/// True when at least one CUDA device can be measured. Also makes `tch`'s
/// own `Cuda::is_available()` true, since it loads libtorch's CUDA library.
pub fn is_available() -> bool {
    cuda_unavailable_reason().is_none()
}

/// Checks that `cuda:index` exists and returns it as libtorch's index type.
pub fn check_device(index: usize) -> Result<i32> {
    if let Some(reason) = cuda_unavailable_reason() {
        return Err(Error::NoCudaDevice { reason: reason.to_string() });
    }
    let count = device_count();
    if index >= count {
        return Err(Error::NoSuchCudaDevice { index, count });
    }
    Ok(index as i32)
}

/// Makes sure CUDA is usable at all (for calls that are not per device).
fn check_any() -> Result<()> {
    match cuda_unavailable_reason() {
        Some(reason) => Err(Error::NoCudaDevice { reason: reason.to_string() }),
        None => Ok(()),
    }
}

pub fn allocator_stats(index: usize) -> Result<AllocatorStats> {
    let device = check_device(index)?;
    let mut raw = ffi::RawAllocatorStats::default();
    // SAFETY: `raw` is a repr(C) mirror of glt_allocator_stats.
    ffi::check("glt_cuda_allocator_stats", unsafe { ffi::glt_cuda_allocator_stats(device, &mut raw) })?;
    Ok(AllocatorStats {
        allocated_bytes: raw.allocated_bytes.into(),
        reserved_bytes: raw.reserved_bytes.into(),
        active_bytes: raw.active_bytes.into(),
        requested_bytes: raw.requested_bytes.into(),
        live_allocations: raw.allocations.into(),
        segments: raw.segments.into(),
        alloc_retries: raw.num_alloc_retries.max(0) as u64,
        ooms: raw.num_ooms.max(0) as u64,
    })
}

/// The CUDA allocator backend libtorch runs with, by its own name:
/// `native` (also with `expandable_segments`) or `cudaMallocAsync`.
pub fn allocator_backend() -> Result<String> {
    check_any()?;
    let mut name: *mut c_char = std::ptr::null_mut();
    // SAFETY: plain out-parameter; the shim hands over a malloc'd string.
    ffi::check("glt_cuda_allocator_backend", unsafe { ffi::glt_cuda_allocator_backend(&mut name) })?;
    Ok(ffi::take_string(name).unwrap_or_else(|| "unknown (this build has no CUDA headers)".into()))
}

/// Pinned host memory (`pin_memory()`) that libtorch's CUDA caching host
/// allocator holds, handed out or cached for reuse, for the whole process:
/// current and peak. `None` where CUDA is not loaded, so nothing is pinned.
/// A kept pinned copy per iteration grows it; a staging buffer reused, or a
/// pinned tensor dropped each iteration, reuses a cached block.
pub fn pinned_held_bytes() -> Option<Stat> {
    if !is_loaded() {
        return None;
    }
    let (mut current, mut peak, mut available) = (0i64, 0i64, 0 as c_int);
    // SAFETY: plain out-parameters.
    let asked = ffi::check("glt_cuda_pinned_held_bytes", unsafe {
        ffi::glt_cuda_pinned_held_bytes(&mut current, &mut peak, &mut available)
    });
    (asked.is_ok() && available == 1).then(|| Stat { current: current.max(0) as u64, peak: peak.max(0) as u64 })
}

/// Starts a new peak window in the pinned host allocator's statistics.
pub fn pinned_reset_peak() -> Result<()> {
    // SAFETY: no arguments; the shim checks that libtorch_cuda is loaded.
    ffi::check("glt_cuda_pinned_reset_peak", unsafe { ffi::glt_cuda_pinned_reset_peak() })
}

/// A CUDA device's model and compute capability, as `("NVIDIA H200", 9, 0)`,
/// or why the driver cannot tell.
pub fn device_kind(index: usize) -> std::result::Result<(String, i32, i32), String> {
    let device = check_device(index).map_err(|e| e.to_string())?;
    let (mut name, mut major, mut minor, mut available): (*mut c_char, c_int, c_int, c_int) = (std::ptr::null_mut(), 0, 0, 0);
    // SAFETY: plain out-parameters; `name` is a string the shim allocated.
    ffi::check("glt_cuda_device_kind", unsafe {
        ffi::glt_cuda_device_kind(device, &mut name, &mut major, &mut minor, &mut available)
    })
    .map_err(|e| e.to_string())?;
    let name = ffi::take_string(name).unwrap_or_default();
    if available != 0 {
        Ok((name, major, minor))
    } else {
        Err(name)
    }
}

/// Frees the pinned blocks no tensor uses (`torch._C._host_emptyCache`).
#[cfg(feature = "internals")]
pub fn pinned_empty_cache() -> Result<()> {
    check_any()?;
    // SAFETY: no arguments.
    ffi::check("glt_cuda_pinned_empty_cache", unsafe { ffi::glt_cuda_pinned_empty_cache() })
}

/// Takes `bytes` from the pinned host allocator and returns them, its cache
/// emptied around: the bytes it holds before, while held, and after.
pub(crate) fn pinned_canary(bytes: i64) -> Result<(i64, i64, i64)> {
    check_any()?;
    let (mut before, mut with, mut after) = (0, 0, 0);
    // SAFETY: plain out-parameters.
    ffi::check("glt_cuda_pinned_canary", unsafe { ffi::glt_cuda_pinned_canary(bytes, &mut before, &mut with, &mut after) })?;
    Ok((before, with, after))
}

/// Returns cached blocks that no tensor uses to the driver
/// (`torch.cuda.empty_cache()`): reserved drops, allocated does not.
#[cfg(feature = "internals")]
pub fn empty_cache() -> Result<()> {
    check_any()?;
    // SAFETY: no arguments.
    ffi::check("glt_cuda_empty_cache", unsafe { ffi::glt_cuda_empty_cache() })
}

/// Resets the allocator's peak statistics to their current values; frees nothing.
pub fn reset_peak_stats(index: usize) -> Result<()> {
    let device = check_device(index)?;
    // SAFETY: plain argument.
    ffi::check("glt_cuda_reset_peak_stats", unsafe { ffi::glt_cuda_reset_peak_stats(device) })
}

/// Waits for all work queued on the device.
pub fn synchronize(index: usize) -> Result<()> {
    let device = check_device(index)?;
    // SAFETY: plain argument.
    ffi::check("glt_cuda_synchronize", unsafe { ffi::glt_cuda_synchronize(device) })
}

pub fn driver_memory(index: usize) -> Result<DriverMemory> {
    let device = check_device(index)?;
    let (mut free_bytes, mut total_bytes) = (0u64, 0u64);
    // SAFETY: plain out-parameters.
    ffi::check("glt_cuda_driver_memory", unsafe {
        ffi::glt_cuda_driver_memory(device, &mut free_bytes, &mut total_bytes)
    })?;
    Ok(DriverMemory { free_bytes, total_bytes })
}

/// The device memory this process holds on `cuda:index`, as the driver
/// counts it per process (NVML, what `nvidia-smi` lists), or why that
/// cannot be read here. A view that confirms the counted layers: it takes
/// in everything the process holds on the device, contexts included.
pub fn process_memory(index: usize) -> std::result::Result<u64, String> {
    let device = check_device(index).map_err(|e| e.to_string())?;
    let (mut bytes, mut available, mut why): (u64, c_int, *mut c_char) = (0, 0, std::ptr::null_mut());
    // SAFETY: plain out-parameters; `why` is a string the shim allocated.
    ffi::check("glt_cuda_process_memory", unsafe {
        ffi::glt_cuda_process_memory(device, &mut bytes, &mut available, &mut why)
    })
    .map_err(|e| e.to_string())?;
    let why = ffi::take_string(why);
    if available != 0 {
        Ok(bytes)
    } else {
        Err(why.unwrap_or_else(|| "NVML gave no figure".into()))
    }
}

/// Frees cuBLAS's per-handle workspaces, which live in the caching allocator
/// and outlive every tensor.
#[cfg(feature = "internals")]
pub fn clear_cublas_workspaces() -> Result<CublasWorkspaces> {
    check_any()?;
    let mut available: c_int = 0;
    // SAFETY: plain out-parameter.
    ffi::check("glt_cuda_clear_cublas_workspaces", unsafe {
        ffi::glt_cuda_clear_cublas_workspaces(&mut available)
    })?;
    Ok(if available != 0 { CublasWorkspaces::Cleared } else { CublasWorkspaces::NotAvailable })
}

/// [`PrewarmParts::cuda_state`](crate::report::PrewarmParts::cuda_state)
/// part by part, past CUDA's start-up. The first three are the test
/// thread's wall time, one after the other; the last two are the device
/// thread's part, which ran beside it on a device's first prewarm and on
/// the test thread after: not shares of that time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct CudaStateTimes {
    /// The test thread's cuBLAS and cuBLASLt handles and workspaces; where
    /// libtorch lacks their getters, a matmul and its backward, which make
    /// the device thread's too.
    pub cublas_here: Duration,
    /// Growing the test thread's own autograd ready queue (once per thread).
    #[serde(default)]
    pub callers_queue: Duration,
    /// The device thread's part past the test thread's own parts: waiting
    /// for the thread beside, what of the next two the overlap did not
    /// hide; after a device's first prewarm, that part itself.
    #[serde(default)]
    pub waiting_beside: Duration,
    /// The device thread's part: autograd's device thread, started by a
    /// backward where it had not run, and its own cuBLAS state.
    pub autograd_worker: Duration,
    /// The device thread's part, after it: growing the device thread's
    /// ready queue (once per device and process).
    #[serde(default)]
    pub device_queue: Duration,
}

/// Creates, outside any measurement, the state libtorch keeps for good after
/// the first matmul and the first backward of a thread: cuBLAS and cuBLASLt
/// handles and workspaces (32 MiB and more per handle) for the calling
/// thread and for autograd's device thread. They belong to libtorch, not to
/// the test, and would otherwise show up as retention in whichever test ran
/// first. They are made directly, without a kernel: a first matmul and
/// backward also load their kernels, about 100 ms on an H200, which a body
/// that never multiplies would not pay. Then the device thread's ready
/// queue and the calling thread's own are grown (see
/// [`grow_autograd_ready_queue`]). On a device's first prewarm the device
/// thread's part runs from a thread beside the calling one, so the two
/// threads' parts overlap: both wait on the driver where other processes
/// start CUDA meanwhile. After that, the part is a backward that finds its
/// state made, and runs on the calling thread. Returns
/// where the time went past CUDA's start-up, which is counted apart
/// ([`startup_time`]).
pub fn prewarm(index: usize) -> Result<CudaStateTimes> {
    let device = check_device(index)?;
    let mut times = CudaStateTimes::default();
    // The device's context comes with its first tensor: CUDA's start-up,
    // counted apart (once per device and process).
    static CONTEXTS: AtomicU64 = AtomicU64::new(0);
    let bit = device_bit(index);
    if CONTEXTS.load(Ordering::Relaxed) & bit == 0 {
        let started = Instant::now();
        let context = tch::Tensor::f_zeros([1], (tch::Kind::Float, tch::Device::Cuda(index)));
        drop(context.map_err(|e| torch_error("the device's first tensor", e))?);
        synchronize(index)?;
        add_startup(started);
        CONTEXTS.fetch_or(bit, Ordering::Relaxed);
    }
    let first = QUEUES_GROWN.load(Ordering::Relaxed) & bit == 0;
    let (ready_here, ready_there) = std::thread::scope(|scope| -> Result<(bool, bool)> {
        let beside = first.then(|| {
            std::thread::Builder::new().name("gpu-leak-test-prewarm".into()).spawn_scoped(scope, || {
                // What this thread allocates is the harness's, and gone
                // once it is joined.
                let _harness = crate::layer::rust_heap::harness();
                ready_device_thread(device, index)
            })
        });
        let started = Instant::now();
        let mut ready: c_int = 0;
        // SAFETY: plain argument and out-parameter.
        let here = ffi::check("glt_cuda_ready_blas_here", unsafe { ffi::glt_cuda_ready_blas_here(device, &mut ready) });
        times.cublas_here = started.elapsed();
        let started = Instant::now();
        // The calling thread's own queue holds the device worker's wake-ups
        // for this thread's backwards (see `drain_autograd_ready_queue`).
        thread_local! {
            static CALLERS_QUEUE_GROWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        }
        let callers_queue = if CALLERS_QUEUE_GROWN.get() {
            Ok(())
        } else {
            grow_autograd_ready_queue(tch::Device::Cpu, CALLERS_QUEUE_TASKS).inspect(|()| CALLERS_QUEUE_GROWN.set(true))
        };
        times.callers_queue = started.elapsed();
        let started = Instant::now();
        // Joined before either result is looked at: the thread and what it
        // allocated are gone before anything is counted.
        let there = match beside {
            None => ready_device_thread(device, index),
            Some(spawned) => spawned
                .map_err(|e| e.to_string())
                .and_then(|beside| beside.join().map_err(|_| "it panicked".to_string()))
                .unwrap_or_else(|message| Err(Error::Libtorch { call: "the prewarm's thread beside the test's", message })),
        };
        times.waiting_beside = started.elapsed();
        here?;
        callers_queue?;
        let (ready_there, worker, device_queue) = there?;
        (times.autograd_worker, times.device_queue) = (worker, device_queue);
        Ok((ready != 0, ready_there))
    })?;
    if !(ready_here && ready_there) {
        let started = Instant::now();
        prewarm_through_a_matmul(index).map_err(|e| torch_error("a prewarming matmul", e))?;
        times.cublas_here += started.elapsed();
    }
    synchronize(index)?;
    Ok(times)
}

/// The device thread's part of [`prewarm`], from whichever thread runs it:
/// autograd's device thread reached by a backward and its cuBLAS state
/// made, then, once per device, its ready queue grown. Returns whether the
/// cuBLAS state is ready, and the two parts' times.
fn ready_device_thread(device: c_int, index: usize) -> Result<(bool, Duration, Duration)> {
    let started = Instant::now();
    let mut ready: c_int = 0;
    // SAFETY: plain argument and out-parameter.
    ffi::check("glt_cuda_ready_blas_on_worker", unsafe { ffi::glt_cuda_ready_blas_on_worker(device, &mut ready) })?;
    let worker = started.elapsed();
    let bit = device_bit(index);
    if QUEUES_GROWN.load(Ordering::Relaxed) & bit == 0 {
        grow_autograd_ready_queue(tch::Device::Cuda(index), READY_QUEUE_TASKS)?;
        QUEUES_GROWN.fetch_or(bit, Ordering::Relaxed);
    }
    Ok((ready != 0, worker, started.elapsed() - worker))
}

/// A device's bit in the per-device sets below and in `prewarm`. Devices
/// past the 64th share the last bit: no machine has that many.
fn device_bit(index: usize) -> u64 {
    1u64 << index.min(63)
}

/// By device, the queues the prewarm grew: autograd's worker threads for
/// devices run from the first one on.
static QUEUES_GROWN: AtomicU64 = AtomicU64::new(0);

/// Whether a device's autograd worker has run a backward in this process,
/// so that its wake-ups may wait in a caller's queue
/// ([`drain_autograd_ready_queue`]): true from the first CUDA prewarm on.
pub(crate) fn autograd_workers_started() -> bool {
    QUEUES_GROWN.load(Ordering::Relaxed) != 0
}

/// Tasks a calling thread's own queue can hold at once from the prewarm
/// on: the wake-ups its backwards may leave between two drains, 8.5 KiB of
/// `NodeTask`s on libtorch 2.11, made once per thread.
const CALLERS_QUEUE_TASKS: usize = 64;

/// Pops what autograd's device workers left in the calling thread's ready
/// queue: the wake-up tasks of backwards that finished before this thread
/// looked, each keeping its backward's `GraphTask` block (about 1 KiB)
/// allocated (see `glt_drain_autograd_ready_queue` in the shim). It runs a
/// backward of one leaf of no elements on the CPU: no tensor memory, and
/// what it allocates of libtorch's host objects it frees.
pub fn drain_autograd_ready_queue() -> Result<()> {
    // SAFETY: no arguments.
    ffi::check("glt_drain_autograd_ready_queue", unsafe { ffi::glt_drain_autograd_ready_queue() })
}

/// Tasks autograd's worker thread for a device can hold at once from the
/// prewarm on, without its queue growing: a capacity of 64 of libtorch's
/// `NodeTask`s, 8.5 KiB on libtorch 2.11, made once per device and process.
/// In the suite's two false leaks the queue grew to 8 and to 16 tasks. A
/// wider backward grows it in its first iteration, which the warm-up
/// absorbs. 64 rather than 256: growing costs per task, and under nextest
/// every CUDA test waits for it (0.55 to 0.90 ms against 1.9 to 3.4 on an
/// H200, benches/RESULTS.md, "A third H200").
const READY_QUEUE_TASKS: usize = 64;

/// Grows the autograd ready queue that runs `device`'s backward work (the
/// worker thread's for a CUDA device, the calling thread's own for the CPU)
/// to hold `tasks` at once, so that it does not grow later, in a measured
/// iteration (see `glt_grow_autograd_ready_queue` in the shim).
pub fn grow_autograd_ready_queue(device: tch::Device, tasks: usize) -> Result<()> {
    let index = match device {
        tch::Device::Cuda(index) => check_device(index)?,
        _ => -1,
    };
    let tasks = i32::try_from(tasks).unwrap_or(i32::MAX);
    // SAFETY: plain arguments.
    ffi::check("glt_grow_autograd_ready_queue", unsafe { ffi::glt_grow_autograd_ready_queue(index, tasks) })
}

/// The same state through what makes it in a body, where libtorch lacks
/// the functions that make it directly. Fallible calls only: a full device
/// is the body's to report, not a panic in the harness.
fn prewarm_through_a_matmul(index: usize) -> std::result::Result<(), tch::TchError> {
    let options = (tch::Kind::Float, tch::Device::Cuda(index));
    let weight = tch::Tensor::f_ones([16, 16], options)?.f_requires_grad_(true)?;
    let bias = tch::Tensor::f_zeros([16], options)?.f_requires_grad_(true)?;
    let input = tch::Tensor::f_ones([16, 16], options)?;
    let output = input.f_linear(&weight, Some(&bias))?.f_matmul(&weight)?;
    output.f_sum(tch::Kind::Float)?.f_backward()
}

/// libtorch's error in one of the harness's own tensor calls.
fn torch_error(call: &'static str, e: tch::TchError) -> Error {
    Error::Libtorch { call, message: e.to_string() }
}
