//! Exact, attributable accounting from libtorch's per-thread allocation hook.
//!
//! A [`Tracker`] counts every allocation and free that libtorch reports to a
//! thread it is installed on ([`Tracker::enter`]). libtorch copies the hook to
//! the autograd threads that run `backward()` for that thread, so their
//! allocations count too; threads it was never entered on are invisible, which
//! is what keeps tests in parallel threads apart.
//!
//! Counting costs one uncontended lock and a map update per event (see
//! `benches/RESULTS.md`, "Cost per allocator event"); the C++ heap's far
//! more frequent events are counted in the shim, under the tracker's tag.
//! Site recording ([`Tracker::start_recording`]) additionally keeps every
//! live allocation with an unresolved stack, for attribution after a test
//! has failed.
use super::stacks::Stack;
use crate::error::{Error, Result};
use crate::layer::Layer;
use super::ffi;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::hash::{BuildHasherDefault, Hasher};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use tch::Device;

/// Slot 0 is the CPU, slots 1..=MAX_CUDA_DEVICES are cuda:0.., the next one
/// collects anything else libtorch reports (MPS, XPU, ...), then the C++
/// heap (libtorch's host objects), then memory allocated through the CUDA
/// driver outside libtorch (pinned host memory, then cuda:0..), then what
/// libtorch's CUDA allocator asked the driver for (cuda:0..), which counts
/// tensors where the allocator reports nothing else (see layer/tensors.rs), then
/// the pinned host memory libtorch's caching host allocator asks the driver
/// for (CPU tensors), then the Rust heap, fed only while attribution
/// records its sites.
const MAX_CUDA_DEVICES: usize = 16;
const OTHER_SLOT: usize = MAX_CUDA_DEVICES + 1;
const HOST_OBJECTS_SLOT: usize = MAX_CUDA_DEVICES + 2;
const OUTSIDE_PINNED_SLOT: usize = MAX_CUDA_DEVICES + 3;
const OUTSIDE_CUDA_SLOTS: usize = MAX_CUDA_DEVICES + 4;
const ALLOCATOR_CALLS_SLOTS: usize = OUTSIDE_CUDA_SLOTS + MAX_CUDA_DEVICES;
const PINNED_SLOT: usize = ALLOCATOR_CALLS_SLOTS + MAX_CUDA_DEVICES;
const RUST_HEAP_SLOT: usize = PINNED_SLOT + 1;
const SLOTS: usize = RUST_HEAP_SLOT + 1;
// libtorch's c10::DeviceType values, and the shim's own kinds for the C++
// heap and the driver's allocations: one definition with the shim's header.
include!("../../build_support/event_kinds.rs");

fn cuda_index(device_index: i32) -> Option<usize> {
    // A CUDA event without an index belongs to the current device; libtorch
    // always sets it, so that is only a guard.
    (device_index < MAX_CUDA_DEVICES as i32).then_some(device_index.max(0) as usize)
}

fn slot_of_raw(device_type: i32, device_index: i32) -> usize {
    match (device_type, cuda_index(device_index)) {
        (DEVICE_TYPE_CPU, _) => 0,
        (DEVICE_TYPE_HOST_OBJECTS, _) => HOST_OBJECTS_SLOT,
        (DEVICE_TYPE_PINNED_BY_LIBTORCH, _) => PINNED_SLOT,
        (DEVICE_TYPE_RUST_HEAP, _) => RUST_HEAP_SLOT,
        (DEVICE_TYPE_OUTSIDE_LIBTORCH, _) if device_index < 0 => OUTSIDE_PINNED_SLOT,
        (DEVICE_TYPE_OUTSIDE_LIBTORCH, Some(index)) => OUTSIDE_CUDA_SLOTS + index,
        (DEVICE_TYPE_CUDA_ALLOCATOR_CALLS, Some(index)) => ALLOCATOR_CALLS_SLOTS + index,
        (DEVICE_TYPE_CUDA, Some(index)) => 1 + index,
        _ => OTHER_SLOT,
    }
}

#[cfg(feature = "internals")]
fn slot_of(device: Device) -> usize {
    match device {
        Device::Cpu => 0,
        Device::Cuda(index) => slot_of_raw(DEVICE_TYPE_CUDA, index as i32),
        _ => OTHER_SLOT,
    }
}

/// The slot of the events the shim reports for `layer` (its home names
/// their kind); `OTHER_SLOT` for a layer the hook does not count.
fn slot_of_layer(layer: Layer) -> usize {
    layer.event_kind().map_or(OTHER_SLOT, |(device_type, index)| slot_of_raw(device_type, index))
}

