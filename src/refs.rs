//! Which part of the test's own state still holds the retained tensors.
//!
//! [`TensorRefs`] enumerates the tensors a value holds, with a path for each
//! (`cache[3]`, `state.history[0]`, `vs["fc.weight"]`). A test names its roots
//! with [`watch`] at the end of an iteration; the call costs nothing unless
//! the harness is attributing a failure on this thread. The harness matches
//! the watched tensors to the surviving allocations by storage address.
use crate::attribution::Attribution;
use crate::probe::LiveAllocation;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use tch::{Device, Tensor};

/// Values that hold tensors. Implemented for `Tensor`, collections, `Option`,
/// `Box`, tuples, `nn::VarStore` and plain data (which holds none); derive it
/// for your structs with `#[derive(TensorRefs)]`.
pub trait TensorRefs {
    /// Calls `visit` with the path and the tensor for every tensor held.
    /// `path` is this value's own path; implementations extend it for
    /// their parts and restore it afterwards.
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor));
}

/// Runs `f` with `suffix` appended to `path`, then restores `path`.
pub fn with_suffix(path: &mut String, suffix: std::fmt::Arguments<'_>, f: impl FnOnce(&mut String)) {
    use std::fmt::Write;
    let len = path.len();
    let _ = path.write_fmt(suffix);
    f(path);
    path.truncate(len);
}

impl TensorRefs for Tensor {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        if self.defined() {
            visit(path, self);
        }
    }
}

impl<T: TensorRefs> TensorRefs for [T] {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        for (i, item) in self.iter().enumerate() {
            with_suffix(path, format_args!("[{i}]"), |p| item.for_each_tensor(p, visit));
        }
    }
}

impl<T: TensorRefs, const N: usize> TensorRefs for [T; N] {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        self.as_slice().for_each_tensor(path, visit)
    }
}

impl<T: TensorRefs> TensorRefs for Vec<T> {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        self.as_slice().for_each_tensor(path, visit)
    }
}

impl<T: TensorRefs> TensorRefs for std::collections::VecDeque<T> {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        for (i, item) in self.iter().enumerate() {
            with_suffix(path, format_args!("[{i}]"), |p| item.for_each_tensor(p, visit));
        }
    }
}

impl<T: TensorRefs> TensorRefs for Option<T> {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        if let Some(value) = self {
            value.for_each_tensor(path, visit)
        }
    }
}

macro_rules! through_pointer {
    ($($pointer:ident)::+) => {
        impl<T: TensorRefs + ?Sized> TensorRefs for $($pointer)::+<T> {
            fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
                (**self).for_each_tensor(path, visit)
            }
        }
    };
}
through_pointer!(Box);
through_pointer!(std::rc::Rc);
through_pointer!(std::sync::Arc);

impl<T: TensorRefs + ?Sized> TensorRefs for &T {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        (**self).for_each_tensor(path, visit)
    }
}

impl<T: TensorRefs + ?Sized> TensorRefs for &mut T {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        (**self).for_each_tensor(path, visit)
    }
}

impl<T: TensorRefs> TensorRefs for std::cell::RefCell<T> {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        if let Ok(value) = self.try_borrow() {
            value.for_each_tensor(path, visit)
        }
    }
}

impl<T: TensorRefs> TensorRefs for std::sync::Mutex<T> {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        if let Ok(value) = self.try_lock() {
            value.for_each_tensor(path, visit)
        }
    }
}

impl<K: std::fmt::Debug, V: TensorRefs, S> TensorRefs for HashMap<K, V, S> {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        for (key, value) in self {
            with_suffix(path, format_args!("[{key:?}]"), |p| value.for_each_tensor(p, visit));
        }
    }
}

impl<K: std::fmt::Debug, V: TensorRefs> TensorRefs for BTreeMap<K, V> {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        for (key, value) in self {
            with_suffix(path, format_args!("[{key:?}]"), |p| value.for_each_tensor(p, visit));
        }
    }
}

