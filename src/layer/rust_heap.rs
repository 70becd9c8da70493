//! The Rust heap: what the test's Rust code allocates through the global
//! allocator and keeps (a data loader's cache of decoded samples, a `Vec`
//! that is never drained), counted by [`RustHeap`], a counting wrapper
//! around the global allocator. This crate installs it through its default
//! feature `rust-heap`; a binary with its own `#[global_allocator]` wraps
//! that one in a line (see [`RustHeap`]).
//!
//! Its source: the allocator's own sums for the whole process, in process
//! scope (every leak test made by the attribute under nextest or
//! `cargo test`). Thread scope shares the process with other tests, whose
//! Rust allocations cannot be told apart, so there the layer is not
//! followed and the report says so. Its count keeps no peak.
//!
//! Nothing is counted twice: tensor storage comes from libtorch's CPU
//! allocator and libtorch's objects from operator new, neither of which is
//! Rust's global allocator. The harness's own allocations on the test's
//! thread are made in harness mode ([`harness`]) and not counted; only the
//! body's calls ([`as_test`]) and every other thread count.
//!
//! Its rule (`verdict::rust_heap_decide`): growth whose shape is a leak
//! passes where, amortised over every call of the body, it keeps at most
//! [`ALLOWANCE_BYTES_PER_CALL`]. A `Vec` that doubles its capacity holds at
//! most twice what was pushed, so a log of one `f64` per step keeps at most
//! 16 B per call, however its steps fall; a kept 256 KiB sample keeps 256
//! KiB per call.
use super::{Counting, Home, Layer, Peaks, Proof};
use crate::probe::hook::{HookView, Tracker};
use crate::probe::process::Coverage;
use crate::scope::ResolvedScope;
use crate::verdict::{Series, Verdict};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use tch::Device;

/// Growth per call of the body, amortised over the run, that the Rust heap
/// may keep and pass. Measured over the whole suite under nextest
/// (`benches/RESULTS.md`, "The Rust heap's noise"): the most any passing
/// test kept was 13 B per call (a line printed each step), the most beside
/// another layer's leak 68 B (a `Vec` of kept tensor handles); a kept
/// sample of a data pipeline keeps hundreds of KiB.
pub(crate) const ALLOWANCE_BYTES_PER_CALL: u64 = 1024;

/// Counts the Rust heap for gpu-leak-test: a global allocator that hands
/// every call to `A` and counts the bytes. The default feature `rust-heap`
/// installs `RustHeap<System>` in every test binary that links this crate.
///
/// A crate with a `#[global_allocator]` of its own (mimalloc, jemalloc)
/// turns the default features off and wraps its allocator in one line, as
/// with dhat's `Alloc`:
///
/// ```ignore
/// #[global_allocator]
/// static ALLOCATOR: gpu_leak_test::settings::RustHeap<mimalloc::MiMalloc> =
///     gpu_leak_test::settings::RustHeap::new(mimalloc::MiMalloc);
/// ```
///
/// Where neither is the global allocator, the Rust heap is not counted, and
/// every report says so, with this fix.
pub struct RustHeap<A = System> {
    inner: A,
}

impl<A> RustHeap<A> {
    /// Wraps `inner`, which does the allocating.
    pub const fn new(inner: A) -> Self {
        RustHeap { inner }
    }
}

// SAFETY: every call goes to `inner` with the caller's own arguments and
// returns what it returned; counting reads and writes only atomics and
// trivially destructible thread-locals, and allocates only in harness
// mode, where nothing re-enters it.
unsafe impl<A: GlobalAlloc> GlobalAlloc for RustHeap<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.inner.alloc(layout) };
        if !ptr.is_null() {
            count(ptr, layout.size() as i64);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { self.inner.alloc_zeroed(layout) };
        if !ptr.is_null() {
            count(ptr, layout.size() as i64);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(ptr, -(layout.size() as i64));
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let moved = unsafe { self.inner.realloc(ptr, layout, new_size) };
        if !moved.is_null() {
            count(ptr, -(layout.size() as i64));
            count(moved, new_size as i64);
        }
        moved
    }
}