/// The layer a slot's blocks count in: what libtorch's CUDA allocator asked
/// the driver for is that device's tensors (counted only where they are the
/// source).
fn layer_of_slot(slot: usize) -> Layer {
    match slot {
        0 | PINNED_SLOT => Layer::Tensors(Device::Cpu),
        HOST_OBJECTS_SLOT => Layer::HostObjects,
        RUST_HEAP_SLOT => Layer::RustHeap,
        OUTSIDE_PINNED_SLOT => Layer::OutsideLibtorch(Device::Cpu),
        OTHER_SLOT => Layer::Tensors(Device::Mps),
        n if n < OTHER_SLOT => Layer::Tensors(Device::Cuda(n - 1)),
        n if n < ALLOCATOR_CALLS_SLOTS => Layer::OutsideLibtorch(Device::Cuda(n - OUTSIDE_CUDA_SLOTS)),
        n => Layer::Tensors(Device::Cuda(n - ALLOCATOR_CALLS_SLOTS)),
    }
}

fn device_of_raw(device_type: i32, device_index: i32) -> Device {
    layer_of_slot(slot_of_raw(device_type, device_index)).device()
}

/// True for slots whose frees are broadcast to every tracker (the shim does
/// not know whose block it was), so a free of an unknown block is no news.
fn frees_broadcast(slot: usize) -> bool {
    slot >= HOST_OBJECTS_SLOT
}

#[derive(Default, Clone, Copy)]
struct Slot {
    live: i64,
    peak: i64,
    allocations: u64,
    frees: u64,
}

/// Hashes a block address: allocators hand out addresses aligned to 64 or
/// 512 bytes, so the multiply spreads the high bits and the shift brings
/// them down to the low bits the map indexes by. SipHash (std's default)
/// costs several times as much per event and defends against nothing here.
#[derive(Default)]
struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ byte as u64).wrapping_mul(0x100000001b3);
        }
    }

    fn write_usize(&mut self, address: usize) {
        self.0 = (address as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type BlockMap = HashMap<usize, Block, BuildHasherDefault<AddressHasher>>;

/// One allocation that was alive when it was looked at, recorded while site
/// recording was on.
#[derive(Debug, Clone)]
pub struct LiveAllocation {
    pub address: usize,
    pub bytes: u64,
    pub device: Device,
    /// The layer it counts in: tensor storage, a C++ heap block (one of
    /// libtorch's host objects: a graph node, a `TensorImpl`), or a driver
    /// allocation outside libtorch.
    pub layer: Layer,
    /// The tag that was current when it was allocated (the harness uses the
    /// iteration number).
    pub tag: u32,
    /// False when libtorch allocated it on another thread: one that carried
    /// the hook (an autograd thread during `backward()`, a thread the test
    /// brought in), or, in process scope, any thread of the process.
    pub on_owner_thread: bool,
    /// The allocating thread's name where it is not the owner: the Rust name
    /// where it has one, else the operating system's (`pt_autograd_0`), else
    /// `None`.
    pub thread: Option<Arc<str>>,
    pub stack: Stack,
}

/// A failed allocation libtorch reported (out of memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    pub bytes: u64,
    pub device: Device,
}

/// The hook's figures for one device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HookView {
    /// Bytes of blocks allocated since the tracker was created and not freed
    /// since. Frees of blocks it never saw allocated are not counted.
    pub live_bytes: i64,
    /// The highest `live_bytes` since creation or the last peak reset.
    pub peak_bytes: i64,
    pub allocations: u64,
    pub frees: u64,
}

thread_local! {
    // Its address tells threads apart for the price of a TLS lookup.
    static THREAD_TOKEN: u8 = const { 0 };
}

fn thread_token() -> usize {
    THREAD_TOKEN.with(|token| token as *const u8 as usize)
}