macro_rules! tuples {
    ($(($($name:ident $index:tt),+))*) => {$(
        impl<$($name: TensorRefs),+> TensorRefs for ($($name,)+) {
            fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
                $( with_suffix(path, format_args!(".{}", $index), |p| self.$index.for_each_tensor(p, visit)); )+
            }
        }
    )*};
}
tuples! {
    (A 0)
    (A 0, B 1)
    (A 0, B 1, C 2)
    (A 0, B 1, C 2, D 3)
    (A 0, B 1, C 2, D 3, E 4)
}

impl TensorRefs for tch::nn::VarStore {
    fn for_each_tensor(&self, path: &mut String, visit: &mut dyn FnMut(&str, &Tensor)) {
        let mut variables: Vec<(String, Tensor)> = self.variables().into_iter().collect();
        variables.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, tensor) in &variables {
            with_suffix(path, format_args!("[{name:?}]"), |p| tensor.for_each_tensor(p, visit));
        }
    }
}

macro_rules! holds_no_tensor {
    ($($t:ty),*) => {$(
        impl TensorRefs for $t {
            fn for_each_tensor(&self, _: &mut String, _: &mut dyn FnMut(&str, &Tensor)) {}
        }
    )*};
}
holds_no_tensor!(bool, char, u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64, String, str, ());

/// One tensor a watched root held when it was last watched.
#[derive(Debug, Clone)]
struct Watched {
    path: String,
    data_ptr: usize,
    shape: Vec<i64>,
    dtype: String,
    device: Device,
    /// Requires grad and is not a leaf: it has an autograd graph behind it,
    /// which keeps the tensors saved for backward alive.
    has_graph: bool,
}

thread_local! {
    /// Roots watched during attribution on this thread; `None` otherwise.
    static WATCHED: RefCell<Option<BTreeMap<String, Vec<Watched>>>> = const { RefCell::new(None) };
}

/// Names a root of the test's state that may hold retained tensors, e.g.
/// `watch("cache", &cached)`. Call it at the end of an iteration. Unless the
/// harness is attributing a failure on this thread it returns at once.
pub fn watch<T: TensorRefs + ?Sized>(root: &str, value: &T) {
    let active = WATCHED.with(|w| w.borrow().is_some());
    if !active {
        return;
    }
    let mut found = Vec::new();
    let mut path = root.to_string();
    value.for_each_tensor(&mut path, &mut |path, tensor| {
        found.push(Watched {
            path: path.to_string(),
            data_ptr: tensor.data_ptr() as usize,
            shape: tensor.size(),
            dtype: format!("{:?}", tensor.kind()),
            device: tensor.device(),
            has_graph: tensor.requires_grad() && !tensor.is_leaf(),
        })
    });
    WATCHED.with(|w| {
        if let Some(roots) = w.borrow_mut().as_mut() {
            roots.insert(root.to_string(), found);
        }
    });
}

/// Collects watched roots on this thread while it lives (the harness holds
/// one over the attribution iterations).
pub(crate) struct Watching(());

impl Watching {
    pub(crate) fn start() -> Watching {
        WATCHED.with(|w| *w.borrow_mut() = Some(BTreeMap::new()));
        Watching(())
    }

    /// Stops collecting and matches what the roots held when last watched.
    pub(crate) fn finish(self, survivors: &[LiveAllocation], attribution: &Attribution) -> Vec<Reference> {
        let roots = WATCHED.with(|w| w.borrow_mut().take()).unwrap_or_default();
        match_survivors(roots, survivors, attribution)
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        WATCHED.with(|w| *w.borrow_mut() = None);
    }
}

/// Retained tensors of one shape, type and site, held by one part of the
/// test's state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Reference {
    /// Where they are held, with index ranges: `cache[0..100]`.
    pub held_by: String,
    /// Other watched paths to the same storage (counted once, here).
    #[serde(default)]
    pub also_held_by: Vec<String>,
    /// Where they require grad and have an autograd graph: what that graph
    /// keeps alive beyond them.
    #[serde(default)]
    pub graph: Option<GraphRetention>,
    /// How many tensors.
    pub tensors: usize,
    /// Their shape.
    pub shape: Vec<i64>,
    /// Their element type, as tch names it (`Float`).
    pub dtype: String,
    /// Their device.
    #[serde(with = "crate::layer::device_serde")]
    pub device: Device,
    /// Bytes of the allocations behind them (each counted once).
    pub bytes: u64,
    /// The site that allocated them (`file:line`).
    pub allocated_at: Option<String>,
}

