//! libtorch's host objects: its C++ heap (autograd's graph nodes,
//! saved-variable records, `TensorImpl`s), counted through the shim's
//! replacement of operator new (csrc/host_objects.cpp).
//!
//! Its sources: the per-thread hook in thread scope (the C++ heap of the
//! hooked threads), the shim's own sums for the whole process in process
//! scope. Its count keeps no peak, so no budget or baseline is set on it.
//!
//! Its canary is the CPU canary tensor: libtorch allocates the tensor's own
//! records (`TensorImpl`, `StorageImpl`) on this heap, so a binary where
//! the replacement did not take is "cannot measure".
use super::{Attributed, Counting, Home, Layer, Peaks, Proof, HOOK};
use crate::probe::hook::{HookView, Tracker};
use crate::probe::process::{self, Coverage};
use crate::verdict::{Leak, Verdict};
use std::sync::atomic::{AtomicBool, Ordering};
use tch::Device;

/// The home of [`Layer::HostObjects`].
pub(crate) struct HostObjects;

/// Its name in reports and the JSON.
const NAME: &str = "host-objects";

impl Home for HostObjects {
    fn name(&self, _: Device) -> String {
        NAME.to_string()
    }

    fn parse(&self, name: &str) -> Option<Layer> {
        (name == NAME).then_some(Layer::HostObjects)
    }

    fn plain_name(&self, _: Device) -> String {
        "libtorch's host objects".to_string()
    }

    fn description(&self, _: Device) -> &'static str {
        "libtorch's host objects: its C++ heap (autograd graph nodes, saved-variable records, TensorImpls)"
    }

    fn place(&self, device: Device) -> String {
        format!("{} (libtorch's host objects)", super::device_name(device))
    }

    fn what_grew(&self) -> Option<&'static str> {
        Some(
            "What grew is libtorch's host objects, its C++ heap (autograd graph nodes, saved-variable records, \
             TensorImpls), not tensor storage: a kept graph, or kept tensors' records.",
        )
    }

    fn kept_hint(&self, place: &str) -> String {
        format!(
            "libtorch's C++ objects allocated at {place} outlive each iteration: a tensor \
             you keep across iterations still holds its autograd graph (`total = total + loss` \
             keeps every step's nodes). Keep plain numbers (`total += loss.double_value(&[])`), or `detach()` \
             what you keep."
        )
    }

    fn site_label(&self) -> Option<&'static str> {
        Some("host objects")
    }

    fn event_kind(&self, _: Device) -> Option<(i32, i32)> {
        Some((crate::probe::hook::DEVICE_TYPE_HOST_OBJECTS, -1))
    }

    fn keeps_peak(&self) -> bool {
        false
    }

    fn count(&self, _: Device, process_scope: bool, _: &Coverage) -> Box<dyn Counting> {
        Box::new(Counted { source: if process_scope { Source::OperatorNew } else { Source::Hook } })
    }

    /// Host objects leak only where a site kept memory and the layer's
    /// trough rose: libtorch's own bookkeeping comes and goes.
    fn after_attribution(&self, leak: &Leak, found: &Attributed) -> Verdict {
        crate::verdict::host_objects_after_attribution(
            leak,
            found.replaced,
            found.trough_rose,
            found.suppressed_per_iteration,
            found.window,
            found.threshold_bytes,
        )
    }

    /// One: autograd's device worker lets go of a backward's `GraphTask`
    /// (its block about 1 KiB) just after the caller's `backward()` has
    /// returned, and its wake-up, which keeps the block, may reach this
    /// thread's queue just after [`Counting::settle`] drained it. So at a
    /// sample the last one is still alive at times, and now and then the
    /// one before (an H200 under `cudaMallocAsync` saw iterations 9 and 10
    /// of 10 alive). What piles up leaves survivors further back.
    fn iterations_a_free_may_lag(&self) -> u32 {
        1
    }
}

/// What counts the C++ heap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The per-thread hook's share: blocks allocated on the hooked threads.
    Hook,
    /// The shim's replacement of operator new, for the whole process's C++
    /// heap: counted in the shim, without a lock or a map.
    OperatorNew,
}

struct Counted {
    source: Source,
}

/// The least a CPU canary's own records add to the C++ heap: its
/// `TensorImpl` and `StorageImpl` (libtorch's operator new calls; about
/// 300 B in 2.11), more than tch's own 8-byte handle (a 24 B block), which
/// the test binary allocates itself and would count even where libtorch's
/// calls did not reach the replacement.
const RECORDS_CANARY_BYTES: i64 = 128;

impl Counting for Counted {
    fn layer(&self) -> Layer {
        Layer::HostObjects
    }