/// The operating system's id of the current thread (what `/proc/self/task`
/// lists), asked once per thread.
pub(crate) fn current_tid() -> u32 {
    thread_local! {
        static TID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    // SAFETY: gettid takes no arguments and cannot fail.
    let ask = || unsafe { libc::gettid() } as u32;
    TID.try_with(|tid| {
        if tid.get() == 0 {
            tid.set(ask());
        }
        tid.get()
    })
    .unwrap_or_else(|_| ask())
}

/// The current thread's name: Rust's (full length), else the one the
/// operating system keeps (C++ threads such as autograd's name themselves).
/// Read once per thread: asking the kernel is a system call, and during
/// attribution every allocation on autograd's threads asks.
fn current_thread_name() -> Option<Arc<str>> {
    thread_local! {
        static NAME: std::cell::OnceCell<Option<Arc<str>>> = const { std::cell::OnceCell::new() };
    }
    let read = || {
        if let Some(name) = std::thread::current().name() {
            return Some(Arc::from(name));
        }
        let mut buffer = [0u8; 64];
        // SAFETY: the buffer is writable for its whole length, which is passed.
        let status = unsafe { libc::pthread_getname_np(libc::pthread_self(), buffer.as_mut_ptr().cast(), buffer.len()) };
        let name = std::ffi::CStr::from_bytes_until_nul(&buffer).ok()?.to_string_lossy().into_owned();
        (status == 0 && !name.is_empty()).then(|| Arc::from(name))
    };
    // A thread being torn down has no thread-locals left: ask directly.
    NAME.try_with(|name| name.get_or_init(read).clone()).unwrap_or_else(|_| read())
}

/// A block the tracker saw allocated and has not seen freed.
struct Block {
    bytes: u64,
    slot: usize,
    /// The allocating thread's id, for naming threads a test leaves running.
    tid: u32,
    /// Present for blocks allocated while recording was on.
    recorded: Option<Box<LiveAllocation>>,
    /// The peak watch's count of events when it was allocated (0 outside
    /// a watch).
    watched_at: u64,
}

/// Follows one slot's live bytes while recording, to tell which recorded
/// allocations were alive together at its highest point: where a peak is
/// reached. The events are numbered; a block alive at the highest point
/// was allocated at or before it and freed after it.
struct PeakWatch {
    slot: usize,
    /// Events counted in the slot since the watch began.
    events: u64,
    /// The event count when the current window began.
    window_start: u64,
    highest: i64,
    highest_at: u64,
    /// Recorded blocks freed during the watch: when each was allocated and
    /// freed, and the allocation.
    freed: Vec<(u64, u64, Box<LiveAllocation>)>,
}

/// Everything one event updates, behind one lock: the event takes it
/// once, and the counters need no atomic operations of their own.
struct Counts {
    slots: [Slot; SLOTS],
    /// Every live block by address. Frees count only for blocks in here:
    /// libtorch also reports frees of blocks allocated before the hook or on
    /// threads without it (on the CPU, sometimes with a stale size), and
    /// those are not the test's.
    blocks: BlockMap,
    /// Frees of tensor blocks this tracker never saw allocated.
    foreign_frees: u64,
    /// Tensor allocations made by threads other than the owner (autograd's
    /// device threads, helpers the test entered the tracker on).
    allocations_on_other_threads: u64,
    peak_watch: Option<PeakWatch>,
}

pub(super) struct TrackerState {
    counts: Mutex<Counts>,
    owner_token: usize,
    recording: AtomicBool,
    tag: AtomicU32,
    max_frames: usize,
    last_oom: Mutex<(u64, Option<OutOfMemory>)>,
    /// The shim's tag for this tracker's C++ heap blocks, taken when it is
    /// first entered: the shim counts them itself, without a lock or a call
    /// per event. 0 where every tag was held; the blocks then come here.
    host_objects_tag: OnceLock<c_int>,
}

impl TrackerState {
    fn host_objects_tag(&self) -> Option<c_int> {
        self.host_objects_tag.get().copied().filter(|&tag| tag != 0)
    }
}

impl Drop for TrackerState {
    fn drop(&mut self) {
        // Every hook holds this state, so none carries the tag any more.
        if let Some(tag) = self.host_objects_tag() {
            // SAFETY: gives back a tag this state took.
            unsafe { ffi::glt_host_objects_release_tag(tag) };
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks cannot leave the map half-updated in
    // a way that matters for counting; keep going.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl TrackerState {
    pub(super) fn on_event(&self, address: usize, size: i64, device_type: i32, device_index: i32) {
        if size > 0 {
            self.on_allocation(address, size as u64, device_type, device_index);
        } else if size < 0 {
            self.on_free(address, slot_of_raw(device_type, device_index));
        }
    }

    fn on_allocation(&self, address: usize, bytes: u64, device_type: i32, device_index: i32) {
        let slot = slot_of_raw(device_type, device_index);
        if slot_switched_off(slot) {
            return;
        }
        let other_thread = thread_token() != self.owner_token;
        // Capture outside the lock: it is the slow part.
        let recorded = self.recording.load(Relaxed).then(|| {
            Box::new(LiveAllocation {
                address,
                bytes,
                device: device_of_raw(device_type, device_index),
                layer: layer_of_slot(slot),
                tag: self.tag.load(Relaxed),
                on_owner_thread: !other_thread,
                thread: if other_thread { current_thread_name() } else { None },
                stack: Stack::capture(self.max_frames),
            })
        });
        let tid = current_tid();
        let mut counts = lock(&self.counts);
        let watched_at = counts.watched_event(slot);
        let replaced = counts.blocks.insert(address, Block { bytes, slot, tid, recorded, watched_at });
        if let Some(old) = replaced {
            // The address is in use again, so its old block was freed where
            // the hook could not see it (a thread without the hook).
            counts.count_free(old);
        }
        let counters = &mut counts.slots[slot];
        counters.live += bytes as i64;
        counters.allocations += 1;
        counters.peak = counters.peak.max(counters.live);
        let live = counters.live;
        if let Some(watch) = counts.peak_watch.as_mut().filter(|w| w.slot == slot && live > w.highest) {
            (watch.highest, watch.highest_at) = (live, watched_at);
        }
        if other_thread && !frees_broadcast(slot) {
            counts.allocations_on_other_threads += 1;
        }
    }

    fn on_free(&self, address: usize, slot: usize) {
        let mut counts = lock(&self.counts);
        let Some(block) = counts.blocks.remove(&address) else {
            // The C++ heap frees what it made before the test all the time,
            // and every tracker hears of every such free.
            if !frees_broadcast(slot) {
                counts.foreign_frees += 1;
            }
            return;
        };
        counts.count_free(block);
    }
}

impl Default for Counts {
    // std derives Default for arrays of up to 32 only.
    fn default() -> Self {
        Counts {
            slots: [Slot::default(); SLOTS],
            blocks: BlockMap::default(),
            foreign_frees: 0,
            allocations_on_other_threads: 0,
            peak_watch: None,
        }
    }
}

impl Counts {
    fn count_free(&mut self, block: Block) {
        let counters = &mut self.slots[block.slot];
        counters.live -= block.bytes as i64;
        counters.frees += 1;
        let freed_at = self.watched_event(block.slot);
        if let (Some(watch), Some(recorded)) = (self.peak_watch.as_mut().filter(|w| w.slot == block.slot), block.recorded) {
            watch.freed.push((block.watched_at, freed_at, recorded));
        }
    }

    /// Numbers an event of `slot` for the peak watch; 0 where none watches it.
    fn watched_event(&mut self, slot: usize) -> u64 {
        match self.peak_watch.as_mut().filter(|w| w.slot == slot) {
            Some(watch) => {
                watch.events += 1;
                watch.events
            }
            None => 0,
        }
    }
}

extern "C" fn on_event(context: *mut c_void, ptr: *mut c_void, size: i64, device_type: i32, device_index: i32) {
    // SAFETY: `context` is the Arc<TrackerState> handed to glt_hook_push, kept
    // alive until on_release.
    let state = unsafe { &*(context as *const TrackerState) };
    // The tracker's books are the harness's, not the Rust heap's growth.
    let _harness = crate::layer::rust_heap::harness();
    // Unwinding into libtorch would abort the process; drop the event instead.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        state.on_event(ptr as usize, size, device_type, device_index)
    }));
}

