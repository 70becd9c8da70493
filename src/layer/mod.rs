//! The layers of memory a leak test judges. Each has its home in a module
//! of its own here; this file registers them (`Layer`, `home`, `HOMES`,
//! `followed`) and holds what every home provides (`Home`, `Counting`).
pub(crate) mod host_objects;
pub(crate) mod outside_libtorch;
pub(crate) mod rust_heap;
pub(crate) mod tensors;

use crate::probe::hook::{HookView, Tracker};
use crate::probe::process::Coverage;
use crate::verdict::{Leak, Series, Verdict};
use std::fmt;
use tch::Device;

/// How reports and the JSON name a device: `cpu`, `cuda:0`.
pub(crate) fn device_name(device: Device) -> String {
    match device {
        Device::Cpu => "cpu".into(),
        Device::Cuda(i) => format!("cuda:{i}"),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// The inverse of [`device_name`] for the devices a leak test measures.
pub(crate) fn device_from_name(name: &str) -> Option<Device> {
    match name {
        "cpu" => Some(Device::Cpu),
        other => other.strip_prefix("cuda:")?.parse().ok().map(Device::Cuda),
    }
}

/// `tch::Device` in the JSON: its name (`cpu`, `cuda:0`).
pub(crate) mod device_serde {
    use tch::Device;

    pub(crate) fn serialize<S: serde::Serializer>(device: &Device, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::device_name(*device))
    }

    pub(crate) fn deserialize<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Device, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(deserializer)?;
        super::device_from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("{name:?} is not a device name")))
    }
}

/// One judged layer of memory. Each has one home in the crate, a module of
/// its own that says what it is and how it is counted, proved and judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layer {
    /// Tensor memory libtorch allocates on a device: host memory through its
    /// CPU allocator on the CPU (pinned host memory too, in process scope),
    /// device memory through its CUDA allocator on CUDA.
    Tensors(Device),
    /// libtorch's C++ heap on the host: autograd's graph nodes,
    /// saved-variable records, `TensorImpl`s and libtorch's own containers,
    /// counted through operator new. Rust's heap (a `Vec<f64>` of losses) is
    /// not in it.
    HostObjects,
    /// Memory allocated through the CUDA driver by code outside libtorch's
    /// allocators: on a CUDA device (a custom kernel crate's `cuMemAlloc`,
    /// NCCL's buffers, a library's `cudaMalloc`), or pinned host memory on
    /// the CPU (`cudaHostAlloc` outside libtorch's caching host allocator).
    /// Seen through CUPTI's callbacks on the driver's allocation calls.
    OutsideLibtorch(Device),
    /// The Rust heap: what Rust code allocates through the global allocator
    /// (a `Vec` of decoded samples, a `Box`, a `String`), counted by
    /// gpu-leak-test's counting global allocator in process scope.
    RustHeap,
}

/// Every layer's home, for reading a layer back from its name.
const HOMES: [&dyn Home; 4] =
    [&tensors::Tensors, &host_objects::HostObjects, &outside_libtorch::OutsideLibtorch, &rust_heap::RustHeapHome];

/// The layers a test follows: the CPU's tensors and libtorch's host
/// objects first, then the Rust heap where it is counted (see
/// `rust_heap::not_counted_because`), then every CUDA device of the
/// machine where CUDA is loaded (nothing can allocate on CUDA otherwise;
/// see `cuda::is_loaded`), then, for a CUDA body, what the driver gives
/// code outside libtorch.
pub(crate) fn followed(body: Device, scope: crate::scope::ResolvedScope) -> Vec<Layer> {
    let mut layers = vec![Layer::Tensors(Device::Cpu), Layer::HostObjects];
    if rust_heap::not_counted_because(scope).is_none() {
        layers.push(Layer::RustHeap);
    }
    layers.extend((0..crate::probe::cuda::loaded_device_count()).map(|i| Layer::Tensors(Device::Cuda(i))));
    if !layers.contains(&Layer::Tensors(body)) {
        layers.push(Layer::Tensors(body));
    }
    layers.extend(outside_libtorch::followed(body));
    layers
}