/// `cache[12].weights` → (`cache[`, 12, `].weights`): the last index in a path.
fn split_last_index(path: &str) -> Option<(&str, usize, &str)> {
    let close = path.rfind(']')?;
    let open = path[..close].rfind('[')?;
    let index = path[open + 1..close].parse().ok()?;
    Some((&path[..=open], index, &path[close..]))
}

/// `[0, 1, 2, 5, 7, 8]` → `0..3, 5, 7..9` (Rust's half-open ranges).
fn index_ranges(indices: &[usize]) -> String {
    let values: Vec<u64> = indices.iter().map(|&i| i as u64).collect();
    consecutive_runs(&values)
        .into_iter()
        .map(|(first, last)| if first == last { first.to_string() } else { format!("{first}..{}", last + 1) })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Matches what the roots held against the surviving allocations (by
/// storage address) and groups the result.
fn match_survivors(roots: BTreeMap<String, Vec<Watched>>, survivors: &[LiveAllocation], attribution: &Attribution) -> Vec<Reference> {
    if roots.is_empty() {
        return Vec::new();
    }
    let by_address: BTreeMap<usize, &LiveAllocation> = survivors.iter().map(|s| (s.address, s)).collect();
    let containing = |ptr: usize| {
        by_address.range(..=ptr).next_back().map(|(_, s)| *s).filter(|s| ptr < s.address + s.bytes.max(1) as usize)
    };
    let site_of: HashMap<usize, Option<String>> = attribution
        .sites
        .iter()
        .flat_map(|site| site.survivors.addresses.iter().map(move |&a| (a, site.location.clone().or(Some(site.description.clone())))))
        .collect();
    type Key = (String, String, Vec<i64>, String, String, Option<String>);
    /// Indices, paths, distinct storages, bytes, device, other paths to the
    /// same storage, and whether any of them has an autograd graph.
    type Group = (Vec<usize>, Vec<String>, std::collections::BTreeSet<usize>, u64, Device, Vec<String>, bool);
    let mut groups: BTreeMap<Key, Group> = BTreeMap::new();
    // Each storage is counted by the first path that holds it; later paths
    // to it (a tensor kept twice, a view) are named beside it.
    let mut claimed: HashMap<usize, Key> = HashMap::new();
    for watched in roots.values().flatten() {
        let Some(survivor) = containing(watched.data_ptr) else { continue };
        let site = site_of.get(&survivor.address).cloned().flatten();
        let (prefix, index, suffix) = match split_last_index(&watched.path) {
            Some((p, i, s)) => (p.to_string(), Some(i), s.to_string()),
            None => (watched.path.clone(), None, String::new()),
        };
        let key = (prefix, suffix, watched.shape.clone(), watched.dtype.clone(), format!("{:?}", watched.device), site);
        if let Some(owner) = claimed.get(&survivor.address).filter(|owner| **owner != key) {
            if let Some(group) = groups.get_mut(owner) {
                group.5.push(watched.path.clone());
                group.6 |= watched.has_graph;
            }
            continue;
        }
        claimed.insert(survivor.address, key.clone());
        let entry =
            groups.entry(key).or_insert_with(|| (Vec::new(), Vec::new(), Default::default(), 0, watched.device, Vec::new(), false));
        entry.6 |= watched.has_graph;
        match index {
            Some(i) => entry.0.push(i),
            None => entry.1.push(watched.path.clone()),
        }
        if entry.2.insert(survivor.address) {
            entry.3 += survivor.bytes;
        }
    }
    let mut references: Vec<Reference> = groups
        .into_iter()
        .map(|((prefix, suffix, shape, dtype, _, site), (mut indices, plain, _, bytes, device, also, graph))| {
            indices.sort_unstable();
            indices.dedup();
            let tensors = indices.len() + plain.len();
            let held_by = if indices.is_empty() {
                prefix
            } else {
                format!("{prefix}{}{suffix}", index_ranges(&indices))
            };
            Reference { held_by, also_held_by: also, tensors, shape, dtype, device, bytes, allocated_at: site, graph: graph.then(GraphRetention::default) }
        })
        .collect();
    attribute_graph_retention(&mut references, survivors, &claimed, attribution);
    references.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.held_by.cmp(&b.held_by)));
    references
}