extern "C" fn on_oom(context: *mut c_void, size: i64, device_type: i32, device_index: i32) {
    // SAFETY: as in on_event.
    let state = unsafe { &*(context as *const TrackerState) };
    let _harness = crate::layer::rust_heap::harness();
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut last = lock(&state.last_oom);
        last.0 += 1;
        last.1 = Some(OutOfMemory { bytes: size.max(0) as u64, device: device_of_raw(device_type, device_index) });
    }));
}

extern "C" fn on_release(context: *mut c_void) {
    let _harness = crate::layer::rust_heap::harness();
    // SAFETY: balances the Arc::into_raw in Tracker::enter; libtorch calls
    // this exactly once per push.
    drop(unsafe { Arc::from_raw(context as *const TrackerState) });
}

/// Exact per-device accounting of what libtorch allocates on the threads the
/// tracker is entered on. Cloning gives another handle to the same counts.
#[derive(Clone)]
pub struct Tracker {
    pub(super) state: Arc<TrackerState>,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new()
    }
}

impl Tracker {
    /// A tracker owned by the current thread: allocations on other threads
    /// are marked `on_owner_thread: false` when recorded.
    pub fn new() -> Self {
        Tracker {
            state: Arc::new(TrackerState {
                counts: Mutex::new(Counts::default()),
                recording: AtomicBool::new(false),
                tag: AtomicU32::new(0),
                max_frames: super::stacks::DEFAULT_MAX_FRAMES,
                owner_token: thread_token(),
                last_oom: Mutex::new((0, None)),
                host_objects_tag: OnceLock::new(),
            }),
        }
    }

    /// Installs the hook on the current thread until the guard drops. Enter
    /// it on helper threads too when their allocations belong to the test.
    pub fn enter(&self) -> Result<HookGuard> {
        // SAFETY: takes a free tag, or 0.
        let tag = *self.state.host_objects_tag.get_or_init(|| unsafe { ffi::glt_host_objects_acquire_tag() });
        let context = Arc::into_raw(self.state.clone()) as *mut c_void;
        // SAFETY: the callbacks match the shim's typedefs; the shim owns
        // `context` from here on and releases it through on_release.
        let error = unsafe { ffi::glt_hook_push(on_event, on_oom, on_release, context, tag) };
        ffi::check("glt_hook_push", error).map_err(|e| Error::Hook {
            message: format!("could not install the allocation hook on this thread: {e}"),
        })?;
        Ok(HookGuard { _not_send: PhantomData })
    }

    pub fn view(&self, device: Device) -> HookView {
        self.layer_view(Layer::Tensors(device))
    }

    #[cfg(feature = "internals")]
    pub fn live_bytes(&self, device: Device) -> i64 {
        self.view(device).live_bytes
    }

    /// One layer's figures: a device's tensors, the C++ heap, or driver
    /// allocations outside libtorch.
    pub fn layer_view(&self, layer: Layer) -> HookView {
        self.slot_view(slot_of_layer(layer))
    }

