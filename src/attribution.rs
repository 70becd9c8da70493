//! Groups the allocations that survived the attribution iterations by the
//! first frame of the user's code, so a report can say "this line keeps
//! 512 B alive per iteration".
use crate::probe::stacks::{self, Frame, Symbolizer};
use crate::probe::LiveAllocation;
use std::collections::BTreeMap;
use std::path::Path;
use crate::layer::Layer;
use tch::Device;

/// Reports written before layers were named held tensor sites only.
fn tensors_on_cpu() -> Layer {
    Layer::Tensors(Device::Cpu)
}

/// Survivors that share one allocation site.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Site {
    /// `file:line` of the first frame in the user's code, relative to the
    /// crate under test where possible; `None` when no frame is the user's.
    pub location: Option<String>,
    /// That frame's function, demangled.
    pub function: Option<String>,
    /// The next line of the user's code further out (`file:line`): where a
    /// helper was called, or where a model whose closure allocated was
    /// called (`forward`). The description names up to three such lines.
    pub called_from: Option<String>,
    /// One line saying what the site is.
    pub description: String,
    /// What survived: blocks, bytes, and the iterations that allocated them.
    #[serde(flatten)]
    pub survivors: Survivors,
    /// Which thread allocated them, and whether inside `backward()`.
    #[serde(flatten)]
    pub allocated_by: AllocatedBy,
    /// The device its survivors live on.
    #[serde(with = "crate::layer::device_serde")]
    pub device: Device,
    /// The layer they count in: the device's tensors, or libtorch's host
    /// objects (C++ heap blocks such as graph nodes, on the CPU).
    #[serde(default = "tensors_on_cpu")]
    pub layer: Layer,
    /// A trimmed stack of one of its allocations, innermost first.
    pub stack: Vec<Frame>,
    /// The reason of the suppression in `gpu-leak-test.yaml` that matches it.
    pub suppressed_by: Option<String>,
}

/// The blocks allocated at one site that survived attribution's
/// iterations.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Survivors {
    /// Blocks allocated here that survived.
    pub allocations: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Their bytes per attribution iteration.
    pub bytes_per_iteration: f64,
    /// The attribution iterations (1-based) the survivors were allocated in.
    pub iterations: Vec<u32>,
    /// Bytes of its survivors allocated in each attribution iteration
    /// (index 0 is iteration 1): how the site's retained bytes built up.
    #[serde(default)]
    pub bytes_by_iteration: Vec<u64>,
    /// Addresses of its surviving allocations (not written to the JSON).
    #[serde(skip)]
    pub addresses: Vec<usize>,
}

/// Who allocated a site's survivors.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct AllocatedBy {
    /// Allocated inside `backward()`.
    pub inside_backward: bool,
    /// Allocated on another thread (an autograd device thread, or in
    /// process scope any thread besides the test's).
    pub on_other_thread: bool,
    /// The name of the thread that allocated them, where it is not the
    /// test's own (as the tracker recorded it with each allocation).
    pub thread: Option<String>,
}

impl Site {
    /// Survivors from one iteration only, the last one: state that is
    /// replaced every iteration rather than piling up.
    pub fn only_last_iteration(&self, last: u32) -> bool {
        self.survivors.iterations == [last]
    }
}

/// What attribution found.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Attribution {
    /// Number of attribution iterations run.
    pub iterations: u32,
    /// Where the survivors were allocated, the biggest first.
    pub sites: Vec<Site>,
}

impl Attribution {
    /// Bytes at every site together.
    pub fn total_bytes(&self) -> u64 {
        self.sites.iter().map(|s| s.survivors.bytes).sum()
    }

    /// True when something allocated in `layer` before the last attribution
    /// iteration is still alive, beyond the `may_live` iterations a block of
    /// it may outlive its own without being kept (another thread's late
    /// free, a sawtooth's rising edge; the judge says how many): memory kept
    /// across iterations, the mark of a leak.
    pub fn kept_across_iterations(&self, layer: Layer, may_live: u32) -> bool {
        self.sites
            .iter()
            .filter(|s| s.layer == layer)
            .any(|s| s.survivors.iterations.iter().any(|&i| i + may_live < self.iterations))
    }