/// Per-thread shards of the count. The first threads each get one of
/// their own, which only they write, so a count is a plain load and store
/// (no locked instruction); threads beyond them share the last one, with
/// atomic additions.
const SHARDS: usize = 64;
const SHARED: usize = SHARDS - 1;

#[repr(align(128))]
struct Shard {
    bytes: AtomicI64,
    events: AtomicU64,
}

static COUNT: [Shard; SHARDS] = [const { Shard { bytes: AtomicI64::new(0), events: AtomicU64::new(0) } }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
/// Set by the first allocation counted: [`RustHeap`] is in use.
static IN_USE: AtomicBool = AtomicBool::new(false);
/// Set while attribution records the Rust heap's sites.
static RECORDING: AtomicBool = AtomicBool::new(false);
/// Set by the benchmark's variant without this layer.
static SWITCHED_OFF: AtomicBool = AtomicBool::new(false);

thread_local! {
    // Trivial and `const`: safe to read from inside the allocator, and
    // while the thread is torn down.
    static HARNESS_MODE: Cell<bool> = const { Cell::new(false) };
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Counts one allocation (`bytes` > 0) or free on this thread, unless the
/// harness made it; while recording, feeds it to attribution too.
#[inline]
fn count(ptr: *mut u8, bytes: i64) {
    if SWITCHED_OFF.load(Relaxed) || HARNESS_MODE.try_with(Cell::get).unwrap_or(true) {
        return;
    }
    let index = SHARD
        .try_with(|shard| {
            if shard.get() == usize::MAX {
                shard.set(NEXT_SHARD.fetch_add(1, Relaxed).min(SHARED));
            }
            shard.get()
        })
        .unwrap_or(SHARED);
    let shard = &COUNT[index];
    if index == SHARED {
        shard.bytes.fetch_add(bytes, Relaxed);
        shard.events.fetch_add(1, Relaxed);
    } else {
        // This thread is the shard's only writer.
        shard.bytes.store(shard.bytes.load(Relaxed) + bytes, Relaxed);
        shard.events.store(shard.events.load(Relaxed) + 1, Relaxed);
    }
    if !IN_USE.load(Relaxed) {
        IN_USE.store(true, Relaxed);
    }
    if RECORDING.load(Relaxed) {
        let _harness = harness();
        crate::probe::process::feed_rust_heap(ptr as usize, bytes);
    }
}

/// This thread's own shard's live bytes, where it has one (see [`count`]).
/// A canary read there sees its own block alone, whatever other threads
/// allocate meanwhile: libtest-mimic starts one worker per core and runs
/// the test on the first while it still spawns the rest, and on a loaded
/// 16-core H200 runner that failed all three canary reads over every
/// shard.
fn own_shard_bytes() -> Option<i64> {
    let index = SHARD.try_with(Cell::get).ok()?;
    (index < SHARED).then(|| COUNT[index].bytes.load(Relaxed))
}

/// Live bytes the Rust heap's count holds, and its events, over every
/// shard.
fn totals() -> (i64, u64) {
    COUNT.iter().fold((0, 0), |(bytes, events), shard| (bytes + shard.bytes.load(Relaxed), events + shard.events.load(Relaxed)))
}

/// Until dropped, this thread's Rust allocations are the harness's own
/// ([`harness`]) or the test's ([`as_test`]); the mode before comes back
/// when it drops, so guards nest.
#[must_use = "the mode ends when the guard drops"]
pub(crate) struct HarnessMode {
    was: bool,
    // Thread-local state: dropped on the thread that made it.
    _not_send: PhantomData<*const ()>,
}

/// Sets this thread's mode (`true`: the harness's) until the guard drops.
fn set_mode(harness: bool) -> HarnessMode {
    let was = HARNESS_MODE.try_with(|mode| mode.replace(harness)).unwrap_or(true);
    HarnessMode { was, _not_send: PhantomData }
}

/// Puts this thread in harness mode (see [`HarnessMode`]).
pub(crate) fn harness() -> HarnessMode {
    set_mode(true)
}

impl Drop for HarnessMode {
    fn drop(&mut self) {
        let _ = HARNESS_MODE.try_with(|mode| mode.set(self.was));
    }
}

/// Runs `f` with this thread's Rust allocations counted as the test's: the
/// body's calls, and dropping what the body made.
pub(crate) fn as_test<T>(f: impl FnOnce() -> T) -> T {
    let _test = set_mode(false);
    f()
}

/// Has the counting allocator feed the Rust heap's events to attribution
/// (`on`), to be kept with their stacks.
pub(crate) fn record_sites(on: bool) {
    RECORDING.store(on, Relaxed);
}

/// Why the Rust heap is not counted in a test in `scope`, and what to do;
/// `None` where it is.
pub(crate) fn not_counted_because(scope: ResolvedScope) -> Option<String> {
    let why = match scope {
        _ if !IN_USE.load(Relaxed) && !SWITCHED_OFF.load(Relaxed) => {
            "gpu-leak-test's counting allocator is not this binary's global allocator (the crate's default feature \
             `rust-heap` is off). Turn it on, or, where the binary has a #[global_allocator] of its own, wrap it: \
             `static A: gpu_leak_test::settings::RustHeap<YourAllocator> = \
             gpu_leak_test::settings::RustHeap::new(YourAllocator);`"
        }
        ResolvedScope::Thread => {
            "in thread scope other tests share the process, and whose Rust allocations are whose cannot be told \
             apart. Let the attribute run the test (it gets a process of its own under cargo test and nextest), \
             or set scope = \"process\""
        }
        ResolvedScope::Process { alongside_other_tests: true } => {
            "other tests run in this process's threads meanwhile, and every test allocates on the Rust heap. Let \
             the attribute run the test (it gets a process of its own), run under cargo nextest, or pass \
             --test-threads=1"
        }
        ResolvedScope::Process { alongside_other_tests: false } => return None,
    };
    Some(why.to_string())
}

/// The home of [`Layer::RustHeap`].
pub(crate) struct RustHeapHome;

/// Its name in reports and the JSON.
const NAME: &str = "rust-heap";

impl Home for RustHeapHome {
    fn name(&self, _: Device) -> String {
        NAME.to_string()
    }

    fn parse(&self, name: &str) -> Option<Layer> {
        (name == NAME).then_some(Layer::RustHeap)
    }

    fn plain_name(&self, _: Device) -> String {
        "the Rust heap".to_string()
    }

    fn description(&self, _: Device) -> &'static str {
        "the Rust heap: what Rust code allocates through the global allocator (a Vec, a Box, a String), not tensor \
         storage or libtorch's C++ objects"
    }

    fn place(&self, device: Device) -> String {
        format!("{} (the Rust heap)", super::device_name(device))
    }

    fn what_grew(&self) -> Option<&'static str> {
        Some(
            "What grew is the Rust heap: memory the test's Rust code allocated through the global allocator (a Vec, \
             a Box, a String) and kept, not tensors or libtorch's objects.",
        )
    }

    fn kept_hint(&self, place: &str) -> String {
        format!(
            "the Rust values allocated at {place} outlive each iteration: a collection kept across iterations (a \
             cache that is never drained, a Vec of samples, state captured by the closure) holds them. Bound it \
             (a VecDeque of the latest N, an LRU), drain it each step, or keep a summary (a plain number) instead."
        )
    }

    fn site_label(&self) -> Option<&'static str> {
        Some("Rust heap")
    }

    fn event_kind(&self, _: Device) -> Option<(i32, i32)> {
        Some((crate::probe::hook::DEVICE_TYPE_RUST_HEAP, -1))
    }

    fn keeps_peak(&self) -> bool {
        false
    }

    fn count(&self, _: Device, _: bool, _: &Coverage) -> Box<dyn Counting> {
        Box::new(Counted)
    }

    fn decide(&self, series: &Series, window: u32, threshold_bytes: u64, _: Option<(i64, u64)>) -> Verdict {
        crate::verdict::rust_heap_decide(series, window, threshold_bytes, ALLOWANCE_BYTES_PER_CALL)
    }

    fn may_leak(&self, series: &Series) -> bool {
        !crate::verdict::within_allowance(series, ALLOWANCE_BYTES_PER_CALL)
    }
}