    /// What libtorch's CUDA allocator asked the driver for on `cuda:index`
    /// and still holds, where the shim counts it (see layer/tensors.rs).
    pub(crate) fn cuda_allocator_calls_view(&self, index: usize) -> HookView {
        self.slot_view(ALLOCATOR_CALLS_SLOTS + index.min(MAX_CUDA_DEVICES - 1))
    }

    /// Pinned host memory libtorch's caching host allocator holds from the
    /// driver, as far as the shim saw it asked for on this tracker's threads.
    pub(crate) fn pinned_view(&self) -> HookView {
        self.slot_view(PINNED_SLOT)
    }

    pub(crate) fn reset_cuda_allocator_calls_peak(&self, index: usize) {
        let slot = &mut lock(&self.state.counts).slots[ALLOCATOR_CALLS_SLOTS + index.min(MAX_CUDA_DEVICES - 1)];
        slot.peak = slot.live;
    }

    fn slot_view(&self, slot: usize) -> HookView {
        if let Some(tag) = self.state.host_objects_tag().filter(|_| slot == HOST_OBJECTS_SLOT) {
            let (mut live_bytes, mut allocations, mut frees) = (0i64, 0u64, 0u64);
            // SAFETY: plain out-parameters.
            unsafe { ffi::glt_host_objects_of_tag(tag, &mut live_bytes, &mut allocations, &mut frees) };
            // The shim keeps no peak; no budget is set on this layer.
            return HookView { live_bytes, peak_bytes: live_bytes, allocations, frees };
        }
        let slot = lock(&self.state.counts).slots[slot];
        HookView { live_bytes: slot.live, peak_bytes: slot.peak, allocations: slot.allocations, frees: slot.frees }
    }

    /// Devices other than `device` that saw events, with their views: a test
    /// measured on one device can still allocate on another.
    #[cfg(feature = "internals")]
    pub fn other_devices(&self, device: Device) -> Vec<(Device, HookView)> {
        let measured = slot_of(device);
        (0..=OTHER_SLOT)
            .filter(|&slot| slot != measured)
            .filter_map(|slot| {
                let dev = match slot {
                    0 => Device::Cpu,
                    OTHER_SLOT => Device::Mps,
                    n => Device::Cuda(n - 1),
                };
                let view = self.view(dev);
                (view.allocations + view.frees > 0).then_some((dev, view))
            })
            .collect()
    }

    /// Feeds one event as libtorch reports it (`size` > 0 an allocation,
    /// < 0 a free): for measuring the callback's own cost.
    #[doc(hidden)]
    #[cfg(feature = "internals")]
    pub fn feed(&self, address: usize, size: i64, device: Device) {
        let (device_type, device_index) = match device {
            Device::Cpu => (DEVICE_TYPE_CPU, -1),
            Device::Cuda(index) => (DEVICE_TYPE_CUDA, index as i32),
            _ => (-1, -1),
        };
        self.state.on_event(address, size, device_type, device_index);
    }

    /// Starts a new peak window: the peak becomes the current live bytes.
    pub fn reset_peak(&self, layer: impl Into<Layer>) {
        let layer = layer.into();
        let mut counts = lock(&self.state.counts);
        let slots: &[usize] = if layer == Layer::Tensors(Device::Cpu) { &[0, PINNED_SLOT] } else { &[slot_of_layer(layer)] };
        for &slot in slots {
            counts.slots[slot].peak = counts.slots[slot].live;
        }
    }

    /// Starts keeping every new allocation with its stack, tagged `tag`.
    #[cfg(any(test, feature = "internals"))]
    pub fn start_recording(&self, tag: u32) {
        self.start_recording_layers(tag, true);
    }

    /// [`Tracker::start_recording`], leaving libtorch's host objects out
    /// unless `host_objects`: a training step makes ten times more C++ heap
    /// blocks than tensors, and a stack for each is most of attribution's
    /// cost, so they are recorded only where that layer is attributed.
    pub fn start_recording_layers(&self, tag: u32, host_objects: bool) {
        self.state.tag.store(tag, Relaxed);
        self.state.recording.store(true, Relaxed);
        self.record_host_objects(host_objects);
    }

    /// Has the shim send this tracker's C++ heap blocks here too (`on`),
    /// to be kept with their stacks.
    fn record_host_objects(&self, on: bool) {
        if let Some(tag) = self.state.host_objects_tag() {
            // SAFETY: sets a flag of a tag this tracker holds.
            unsafe { ffi::glt_host_objects_record_tag(tag, on as c_int) };
        }
    }

    /// Tags allocations from now on (the harness passes the iteration).
    pub fn set_tag(&self, tag: u32) {
        self.state.tag.store(tag, Relaxed);
    }

    /// Stops recording; allocations recorded so far stay in the record.
    pub fn stop_recording(&self) {
        self.state.recording.store(false, Relaxed);
        self.record_host_objects(false);
    }