    /// Marks the sites in `layer` a suppression matches (a glob on
    /// `file:line`, on the function, or on the line that called a helper)
    /// and returns their bytes per iteration.
    pub fn apply_suppressions(&mut self, layer: Layer, suppressions: &[crate::config::Suppression]) -> f64 {
        use crate::config::glob_match;
        let mut suppressed = 0.0;
        for site in self.sites.iter_mut().filter(|s| s.layer == layer) {
            let names = [&site.location, &site.function, &site.called_from];
            let hit = suppressions.iter().find(|s| {
                names.iter().any(|name| name.as_deref().is_some_and(|n| glob_match(&s.site, n)))
                    || glob_match(&s.site, &site.description)
            });
            if let Some(suppression) = hit {
                site.suppressed_by = Some(suppression.reason.clone());
                suppressed += site.survivors.bytes_per_iteration;
            }
        }
        suppressed
    }
}

/// How many lines of the user's code, beyond the allocating one, a site
/// names: enough to tell two loops that call one model apart.
const CALLERS_NAMED: usize = 3;

/// The lines of the user's code further out than `frames[0]` (the
/// allocating frame of the user's), innermost first, up to the harness: for
/// a closure in a model definition (`add_fn(|x| ...)`), the line that
/// called into the model (`forward`, `forward_t`, `apply`); for a helper,
/// the line that called it. Frames are told apart by their line, not their
/// function's name: two closures of one function demangle alike.
fn callers_in_user_code(frames: &[Frame], root: &Path) -> Vec<String> {
    let mut callers: Vec<String> = Vec::new();
    let first = frames.first().and_then(|f| f.location()).map(|l| stacks::relative_to(&l, root));
    for frame in frames.iter().skip(1) {
        // Past the harness the frames are the test function's, every site's alike.
        if frame.function.starts_with("gpu_leak_test::") {
            break;
        }
        if stacks::is_library_frame(frame) {
            continue;
        }
        if let Some(location) = frame.location().map(|l| stacks::relative_to(&l, root)) {
            if callers.last().or(first.as_ref()) != Some(&location) {
                callers.push(location);
            }
        }
        if callers.len() == CALLERS_NAMED {
            break;
        }
    }
    callers
}

/// Groups `survivors` (every device), allocated with tags `1..=iterations`.
/// `root` is the manifest folder of the crate under test, for short paths.
pub fn attribute(survivors: &[LiveAllocation], iterations: u32, root: &Path) -> Attribution {
    let mut symbolizer = Symbolizer::new();
    symbolizer.prepare(survivors.iter().map(|s| &s.stack));
    let mut sites: BTreeMap<String, Site> = BTreeMap::new();
    for survivor in survivors {
        let frames = symbolizer.resolve(&survivor.stack);
        let inside_backward = stacks::is_inside_backward(&frames);
        let user_index = frames.iter().position(|f| !stacks::is_library_frame(f));
        let user = user_index.map(|i| &frames[i]);
        let location = user.and_then(|f| f.location()).map(|l| stacks::relative_to(&l, root));
        let function = user.map(|f| f.function.clone());
        let chain = user_index.map(|i| callers_in_user_code(&frames[i..], root)).unwrap_or_default();
        let called_from = chain.first().cloned();
        let on_thread = match (&survivor.thread, inside_backward) {
            (Some(thread), false) => format!(" on thread `{thread}`"),
            (None, false) if !survivor.on_owner_thread => " on another thread".to_string(),
            _ => String::new(),
        };
        let description = match (&location, inside_backward, survivor.on_owner_thread) {
            (Some(location), _, _) => {
                let callers: String = chain.iter().map(|c| format!(", called from {c}")).collect();
                format!("{location} in {}{callers}{on_thread}", function.as_deref().unwrap_or("?"))
            }
            (None, true, _) | (None, _, false) => {
                "allocated by an autograd thread during backward() (no frame of yours on its stack)".to_string()
            }
            (None, false, true) => "allocated in library code with no frame of yours on the stack".to_string(),
        };
        let key = format!("{}|{description}|{inside_backward}", survivor.layer);
        let site = sites.entry(key).or_insert_with(|| Site {
            location,
            function,
            called_from,
            description,
            survivors: Survivors::default(),
            allocated_by: AllocatedBy {
                inside_backward,
                on_other_thread: !survivor.on_owner_thread,
                thread: survivor.thread.as_deref().map(str::to_string),
            },
            device: survivor.device,
            layer: survivor.layer,
            suppressed_by: None,
            stack: trim_stack(&frames)
                .into_iter()
                .map(|mut f| {
                    f.file = f.file.map(|file| stacks::relative_to(&file, root));
                    f
                })
                .collect(),
        });
        site.survivors.allocations += 1;
        site.survivors.bytes += survivor.bytes;
        if site.survivors.bytes_by_iteration.len() < iterations as usize {
            site.survivors.bytes_by_iteration.resize(iterations as usize, 0);
        }
        if let Some(slot) = (survivor.tag as usize).checked_sub(1).and_then(|i| site.survivors.bytes_by_iteration.get_mut(i)) {
            *slot += survivor.bytes;
        }
        site.survivors.addresses.push(survivor.address);
        if !site.survivors.iterations.contains(&survivor.tag) {
            site.survivors.iterations.push(survivor.tag);
        }
    }
    let mut sites: Vec<Site> = sites.into_values().collect();
    for site in &mut sites {
        site.survivors.iterations.sort_unstable();
        site.survivors.bytes_per_iteration = site.survivors.bytes as f64 / iterations.max(1) as f64;
    }
    // Sites that pile up over several iterations first, then by size.
    sites.sort_by(|a, b| {
        let recurring = |s: &Site| s.survivors.iterations.len() >= 2;
        recurring(b).cmp(&recurring(a)).then(b.survivors.bytes.cmp(&a.survivors.bytes)).then(a.description.cmp(&b.description))
    });
    Attribution { iterations, sites }
}

