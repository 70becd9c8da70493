//! Memory allocated through the CUDA driver by code outside libtorch's
//! allocators: on the body's CUDA device (a custom kernel's `cuMemAlloc`,
//! NCCL's buffers, a library's `cudaMalloc`), and pinned host memory
//! (`cudaHostAlloc` outside libtorch's caching host allocator), seen
//! through CUPTI's callbacks on the driver's allocation calls
//! (csrc/driver_calls.cpp, `probe/driver.rs`).
//!
//! Its sources: the per-thread hook in thread scope, CUPTI's callbacks for
//! the whole process in process scope. Followed for a CUDA body unless
//! `GPU_LEAK_TEST_DRIVER_CALLS=0`; its canary is a raw driver allocation
//! made from outside libtorch.
use super::{Counting, Home, Layer, Peaks, Proof, CANARY_BYTES, HOOK};
use crate::probe::hook::{HookView, Tracker};
use crate::probe::process::Coverage;
use tch::Device;

/// The home of [`Layer::OutsideLibtorch`].
pub(crate) struct OutsideLibtorch;

/// The first part of its names: `outside-libtorch:cuda:0`.
const PREFIX: &str = "outside-libtorch";

/// What the body's CUDA device gets from the driver outside libtorch, and
/// pinned host memory likewise (a CPU body has neither in a process
/// without CUDA, so it follows them on no runner). Where the variable that
/// turns them on is not a boolean, they are followed, and their proof says
/// why they cannot be counted.
pub(crate) fn followed(body: Device) -> Vec<Layer> {
    if body.is_cuda() && crate::probe::driver::enabled().unwrap_or(true) {
        vec![Layer::OutsideLibtorch(body), Layer::OutsideLibtorch(Device::Cpu)]
    } else {
        Vec::new()
    }
}

impl Home for OutsideLibtorch {
    fn name(&self, device: Device) -> String {
        format!("{PREFIX}:{}", super::device_name(device))
    }

    fn parse(&self, name: &str) -> Option<Layer> {
        let device = name.strip_prefix(PREFIX)?.strip_prefix(':')?;
        super::device_from_name(device).map(Layer::OutsideLibtorch)
    }

    fn plain_name(&self, device: Device) -> String {
        format!("driver allocations outside libtorch on {}", super::device_name(device))
    }

    fn description(&self, device: Device) -> &'static str {
        match device {
            Device::Cuda(_) => {
                "device memory allocated through the CUDA driver outside libtorch's allocators (cuMemAlloc, \
                 cudaMalloc, cuMemCreate from other code)"
            }
            _ => {
                "pinned host memory allocated through the CUDA driver outside libtorch's caching host allocator \
                 (cudaHostAlloc, cuMemAllocHost from other code)"
            }
        }
    }

    fn place(&self, device: Device) -> String {
        match device {
            Device::Cuda(_) => format!(
                "{} (device memory allocated through the CUDA driver outside libtorch's allocators)",
                super::device_name(device)
            ),
            _ => "cpu (pinned host memory allocated through the CUDA driver outside libtorch)".to_string(),
        }
    }

    fn what_grew(&self) -> Option<&'static str> {
        Some(
            "What grew was allocated through the CUDA driver by code outside libtorch's allocators (cuMemAlloc, \
             cudaMalloc, cudaHostAlloc, cuMemCreate), seen through CUPTI: libtorch's allocator statistics and \
             empty_cache() do not know it.",
        )
    }

    fn site_label(&self) -> Option<&'static str> {
        Some("outside libtorch")
    }

    fn event_kind(&self, device: Device) -> Option<(i32, i32)> {
        let index = match device {
            Device::Cuda(index) => index as i32,
            _ => -1,
        };
        Some((crate::probe::hook::DEVICE_TYPE_OUTSIDE_LIBTORCH, index))
    }

    fn keeps_peak(&self) -> bool {
        false
    }

    fn count(&self, device: Device, process_scope: bool, _: &Coverage) -> Box<dyn Counting> {
        Box::new(Counted { on: device, source: if process_scope { Source::DriverCalls } else { Source::Hook } })
    }
}

/// What counts the driver's allocations outside libtorch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The hook's share: calls made on the hooked threads.
    Hook,
    /// CUPTI's callbacks on the CUDA driver's allocation calls, for the
    /// whole process.
    DriverCalls,
}

struct Counted {
    /// The CUDA device, or the CPU for pinned host memory.
    on: Device,
    source: Source,
}

impl Counting for Counted {
    fn layer(&self) -> Layer {
        Layer::OutsideLibtorch(self.on)
    }

    fn source_name(&self) -> &'static str {
        match self.source {
            Source::Hook => HOOK,
            Source::DriverCalls => "CUPTI's callbacks on the CUDA driver's allocation calls",
        }
    }

    fn level(&self, tracker: &Tracker) -> i64 {
        self.view(tracker).live_bytes
    }

    fn level_process_wide(&self, global: &Tracker) -> i64 {
        self.view(global).live_bytes
    }

    fn peaks(&self, _: &Tracker) -> Option<Peaks> {
        None
    }

    fn reset_peak(&self, tracker: &Tracker) {
        tracker.reset_peak(self.layer());
    }

    fn events(&self, tracker: &Tracker) -> u64 {
        let view = self.view(tracker);
        view.allocations + view.frees
    }

    fn view(&self, tracker: &Tracker) -> HookView {
        tracker.layer_view(self.layer())
    }

    fn watch_peak(&self, tracker: &Tracker) {
        tracker.watch_peak(self.layer(), false);
    }

    /// A raw driver allocation from outside libtorch must raise the count
    /// by its size, and its free lower it again.
    fn prove(&mut self, proof: Proof<'_>) -> Result<i64, String> {
        let what = if self.on == Device::Cpu { "pinned host" } else { "device" };
        let blind = |why: &str| {
            format!(
                "before the body ran, a {CANARY_BYTES} B {what} canary allocated through the CUDA driver was not \
                 counted by {}: {why}",
                self.source_name()
            )
        };
        if let Err(why) = &proof.coverage.driver {
            return Err(blind(why));
        }
        let index = match proof.body {
            Device::Cuda(index) => index,
            _ => 0,
        };
        for _ in 0..3 {
            self.reset_peak(proof.tracker);
            let before = self.view(proof.tracker);
            let walked =
                crate::probe::driver::canary(index, CANARY_BYTES, self.on == Device::Cpu).map_err(|why| blind(&why))?;
            let after = self.view(proof.tracker);
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
                self.reset_peak(proof.tracker);
                return Ok(CANARY_BYTES);
            }
        }
        Err(blind(if crate::probe::driver::is_switched_off() {
            "the count was switched off for a test (gpu_leak_test::internals::probe::driver::switch_off)"
        } else {
            "CUPTI did not report the call. A tool that intercepts the driver (an injection library, a wrapper that \
             calls the driver through cuGetProcAddress tables of its own) can hide calls from CUPTI; run leak tests \
             without it"
        }))
    }

}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_outside_libtorch_is_counted_by_cuptis_callbacks_in_process_scope_and_the_hook_in_thread_scope() {
        let coverage = Coverage { cpu: true, cuda: Ok(()), driver: Ok(()) };
        let process = OutsideLibtorch.count(Device::Cuda(1), true, &coverage);
        let thread = OutsideLibtorch.count(Device::Cuda(1), false, &coverage);
        assert_eq!(process.source_name(), "CUPTI's callbacks on the CUDA driver's allocation calls");
        assert_eq!(thread.source_name(), HOOK);
        assert!(process.attributable() && process.counts_events());
    }
}