    /// Recorded allocations that are still alive, largest first.
    pub fn recorded_survivors(&self) -> Vec<LiveAllocation> {
        let mut survivors: Vec<LiveAllocation> =
            lock(&self.state.counts).blocks.values().filter_map(|b| b.recorded.as_deref().cloned()).collect();
        survivors.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.tag.cmp(&b.tag)).then(a.address.cmp(&b.address)));
        survivors
    }

    /// Live bytes of the recorded blocks, summed per distinct stack: one
    /// entry per allocation site, for following each site's level from one
    /// iteration to the next.
    /// Keyed by the layer and the stack.
    pub fn recorded_bytes_by_stack(&self) -> HashMap<(Layer, Vec<usize>), u64> {
        let mut by_stack: HashMap<(Layer, Vec<usize>), u64> = HashMap::new();
        for recorded in lock(&self.state.counts).blocks.values().filter_map(|b| b.recorded.as_deref()) {
            *by_stack.entry((recorded.layer, recorded.stack.ips().to_vec())).or_default() += recorded.bytes;
        }
        by_stack
    }

    /// Starts following `layer`'s live bytes (as libtorch's CUDA allocator
    /// asked the driver for them, where `allocator_calls`) for
    /// [`Tracker::take_alive_at_peak`]; call it while recording.
    pub(crate) fn watch_peak(&self, layer: Layer, allocator_calls: bool) {
        let slot = match layer {
            Layer::Tensors(Device::Cuda(index)) if allocator_calls => ALLOCATOR_CALLS_SLOTS + index.min(MAX_CUDA_DEVICES - 1),
            _ => slot_of_layer(layer),
        };
        let mut counts = lock(&self.state.counts);
        let live = counts.slots[slot].live;
        counts.peak_watch = Some(PeakWatch { slot, events: 0, window_start: 0, highest: live, highest_at: 0, freed: Vec::new() });
    }

    /// The recorded allocations of the current window alive together when
    /// the watched layer was at its highest in it; a new window begins. A
    /// window is one iteration where this is called after each. Blocks
    /// allocated before the window are the level it began at, and are left
    /// out.
    pub(crate) fn take_alive_at_peak(&self) -> Vec<LiveAllocation> {
        let mut counts = lock(&self.state.counts);
        let Some(mut watch) = counts.peak_watch.take() else { return Vec::new() };
        let (start, at) = (watch.window_start, watch.highest_at);
        let in_window = |allocated: u64| allocated > start && allocated <= at;
        let mut alive: Vec<LiveAllocation> = std::mem::take(&mut watch.freed)
            .into_iter()
            .filter(|(allocated, freed, _)| in_window(*allocated) && at < *freed)
            .map(|(_, _, recorded)| *recorded)
            .collect();
        alive.extend(
            counts
                .blocks
                .values()
                .filter(|b| b.slot == watch.slot && in_window(b.watched_at))
                .filter_map(|b| b.recorded.as_deref().cloned()),
        );
        let live = counts.slots[watch.slot].live;
        (watch.window_start, watch.highest, watch.highest_at) = (watch.events, live, watch.events);
        counts.peak_watch = Some(watch);
        alive
    }

    /// Stops the peak watch.
    pub(crate) fn stop_watching_peak(&self) {
        lock(&self.state.counts).peak_watch = None;
    }

    /// Live bytes and blocks per allocating thread id, over every device.
    pub fn live_by_thread(&self) -> HashMap<u32, (u64, u64)> {
        let mut by_thread: HashMap<u32, (u64, u64)> = HashMap::new();
        for block in lock(&self.state.counts).blocks.values() {
            let entry = by_thread.entry(block.tid).or_default();
            entry.0 += block.bytes;
            entry.1 += 1;
        }
        by_thread
    }

    /// Forgets every block (counts stay): for a tracker no longer fed.
    pub(super) fn forget_blocks(&self) {
        let blocks = std::mem::take(&mut lock(&self.state.counts).blocks);
        drop(blocks);
    }

    /// Forgets the stacks recorded so far (the blocks stay counted).
    pub fn clear_recorded(&self) {
        // Only a hook that found no tag counts its C++ heap blocks itself.
        // Everywhere else the shim counts them (a tagged hook's, and the
        // process observation's, which is never entered), and they came
        // here only to be recorded: their frees stop coming with the
        // recording, and left here they would be phantoms in
        // `live_by_thread`. The Rust heap's blocks come only to be recorded.
        let counts_itself = self.state.host_objects_tag.get() == Some(&0);
        let mut counts = lock(&self.state.counts);
        counts.blocks.retain(|_, b| (counts_itself || b.slot != HOST_OBJECTS_SLOT) && b.slot != RUST_HEAP_SLOT);
        counts.blocks.values_mut().for_each(|b| b.recorded = None);
    }

    /// Frees libtorch reported for blocks this tracker never saw allocated
    /// (made before it, or on threads without the hook); they are not counted.
    #[cfg(feature = "internals")]
    pub fn foreign_frees(&self) -> u64 {
        lock(&self.state.counts).foreign_frees
    }

    /// Allocations (all devices) made on threads other than the one that
    /// created the tracker, such as autograd's threads during `backward()`.
    #[cfg(feature = "internals")]
    pub fn allocations_on_other_threads(&self) -> u64 {
        lock(&self.state.counts).allocations_on_other_threads
    }

    /// The last out-of-memory report, and how many there were.
    pub fn out_of_memory(&self) -> (u64, Option<OutOfMemory>) {
        *lock(&self.state.last_oom)
    }
}

