//! The memory sources: the exact per-thread allocation hook, the CUDA caching
//! allocator's statistics, and the driver's view. A [`Snapshot`] reads all of
//! them for one device at one moment.
pub mod cuda;
pub mod driver;
pub(crate) mod ffi;
pub mod hook;
pub mod host;
pub(crate) mod libtorch;
#[cfg(target_os = "linux")]
mod objects;
pub mod process;
pub mod stacks;
#[cfg(target_os = "linux")]
mod symbols;
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod unwind;

pub use cuda::{AllocatorStats, DriverMemory};
#[cfg(feature = "internals")]
pub use cuda::{CublasWorkspaces, Stat};
pub use hook::{HookGuard, HookView, LiveAllocation, Tracker};
#[cfg(feature = "internals")]
pub use hook::OutOfMemory;
pub use stacks::Frame;
#[cfg(feature = "internals")]
pub use stacks::{Stack, Symbolizer};

use std::time::{Duration, Instant};
use tch::Device;

/// Every view of one device's memory at one moment. `allocator` and `driver`
/// are `None` on the CPU, where libtorch keeps no statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub device: Device,
    /// Exact: what the tracker's threads allocated and have not freed.
    pub hook: HookView,
    pub allocator: Option<AllocatorStats>,
    /// The driver's free and total memory, every process's use in it: read
    /// only before and after the window ([`Snapshot::with_driver_views`]).
    pub driver: Option<DriverMemory>,
    /// The host heap in use (whole process), where the C library says.
    pub host_heap: Option<u64>,
    /// The device memory this process holds, as the driver counts it per
    /// process (NVML); read only before and after the window, with `driver`.
    pub process: Option<u64>,
}

/// Where a snapshot's time went, summed over snapshots: the calls that
/// wait on the device, the driver, or the size of the heap.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SnapshotTimes {
    /// Synchronising the device.
    pub(crate) synchronize: Duration,
    /// glibc's count of the host heap in use.
    pub(crate) host_heap: Duration,
}

impl Snapshot {
    /// Synchronises the device (so frees that wait on streams have happened)
    /// and reads every view. CUDA views that fail to read are left out.
    #[cfg(feature = "internals")]
    pub fn take(device: Device, tracker: &Tracker) -> Snapshot {
        Snapshot::take_timed(device, tracker, true, &mut SnapshotTimes::default()).with_driver_views()
    }

    /// A sample's views: [`Snapshot::take`] without the driver's, and
    /// reading the host heap only where `host_heap` says (glibc's count
    /// walks every free chunk, so its cost grows with the heap, and a long
    /// window reads it only every so many iterations). The time of each call
    /// that can wait on something outside the process is added to `times`.
    pub(crate) fn take_timed(device: Device, tracker: &Tracker, host_heap: bool, times: &mut SnapshotTimes) -> Snapshot {
        let allocator = match device {
            Device::Cuda(index) => {
                let started = Instant::now();
                let _ = cuda::synchronize(index);
                times.synchronize += started.elapsed();
                cuda::allocator_stats(index).ok()
            }
            _ => None,
        };
        let started = Instant::now();
        let host_heap = if host_heap { host::heap_in_use() } else { None };
        times.host_heap += started.elapsed();
        Snapshot { device, hook: tracker.view(device), allocator, driver: None, host_heap, process: None }
    }

    /// A snapshot of nothing, for scripted samples.
    #[cfg(test)]
    pub(crate) fn empty() -> Snapshot {
        Snapshot { device: Device::Cpu, hook: HookView::default(), allocator: None, driver: None, host_heap: None, process: None }
    }

    /// The same, with the driver's views: its free and total memory, and
    /// its per-process figure where NVML gives one. Both take in every
    /// process's use, so they are context, read before and after the window
    /// and never per sample: each is a call into the kernel driver, which
    /// waits behind any other process starting CUDA (up to 132 ms a test on
    /// an H200 under nextest).
    pub fn with_driver_views(mut self) -> Snapshot {
        if let Device::Cuda(index) = self.device {
            self.driver = cuda::driver_memory(index).ok();
            self.process = cuda::process_memory(index).ok();
        }
        self
    }
}