impl Layer {
    /// The layer's home, and the device it is on.
    fn home(self) -> (&'static dyn Home, Device) {
        match self {
            Layer::Tensors(device) => (&tensors::Tensors, device),
            Layer::HostObjects => (&host_objects::HostObjects, Device::Cpu),
            Layer::OutsideLibtorch(device) => (&outside_libtorch::OutsideLibtorch, device),
            Layer::RustHeap => (&rust_heap::RustHeapHome, Device::Cpu),
        }
    }

    /// The device whose memory it is: the CPU for the C++ heap.
    pub fn device(self) -> Device {
        self.home().1
    }

    /// Its name in reports and the JSON: `cpu`, `cuda:0`, `host-objects`,
    /// `outside-libtorch:cuda:0`, `outside-libtorch:cpu`.
    pub fn name(self) -> String {
        let (home, device) = self.home();
        home.name(device)
    }

    /// The inverse of [`Layer::name`].
    pub fn from_name(name: &str) -> Option<Layer> {
        HOMES.iter().find_map(|home| home.parse(name))
    }

    /// The layer in a few words, for a sentence or a legend:
    /// `tensors on cuda:0`, `libtorch's host objects`.
    pub fn plain_name(self) -> String {
        let (home, device) = self.home();
        home.plain_name(device)
    }

    /// What memory it is, for a reader.
    pub fn description(self) -> &'static str {
        let (home, device) = self.home();
        home.description(device)
    }

    /// Where a verdict on it is, for a report's first line: `cuda:0`,
    /// `cpu (libtorch's host objects)`.
    pub(crate) fn place(self) -> String {
        let (home, device) = self.home();
        home.place(device)
    }

    /// A sentence on what grew, where the layer is not plain tensors.
    pub(crate) fn what_grew(self) -> Option<&'static str> {
        self.home().0.what_grew()
    }

    /// What to do where the blocks allocated at `place` outlive each
    /// iteration, for the report's hint.
    pub(crate) fn kept_hint(self, place: &str) -> String {
        self.home().0.kept_hint(place)
    }

    /// The label beside its allocation sites, where it is not plain tensors.
    pub(crate) fn site_label(self) -> Option<&'static str> {
        self.home().0.site_label()
    }

    /// The device type and index the shim's events for it carry
    /// (build_support/event_kinds.rs), where the hook counts it.
    pub(crate) fn event_kind(self) -> Option<(i32, i32)> {
        let (home, device) = self.home();
        home.event_kind(device)
    }

    /// Whether its count keeps a peak, so a budget or a baseline can bound it.
    pub(crate) fn keeps_peak(self) -> bool {
        self.home().0.keeps_peak()
    }

    /// How it is counted in this scope, before its canary proves it.
    pub(crate) fn count(self, process_scope: bool, coverage: &Coverage) -> Box<dyn Counting> {
        let (home, device) = self.home();
        home.count(device, process_scope, coverage)
    }

    /// Its verdict on the measured window.
    pub(crate) fn decide(self, series: &Series, window: u32, threshold_bytes: u64, peak: Option<(i64, u64)>) -> Verdict {
        self.home().0.decide(series, window, threshold_bytes, peak)
    }

    /// Whether its series could still be judged a leak.
    pub(crate) fn may_leak(self, series: &Series) -> bool {
        self.home().0.may_leak(series)
    }

    /// Its verdict on a leak once attribution ran.
    pub(crate) fn after_attribution(self, leak: &Leak, found: &Attributed) -> Verdict {
        self.home().0.after_attribution(leak, found)
    }

    /// Iterations a block of it may outlive its own, freed late by another
    /// thread, and still be state replaced every iteration.
    pub(crate) fn iterations_a_free_may_lag(self) -> u32 {
        self.home().0.iterations_a_free_may_lag()
    }
}