/// Survivors no watched tensor holds directly are what the autograd graphs
/// behind watched tensors keep alive (the activations saved for backward):
/// they are credited to the watched tensors that have a graph, on their
/// device, grouped by allocation site. With several such tensors on one
/// device the bytes are credited to the first and the others are named.
fn attribute_graph_retention(
    references: &mut [Reference],
    survivors: &[LiveAllocation],
    claimed: &HashMap<usize, impl Sized>,
    attribution: &Attribution,
) {
    let site_of: HashMap<usize, String> = attribution
        .sites
        .iter()
        .flat_map(|site| site.survivors.addresses.iter().map(move |&a| (a, site.location.clone().unwrap_or_else(|| site.description.clone()))))
        .collect();
    let devices: std::collections::BTreeSet<String> =
        references.iter().filter(|r| r.graph.is_some()).map(|r| format!("{:?}", r.device)).collect();
    for device in devices {
        let holders: Vec<usize> =
            (0..references.len()).filter(|&i| references[i].graph.is_some() && format!("{:?}", references[i].device) == device).collect();
        let mut by_site: BTreeMap<String, u64> = BTreeMap::new();
        for survivor in survivors.iter().filter(|s| !claimed.contains_key(&s.address) && format!("{:?}", s.device) == device) {
            let site = site_of.get(&survivor.address).cloned().unwrap_or_else(|| "an unknown site".into());
            *by_site.entry(site).or_default() += survivor.bytes;
        }
        let mut sites: Vec<(String, u64)> = by_site.into_iter().collect();
        sites.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let first = holders[0];
        let others: Vec<String> = holders[1..].iter().map(|&i| references[i].held_by.clone()).collect();
        references[first].graph = Some(GraphRetention { bytes: sites.iter().map(|s| s.1).sum(), sites, shared_with: others });
    }
}

/// What the autograd graph behind a watched tensor keeps alive.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct GraphRetention {
    /// Bytes of surviving allocations no watched tensor holds directly.
    pub bytes: u64,
    /// Where they were allocated (`file:line`), with their bytes, biggest first.
    pub sites: Vec<(String, u64)>,
    /// Other watched tensors with a graph on the same device, which may
    /// hold part of it.
    pub shared_with: Vec<String>,
}

/// Runs of consecutive values in sorted `values`, as (first, last):
/// `[1, 2, 3, 5]` → `[(1, 3), (5, 5)]`.
pub(crate) fn consecutive_runs(values: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &v in values {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == v => *last = v,
            _ => runs.push((v, v)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_paths() {
        assert_eq!(index_ranges(&[0, 1, 2, 5, 7, 8]), "0..3, 5, 7..9");
        assert_eq!(split_last_index("cache[12].w"), Some(("cache[", 12, "].w")));
        assert_eq!(split_last_index("model.w"), None);
    }

    #[test]
    fn paths_of_nested_values() {
        let t = || Tensor::zeros([2], (tch::Kind::Float, Device::Cpu));
        let value = (vec![t(), t()], Some(Box::new(t())), BTreeMap::from([("k", t())]));
        let mut paths = Vec::new();
        value.for_each_tensor(&mut "state".to_string(), &mut |p, _| paths.push(p.to_string()));
        assert_eq!(paths, ["state.0[0]", "state.0[1]", "state.1", "state.2[\"k\"]"]);
    }
}