/// Keeps the hook installed on one thread; dropping it removes the hook.
/// Guards on one thread must drop in reverse order of entering.
#[must_use = "the hook is removed as soon as the guard drops"]
pub struct HookGuard {
    // The hook lives in thread-local state: the guard must drop on the
    // thread that entered it.
    _not_send: PhantomData<*const ()>,
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        // SAFETY: no arguments; pops what this thread pushed.
        if let Err(e) = ffi::check("glt_hook_pop", unsafe { ffi::glt_hook_pop() }) {
            eprintln!(
                "gpu-leak-test: could not remove the allocation hook ({e}); something pushed a \
                 profiler state on this thread inside a leak test and did not remove it"
            );
        }
    }
}

/// Grows libtorch's process-wide table of the CPU blocks that hooked
/// threads allocate (the hook turns memory profiling on, and with it the
/// table) to hold `blocks` at once, outside any tracker: see
/// `glt_grow_cpu_size_table` in the shim.
pub fn grow_cpu_size_table(blocks: usize) -> Result<()> {
    let blocks = i64::try_from(blocks).unwrap_or(i64::MAX);
    // SAFETY: a plain integer in; the shim catches every C++ exception.
    ffi::check("glt_grow_cpu_size_table", unsafe { ffi::glt_grow_cpu_size_table(blocks) })
}

/// Devices whose sources a test switched off (`layer::tensors::switch_off`), one bit per
/// tracker slot: the CPU is bit 0, cuda:N bit N+1.
static SWITCHED_OFF: AtomicU32 = AtomicU32::new(0);

fn bit(device: Device) -> u32 {
    match device {
        Device::Cpu => 1,
        Device::Cuda(index) if index < 31 => 1 << (index + 1),
        _ => 0,
    }
}

/// Sets or clears `device`'s bit (see `layer::tensors::switch_off`).
#[cfg(feature = "internals")]
pub(crate) fn switch_off_device(device: Device, off: bool) {
    if off {
        SWITCHED_OFF.fetch_or(bit(device), Relaxed);
    } else {
        SWITCHED_OFF.fetch_and(!bit(device), Relaxed);
    }
}

/// Whether a test switched `device`'s sources off.
pub(crate) fn is_device_switched_off(device: Device) -> bool {
    SWITCHED_OFF.load(Relaxed) & bit(device) != 0
}