/// What a layer's home provides: what the layer is, for a reader, and how
/// it is counted and judged. One implementation per layer module.
pub(crate) trait Home: Sync {
    /// Its name in reports and the JSON.
    fn name(&self, device: Device) -> String;
    /// The layer of this home that `name` names, if any.
    fn parse(&self, name: &str) -> Option<Layer>;
    /// A few words for a sentence or a legend.
    fn plain_name(&self, device: Device) -> String;
    /// What memory it is.
    fn description(&self, device: Device) -> &'static str;
    /// Where a verdict on it is, for a report's first line.
    fn place(&self, device: Device) -> String;
    /// A sentence on what grew, after a leak's rate.
    fn what_grew(&self) -> Option<&'static str>;
    /// What to do where the blocks allocated at `place` outlive each
    /// iteration: by default, tensors kept across iterations.
    fn kept_hint(&self, place: &str) -> String {
        format!(
            "the tensors allocated at {place} outlive each iteration: something kept across iterations (a Vec, \
             a static, state captured by the closure, a leaked Box) holds them. Drop them at the end of the \
             iteration, keep plain numbers instead, or keep them under `tch::no_grad` / `detach()` if they \
             must stay."
        )
    }
    /// The label beside its allocation sites.
    fn site_label(&self) -> Option<&'static str>;
    /// The device type and index of the shim's events for it.
    fn event_kind(&self, device: Device) -> Option<(i32, i32)>;
    /// Whether its count keeps a peak.
    fn keeps_peak(&self) -> bool;
    /// Its source in this scope, before its canary.
    fn count(&self, device: Device, process_scope: bool, coverage: &Coverage) -> Box<dyn Counting>;
    /// Its verdict on the measured window (the levels, the threshold over
    /// the window, and the peak against its budget where one is set): by
    /// default the rule every layer shares (`verdict::decide`).
    fn decide(&self, series: &Series, window: u32, threshold_bytes: u64, peak: Option<(i64, u64)>) -> Verdict {
        crate::verdict::decide(series, window, threshold_bytes, peak)
    }
    /// Whether growth in `series` could be judged a leak: where it cannot,
    /// confirmation asks no more iterations for the layer.
    fn may_leak(&self, _series: &Series) -> bool {
        true
    }
    /// Its verdict on a leak once attribution ran: by default the rule
    /// every layer shares (`verdict::after_attribution`).
    fn after_attribution(&self, leak: &Leak, found: &Attributed) -> Verdict {
        crate::verdict::after_attribution(leak, found.replaced, found.suppressed_per_iteration, found.window, found.threshold_bytes)
    }
    /// Iterations a block may outlive its own and still be replaced state:
    /// by default none, a block alive after the next iteration is kept.
    fn iterations_a_free_may_lag(&self) -> u32 {
        0
    }
}

/// What attribution found about one leaking layer, for its rule.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attributed {
    /// No site kept memory across the iterations: state replaced each one.
    pub(crate) replaced: bool,
    /// The layer's trough rose over attribution's iterations.
    pub(crate) trough_rose: bool,
    /// Bytes per iteration at suppressed sites.
    pub(crate) suppressed_per_iteration: f64,
    /// The measured window, and the threshold over it.
    pub(crate) window: u32,
    pub(crate) threshold_bytes: u64,
}

/// A layer's peak since its last reset: what budgets read, and what
/// memory baselines read, which repeats from run to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Peaks {
    pub(crate) peak: i64,
    pub(crate) repeatable: i64,
}

/// What the canary needs to know of the test.
#[derive(Clone, Copy)]
pub(crate) struct Proof<'a> {
    /// Where the body runs.
    pub(crate) body: Device,
    pub(crate) process_scope: bool,
    pub(crate) tracker: &'a Tracker,
    pub(crate) coverage: &'a Coverage,
}