/// Frames of the hook itself: never interesting to a reader.
fn is_hook_frame(frame: &Frame) -> bool {
    let f = frame.function.as_str();
    f.starts_with("gpu_leak_test::probe")
        || f.starts_with("backtrace::")
        || f.starts_with("trace")
        || f.contains("catch_unwind")
        || f.contains("do_call")
        || f.contains("__rust_try")
        || f.contains("AssertUnwindSafe")
        || f.starts_with("core::ops::function")
        || f.contains("RustHook")
        || f.contains("reportMemoryUsage")
        || f.contains("report_process_event")
        || f.contains("CountingCpuAllocator")
        || f.contains("on_cuda_trace")
        || is_driver_callback_frame(frame)
        // The CUDA trace tracker's std::function plumbing (process scope).
        || f.contains("c10::CachingDeviceAllocator::TraceEntry const&")
}

/// The shim's CUPTI callback on a driver allocation call
/// (csrc/driver_calls.cpp).
fn is_driver_callback_frame(frame: &Frame) -> bool {
    let f = frame.function.as_str();
    f.contains("on_driver_call") || f.contains("record_allocation") || f.contains("record_device_allocation")
}

/// Keeps a stack readable: drops the hook's own frames, folds long runs of
/// libtorch internals, and ends after the user's frames reach the harness.
pub fn trim_stack(frames: &[Frame]) -> Vec<Frame> {
    const KEEP_LIBRARY_RUN: usize = 3;
    // The walk starts inside the hook (this crate, the shim, inlined core
    // helpers): begin after the last such frame near the top, above the
    // user's first frame (the harness's frames below it, which a short
    // stack from the Rust heap's allocator reaches, are not the hook).
    let first_user = frames.iter().position(|f| !stacks::is_library_frame(f)).unwrap_or(frames.len());
    let start = frames[..first_user.min(32)]
        .iter()
        .rposition(|f| is_hook_frame(f) || f.file.as_deref().is_some_and(stacks::is_own_source))
        .map_or(0, |i| i + 1);
    // Below a CUPTI callback come CUPTI's and the driver's own frames,
    // which have no symbols: begin at the caller of the driver.
    let start = match start.checked_sub(1).map(|i| is_driver_callback_frame(&frames[i])) {
        Some(true) => start + frames[start..].iter().take_while(|f| f.function.starts_with("<unknown at ")).count(),
        _ => start,
    };
    let mut out = Vec::new();
    let mut seen_user = false;
    let mut folded = 0usize;
    let mut run = 0usize;
    for frame in &frames[start..] {
        let library = stacks::is_library_frame(frame);
        if seen_user && frame.function.starts_with("gpu_leak_test::") {
            break;
        }
        if library {
            run += 1;
            if run > KEEP_LIBRARY_RUN {
                folded += 1;
                continue;
            }
        } else {
            seen_user = true;
            run = 0;
        }
        if folded > 0 {
            out.push(Frame { function: format!("… {folded} library frames …"), file: None, line: None });
            folded = 0;
        }
        out.push(frame.clone());
    }
    if folded > 0 {
        out.push(Frame { function: format!("… {folded} library frames …"), file: None, line: None });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survivors_from(layer: Layer, iterations: &[u32]) -> Site {
        Site {
            location: None,
            function: None,
            called_from: None,
            description: String::new(),
            survivors: Survivors { allocations: iterations.len(), iterations: iterations.to_vec(), ..Default::default() },
            allocated_by: AllocatedBy::default(),
            device: Device::Cpu,
            layer,
            stack: Vec::new(),
            suppressed_by: None,
        }
    }

    #[test]
    fn a_host_object_freed_one_iteration_late_is_not_kept_but_what_piles_up_is() {
        let found = |layer, iterations: &[u32]| Attribution { iterations: 10, sites: vec![survivors_from(layer, iterations)] };
        let host = Layer::HostObjects;
        let late = host.iterations_a_free_may_lag();
        assert_eq!(late, 1);
        // autograd's worker dropped the last two GraphTasks after the sample.
        assert!(!found(host, &[9, 10]).kept_across_iterations(host, late));
        assert!(!found(host, &[10]).kept_across_iterations(host, late));
        // Every iteration, or every other: a leak's survivors reach further back.
        assert!(found(host, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).kept_across_iterations(host, late));
        assert!(found(host, &[2, 4, 6, 8, 10]).kept_across_iterations(host, late));
        assert!(found(host, &[8]).kept_across_iterations(host, late));
        // A sawtooth of period 4 keeps the graph of its last 3 iterations
        // until its fall; a leak beside it reaches further back still.
        assert!(!found(host, &[7, 8, 9, 10]).kept_across_iterations(host, late + 3));
        assert!(found(host, &[3, 7, 8, 9, 10]).kept_across_iterations(host, late + 3));
        // Tensors are freed before the sample: one iteration late is kept.
        let tensors = Layer::Tensors(Device::Cpu);
        let late = tensors.iterations_a_free_may_lag();
        assert_eq!(late, 0);
        assert!(found(tensors, &[9, 10]).kept_across_iterations(tensors, late));
        assert!(!found(tensors, &[10]).kept_across_iterations(tensors, late));
    }

    fn frame(function: &str, file: Option<&str>) -> Frame {
        Frame { function: function.into(), file: file.map(Into::into), line: Some(1) }
    }

    #[test]
    fn trimming_starts_after_the_hook_frames() {
        let own = concat!(env!("CARGO_MANIFEST_DIR"), "/src/probe/hook.rs");
        let frames = vec![
            frame("{closure#0}", Some(own)),
            frame("core::bool::<impl bool>::then", Some("/rustc/1/library/core/src/bool.rs")),
            frame("gpu_leak_test::probe::hook::TrackerState::on_allocation", Some(own)),
            frame("(anonymous namespace)::RustHook::reportMemoryUsage(void*, long, unsigned long, unsigned long, c10::Device)", None),
            frame("std::_Function_handler<void (c10::CachingDeviceAllocator::TraceEntry const&), void (*)(c10::CachingDeviceAllocator::TraceEntry const&)>::_M_invoke(std::_Any_data const&, c10::CachingDeviceAllocator::TraceEntry const&)", None),
            frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", None),
            frame("user::leaky::{{closure}}", Some("/w/tests/t.rs")),
        ];
        let names: Vec<String> = trim_stack(&frames).into_iter().map(|f| f.function).collect();
        assert_eq!(names, ["c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", "user::leaky::{{closure}}"]);
    }

    #[test]
    fn trimming_starts_at_the_caller_of_the_driver_below_a_cupti_callback() {
        let frames = [
            frame("gpu_leak_test::probe::hook::on_event", None),
            frame("glt::report_to_hook(void*, long, int, int)", None),
            frame("(anonymous namespace)::record_allocation(unsigned long, long, bool, int)", None),
            frame("(anonymous namespace)::on_driver_call(void*, CUpti_CallbackDomain, unsigned int, void const*)", None),
            frame("<unknown at 0x7fe7db67d163>", None),
            frame("<unknown at 0x7fe7db7215bd>", None),
            frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc", None),
            frame("my_crate::step", Some("src/step.rs")),
        ];
        let trimmed = trim_stack(&frames);
        assert_eq!(trimmed[0].function, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc");
        assert_eq!(trimmed.last().unwrap().function, "my_crate::step");
    }

    #[test]
    fn trimming_folds_library_runs_and_stops_at_the_harness() {
        let mut frames = vec![frame("gpu_leak_test::probe::hook::on_event", Some("/x/src/probe/hook.rs"))];
        frames.extend((0..10).map(|i| frame(&format!("at::op{i}"), None)));
        frames.push(frame("user::leaky::{{closure}}", Some("/w/tests/t.rs")));
        frames.push(frame("gpu_leak_test::protocol::run", Some("/x/src/protocol/mod.rs")));
        frames.push(frame("std::rt::lang_start", Some("/rustc/1/library/std/src/rt.rs")));
        let trimmed = trim_stack(&frames);
        let names: Vec<&str> = trimmed.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["at::op0", "at::op1", "at::op2", "… 7 library frames …", "user::leaky::{{closure}}"]);
    }
}