/// True where events of tracker slot `slot` (0 the CPU, N+1 cuda:N, the
/// C++ heap's) are to be dropped: one relaxed load per event, zero outside
/// such tests.
#[inline]
fn slot_switched_off(slot: usize) -> bool {
    let mask = SWITCHED_OFF.load(Relaxed);
    mask != 0 && slot < 32 && mask & (1 << slot) != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reported_device_type_lands_in_the_slot_of_its_layer() {
        let cases = [
            ((DEVICE_TYPE_CPU, -1), Layer::Tensors(Device::Cpu)),
            ((DEVICE_TYPE_CUDA, 3), Layer::Tensors(Device::Cuda(3))),
            ((DEVICE_TYPE_HOST_OBJECTS, -1), Layer::HostObjects),
            ((DEVICE_TYPE_OUTSIDE_LIBTORCH, 2), Layer::OutsideLibtorch(Device::Cuda(2))),
            ((DEVICE_TYPE_OUTSIDE_LIBTORCH, -1), Layer::OutsideLibtorch(Device::Cpu)),
            ((DEVICE_TYPE_RUST_HEAP, -1), Layer::RustHeap),
        ];
        for ((device_type, index), layer) in cases {
            let slot = slot_of_raw(device_type, index);
            assert_eq!(layer_of_slot(slot), layer, "{device_type}/{index}");
            assert_eq!(slot_of_layer(layer), slot, "{layer}");
        }
        // Counted apart from the layer they belong to, so each source reads
        // only its own events.
        let calls = slot_of_raw(DEVICE_TYPE_CUDA_ALLOCATOR_CALLS, 1);
        assert_eq!(layer_of_slot(calls), Layer::Tensors(Device::Cuda(1)));
        assert_ne!(calls, slot_of_layer(Layer::Tensors(Device::Cuda(1))));
        let pinned = slot_of_raw(DEVICE_TYPE_PINNED_BY_LIBTORCH, -1);
        assert_eq!(layer_of_slot(pinned), Layer::Tensors(Device::Cpu));
        assert_ne!(pinned, 0);
        assert!((0..SLOTS).all(|slot| slot_of_layer(layer_of_slot(slot)) == slot || frees_broadcast(slot)));
    }

    #[test]
    fn a_peak_watch_names_what_was_alive_together_at_each_window_s_highest_point() {
        let tracker = Tracker::new();
        let state = &tracker.state;
        let (cpu, none) = (DEVICE_TYPE_CPU, -1);
        let bytes_of = |alive: Vec<LiveAllocation>| {
            let mut bytes: Vec<u64> = alive.iter().map(|a| a.bytes).collect();
            bytes.sort_unstable();
            bytes
        };
        state.on_event(0x1000, 4096, cpu, none); // before the watch: the level
        tracker.start_recording(1);
        tracker.watch_peak(Layer::Tensors(Device::Cpu), false);
        // One window: 100 and 200 alive together, then both freed, then 50.
        state.on_event(0x2000, 100, cpu, none);
        state.on_event(0x3000, 200, cpu, none);
        state.on_event(0x2000, -100, cpu, none);
        state.on_event(0x3000, -200, cpu, none);
        state.on_event(0x4000, 50, cpu, none);
        assert_eq!(bytes_of(tracker.take_alive_at_peak()), [100, 200]);
        // The next window: 50 is its level; 30, freed, then 70 is the peak.
        state.on_event(0x5000, 30, cpu, none);
        state.on_event(0x5000, -30, cpu, none);
        state.on_event(0x6000, 70, cpu, none);
        assert_eq!(bytes_of(tracker.take_alive_at_peak()), [70]);
        // A window that never rose above its level names nothing.
        state.on_event(0x6000, -70, cpu, none);
        assert_eq!(bytes_of(tracker.take_alive_at_peak()), Vec::<u64>::new());
        tracker.stop_watching_peak();
        tracker.stop_recording();
    }

    #[test]
    fn an_entered_tracker_has_the_shim_count_its_cpp_heap_freed_on_any_thread() {
        let tracker = Tracker::new();
        let hook = tracker.enter().unwrap();
        assert!(tracker.state.host_objects_tag().is_some(), "a tag is free");
        // libtorch's first tensor under a hook makes state it keeps.
        drop(tch::Tensor::zeros([4], (tch::Kind::Float, Device::Cpu)));
        let before = tracker.layer_view(Layer::HostObjects);
        let tensor = tch::Tensor::zeros([4], (tch::Kind::Float, Device::Cpu));
        let with = tracker.layer_view(Layer::HostObjects);
        assert!(with.live_bytes - before.live_bytes >= 128, "{before:?} -> {with:?}");
        assert!(with.allocations > before.allocations);
        assert_eq!(lock(&tracker.state.counts).slots[HOST_OBJECTS_SLOT].allocations, 0, "not through the callback");
        // Freed on a thread without the hook: still this tracker's blocks.
        // (libtorch keeps one 24 B block alive when a tensor is dropped on
        // another thread, so the count comes down, not all the way.)
        std::thread::spawn(move || drop(tensor)).join().unwrap();
        let after = tracker.layer_view(Layer::HostObjects);
        assert!(after.live_bytes < with.live_bytes - 128, "{with:?} -> {after:?}");
        assert!(after.frees >= with.frees + 3, "{with:?} -> {after:?}");
        drop(hook);
    }

    #[test]
    fn a_recording_tracker_keeps_its_cpp_heap_blocks_with_stacks_and_forgets_them_after() {
        let tracker = Tracker::new();
        let hook = tracker.enter().unwrap();
        tracker.start_recording(1);
        let tensor = tch::Tensor::zeros([4], (tch::Kind::Float, Device::Cpu));
        tracker.stop_recording();
        let survivors = tracker.recorded_survivors();
        assert!(survivors.iter().any(|s| s.layer == Layer::HostObjects), "{survivors:?}");
        drop(tensor);
        tracker.clear_recorded();
        let kept = lock(&tracker.state.counts).blocks.values().filter(|b| b.slot == HOST_OBJECTS_SLOT).count();
        assert_eq!(kept, 0);
        drop(hook);
    }

    #[test]
    fn a_free_of_an_unknown_driver_block_is_no_foreign_free() {
        let tracker = Tracker::new();
        tracker.state.on_event(0x1000, 4096, DEVICE_TYPE_OUTSIDE_LIBTORCH, 0);
        tracker.state.on_event(0x9000, -4096, DEVICE_TYPE_OUTSIDE_LIBTORCH, 0);
        assert_eq!(tracker.foreign_frees(), 0);
        assert_eq!(tracker.layer_view(Layer::OutsideLibtorch(Device::Cuda(0))).live_bytes, 4096);
        tracker.state.on_event(0x1000, -4096, DEVICE_TYPE_OUTSIDE_LIBTORCH, 0);
        let view = tracker.layer_view(Layer::OutsideLibtorch(Device::Cuda(0)));
        assert_eq!((view.live_bytes, view.peak_bytes, view.allocations, view.frees), (0, 4096, 1, 1));
        assert_eq!(tracker.view(Device::Cuda(0)).allocations, 0, "tensors are counted apart");
    }
}