/// One followed layer as its source counts it: the state a run keeps per
/// layer. No verdict comes from a source that could not see, so
/// [`Counting::prove`] runs before the body.
pub(crate) trait Counting: Send + Sync {
    /// The layer counted.
    fn layer(&self) -> Layer;
    /// The source as the report names it.
    fn source_name(&self) -> &'static str;
    /// The source sees each allocation, so survivors can be grouped by
    /// site; statistics give totals only.
    fn attributable(&self) -> bool {
        true
    }
    /// The source reports allocation events; where it does not
    /// (statistics), a level that moved is the sign the layer was used.
    fn counts_events(&self) -> bool {
        true
    }
    /// Before a sample's levels are read, on the body's thread: frees what
    /// libtorch keeps only until the thread's next call into it, so that a
    /// level is what the body kept.
    fn settle(&self) {}
    /// Live bytes now.
    fn level(&self, tracker: &Tracker) -> i64;
    /// Live bytes now on every thread, where a test counts only its own
    /// (thread scope): `global` is the process-wide tracker.
    fn level_process_wide(&self, global: &Tracker) -> i64;
    /// The peaks since the last [`Counting::reset_peak`], where the source
    /// keeps one.
    fn peaks(&self, tracker: &Tracker) -> Option<Peaks>;
    /// Starts a new peak window.
    fn reset_peak(&self, tracker: &Tracker);
    /// Allocations and frees counted so far.
    fn events(&self, tracker: &Tracker) -> u64;
    /// The tracker's figures as this source counts them.
    fn view(&self, tracker: &Tracker) -> HookView;
    /// Starts following the layer for the allocations alive at its peak.
    fn watch_peak(&self, tracker: &Tracker);
    /// Proves with a canary that the source sees this layer, falling back
    /// to another source where the layer has one; `Ok` is what the canary
    /// added, `Err` why every source was blind.
    fn prove(&mut self, proof: Proof<'_>) -> Result<i64, String>;
    /// What the report says about how it was counted, where that limits it.
    fn coverage_note(&self, _coverage: &Coverage) -> Option<String> {
        None
    }
    /// The shim feeds its blocks to the tracker only while attribution
    /// asks (process scope's C++ heap).
    fn feeds_sites_on_request(&self) -> bool {
        false
    }
    /// The verdict where this source cannot back one, and why.
    fn cannot_measure(&self, reason: String) -> Verdict {
        Verdict::CannotMeasure {
            layer: self.layer().description().to_string(),
            source: self.source_name().to_string(),
            reason,
        }
    }
}

/// The per-thread hook's name, a source of every layer in thread scope.
pub(crate) const HOOK: &str = "the per-thread allocation hook";

/// Bytes of the canary: one block of the caching allocator, and exact on
/// the CPU.
pub(crate) const CANARY_BYTES: i64 = 512;

/// Allocates and frees a canary tensor on `device` (on this thread) and
/// returns what `level` rose by, where it rose and fell by at least
/// `least`: up to three tries, as another thread's allocation in between
/// can hide it once. `Ok(None)`: the source missed it; `Err`: libtorch
/// could not allocate it (a full device), which is not the source's fault.
pub(crate) fn canary_tensor(device: Device, least: i64, level: impl Fn() -> i64) -> Result<Option<i64>, String> {
    let sync = || {
        if let Device::Cuda(index) = device {
            let _ = crate::probe::cuda::synchronize(index);
        }
    };
    for _ in 0..3 {
        let before = level();
        let canary = tch::Tensor::f_zeros([CANARY_BYTES / 4], (tch::Kind::Float, device)).map_err(|e| {
            format!("before the body ran, a {CANARY_BYTES} B canary tensor could not be allocated on {}: {e}", device_name(device))
        })?;
        sync();
        let with = level();
        drop(canary);
        sync();
        let after = level();
        if with - before >= least && with - after >= least {
            return Ok(Some(with - before));
        }
    }
    Ok(None)
}

impl From<Device> for Layer {
    fn from(device: Device) -> Layer {
        Layer::Tensors(device)
    }
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

impl serde::Serialize for Layer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Layer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Layer, D::Error> {
        let name = <String as serde::Deserialize>::deserialize(deserializer)?;
        Layer::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("{name:?} is not a layer name")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layer_reads_back_from_its_name() {
        for layer in [
            Layer::Tensors(Device::Cpu),
            Layer::Tensors(Device::Cuda(3)),
            Layer::HostObjects,
            Layer::OutsideLibtorch(Device::Cuda(1)),
            Layer::OutsideLibtorch(Device::Cpu),
            Layer::RustHeap,
        ] {
            assert_eq!(Layer::from_name(&layer.name()), Some(layer));
        }
        assert_eq!(Layer::from_name("gpu"), None);
        assert_eq!(Layer::from_name("outside-libtorch"), None);
        assert_eq!(Layer::from_name("outside-libtorch:gpu"), None);
        assert_eq!(Layer::HostObjects.device(), Device::Cpu);
    }
}