/// The counting allocator's sums, for the whole process.
struct Counted;

/// Bytes of the canary: a block no allocator serves from a thread cache
/// of small sizes, so the count must see exactly it.
const CANARY_BYTES: usize = 4096;

impl Counting for Counted {
    fn layer(&self) -> Layer {
        Layer::RustHeap
    }

    fn source_name(&self) -> &'static str {
        "the counting global allocator (gpu_leak_test::settings::RustHeap)"
    }

    fn level(&self, _: &Tracker) -> i64 {
        totals().0
    }

    fn level_process_wide(&self, _: &Tracker) -> i64 {
        totals().0
    }

    fn peaks(&self, _: &Tracker) -> Option<Peaks> {
        None
    }

    fn reset_peak(&self, _: &Tracker) {}

    fn events(&self, _: &Tracker) -> u64 {
        totals().1
    }

    fn view(&self, tracker: &Tracker) -> HookView {
        tracker.layer_view(Layer::RustHeap)
    }

    fn watch_peak(&self, tracker: &Tracker) {
        tracker.watch_peak(Layer::RustHeap, false);
    }

    /// A block allocated as the test would must raise the count by its
    /// size, and its free lower it again.
    fn prove(&mut self, _: Proof<'_>) -> Result<i64, String> {
        // A first count gives this thread its shard, so every read below
        // comes from the same place.
        as_test(|| drop(std::hint::black_box(Box::new(0u64))));
        let level = || own_shard_bytes().unwrap_or_else(|| totals().0);
        for _ in 0..3 {
            let (before, with, after) = as_test(|| {
                let before = level();
                let block = std::hint::black_box(vec![0u8; CANARY_BYTES]);
                let with = level();
                drop(block);
                (before, with, level())
            });
            if with - before >= CANARY_BYTES as i64 && with - after >= CANARY_BYTES as i64 {
                return Ok(with - before);
            }
        }
        Err(format!(
            "before the body ran, a {CANARY_BYTES} B block allocated on the Rust heap was not counted by {}{}",
            self.source_name(),
            if SWITCHED_OFF.load(Relaxed) {
                ": the count was switched off for a test (gpu_leak_test::internals::switches::switch_off_rust_heap)"
            } else {
                ""
            }
        ))
    }
}