    fn source_name(&self) -> &'static str {
        match self.source {
            Source::Hook => HOOK,
            Source::OperatorNew => "operator new (the process's C++ heap)",
        }
    }

    /// Frees the `GraphTask` blocks that autograd's device workers' wake-ups
    /// keep in this thread's ready queue: they pile up for as long as the
    /// workers finish this thread's backwards before it looks, 1 KiB a
    /// backward, then go all at once (see
    /// `probe::cuda::drain_autograd_ready_queue`). Only where a device's
    /// worker ran: a CPU backward leaves none.
    fn settle(&self) {
        if crate::probe::cuda::autograd_workers_started() {
            // Best effort: a drain that fails leaves the level as it was.
            let _ = crate::probe::cuda::drain_autograd_ready_queue();
        }
    }

    fn level(&self, tracker: &Tracker) -> i64 {
        match self.source {
            Source::Hook => self.view(tracker).live_bytes,
            Source::OperatorNew => process::host_objects().0,
        }
    }

    fn level_process_wide(&self, _: &Tracker) -> i64 {
        process::host_objects().0
    }

    fn peaks(&self, _: &Tracker) -> Option<Peaks> {
        None
    }

    fn reset_peak(&self, tracker: &Tracker) {
        match self.source {
            Source::Hook => tracker.reset_peak(Layer::HostObjects),
            Source::OperatorNew => {}
        }
    }

    fn events(&self, tracker: &Tracker) -> u64 {
        match self.source {
            Source::Hook => {
                let view = self.view(tracker);
                view.allocations + view.frees
            }
            Source::OperatorNew => process::host_objects().1,
        }
    }

    fn view(&self, tracker: &Tracker) -> HookView {
        tracker.layer_view(Layer::HostObjects)
    }

    fn watch_peak(&self, tracker: &Tracker) {
        tracker.watch_peak(Layer::HostObjects, false);
    }

    /// `Ok` is one CPU tensor's records, which the protocol uses to tell a
    /// tensor leak's own records from a kept graph.
    fn prove(&mut self, proof: Proof<'_>) -> Result<i64, String> {
        let added = super::canary_tensor(Device::Cpu, RECORDS_CANARY_BYTES, || self.level(proof.tracker))?
            .ok_or_else(|| self.blind_reason())?;
        self.reset_peak(proof.tracker);
        Ok(added)
    }

    fn feeds_sites_on_request(&self) -> bool {
        self.source == Source::OperatorNew
    }
}

impl Counted {
    /// Why the C++ heap missed the canary's records, and what to do.
    fn blind_reason(&self) -> String {
        let mut reason = format!(
            "before the body ran, the {RECORDS_CANARY_BYTES} B or more of C++ objects libtorch allocates for a \
             canary tensor (its TensorImpl and StorageImpl) were not seen by {}",
            self.source_name()
        );
        if SWITCHED_OFF.load(Ordering::Relaxed) {
            reason += ": the C++ heap's count was switched off for a test \
                       (gpu_leak_test::internals::switches::switch_off_host_objects)";
        } else {
            reason += ". gpu-leak-test counts libtorch's host objects by replacing operator new in the test binary, \
                       and libtorch's calls did not reach it: the binary links the C++ runtime statically, or another \
                       library in it replaces operator new too (a memory profiler, tcmalloc or jemalloc's C++ \
                       interposition). Link libstdc++ dynamically in test binaries, or load the other allocator only \
                       outside leak tests";
        }
        reason
    }
}

/// How many CPU blocks libtorch's table of profiled ones holds once the
/// process's first thread-scope leak test has grown it: a 64 KiB bucket
/// array, 0.8 ms. Past that many alive at once on hooked threads, every
/// test's together, it grows again, on whichever hooked thread inserts the
/// next one.
const CPU_SIZE_TABLE_BLOCKS: usize = 8192;

/// Grows libtorch's table of profiled CPU blocks, once per process, before
/// the first thread-scope leak test measures anything. In thread scope the
/// hook turns memory profiling on, and libtorch records every CPU block of
/// a hooked thread in one table for the whole process, whose bucket array
/// never shrinks: grown where it is full, it lands in the host objects of
/// the test whose insert found it full, though other tests' blocks filled
/// it (see `probe::hook::grow_cpu_size_table`). Process scope turns nothing
/// on. Best effort: a table not grown leaves the one-off where it was.
pub(crate) fn grow_cpu_size_table_once() {
    static GROWN: std::sync::Once = std::sync::Once::new();
    GROWN.call_once(|| {
        let _ = crate::probe::hook::grow_cpu_size_table(CPU_SIZE_TABLE_BLOCKS);
    });
}

/// The C++ heap's count, switched off by a test.
static SWITCHED_OFF: AtomicBool = AtomicBool::new(false);

/// Makes libtorch's host objects uncounted (`off = true`: operator new
/// reports nothing, and costs nothing more) or counted again: for tests of
/// the "cannot measure" verdict, and the benchmark's variants without the
/// layer. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn switch_off_host_objects(off: bool) {
    SWITCHED_OFF.store(off, Ordering::Relaxed);
    // SAFETY: sets an atomic flag.
    unsafe { crate::probe::ffi::glt_host_objects_switch_off(off as std::ffi::c_int) };
}