/// The Rust heap's canary, as a leak test runs it before the body: the
/// bytes it saw counted, or why it saw none. For the tests of the canary
/// itself. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn rust_heap_canary() -> Result<i64, String> {
    let (tracker, coverage) = (Tracker::new(), Coverage::default());
    Counted.prove(Proof { body: Device::Cpu, process_scope: true, tracker: &tracker, coverage: &coverage })
}

/// Makes the Rust heap uncounted (`off = true`: the allocator only hands
/// calls on) or counted again: for tests of the "cannot measure" verdict,
/// and the benchmark's variants without the layer. Not for users.
#[doc(hidden)]
#[cfg(feature = "internals")]
pub fn switch_off_rust_heap(off: bool) {
    SWITCHED_OFF.store(off, Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_test_allocates_is_counted_and_what_the_harness_allocates_is_not() {
        let _harness = harness();
        // Other threads of the test binary allocate too: one of a few tries
        // sees nothing but this thread's.
        let exact = (0..20).any(|_| {
            let before = totals().0;
            let kept = as_test(|| std::hint::black_box(vec![1u8; 1 << 16]));
            let with_test = totals().0;
            let harness_own = std::hint::black_box(vec![1u8; 1 << 16]);
            let with_harness = totals().0;
            drop(harness_own);
            as_test(|| drop(kept));
            let after = totals().0;
            with_test - before == 1 << 16 && with_harness == with_test && after == before
        });
        assert!(exact);
    }

    #[test]
    fn harness_mode_nests_and_ends_with_its_guard() {
        let outer = harness();
        as_test(|| {
            assert!(!HARNESS_MODE.with(Cell::get));
            let inner = harness();
            assert!(HARNESS_MODE.with(Cell::get));
            drop(inner);
            assert!(!HARNESS_MODE.with(Cell::get));
        });
        assert!(HARNESS_MODE.with(Cell::get));
        drop(outer);
        assert!(!HARNESS_MODE.with(Cell::get));
    }
}
