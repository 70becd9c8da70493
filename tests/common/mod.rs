//! Helpers shared by the integration tests.
#![allow(dead_code)]
/// The library's own helper: the CUDA device to test on, or `None` after a
/// visible skip line (a failure with GPU_LEAK_TEST_REQUIRE_CUDA=1).
#[allow(unused_imports)]
pub use gpu_leak_test::settings::cuda_device_or_skip;

/// The crate's folder at run time: cargo and nextest set CARGO_MANIFEST_DIR
/// (nextest remaps it when an archive runs from another checkout, where the
/// build-time path does not exist).
pub fn manifest_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR").map(Into::into).unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
}

/// A leak test located at the line that calls it (through any chain of
/// `#[track_caller]` helpers), as reports show it, with the crate's folder at
/// build time as the root that attribution strips from the stacks' paths.
#[track_caller]
pub fn located(name: &str) -> gpu_leak_test::LeakTest {
    let caller = std::panic::Location::caller();
    gpu_leak_test::LeakTest::new(name).location(format!("{}:{}", caller.file(), caller.line()), env!("CARGO_MANIFEST_DIR"))
}

/// What the hook reports for an allocation of `bytes`: exact on the CPU,
/// rounded up to the caching allocator's 512-byte blocks on CUDA (exact
/// again under `backend:cudaMallocAsync` and with caching off, where each
/// tensor is its own driver allocation of the size asked for).
pub fn allocated_size(device: &str, bytes: u64) -> u64 {
    if device.starts_with("cuda") && cuda_tensors_are_cached_blocks() {
        bytes.div_ceil(512) * 512
    } else {
        bytes
    }
}

/// Whether CUDA tensors are blocks of libtorch's native caching allocator,
/// which reports each one to the per-thread hook and keeps the statistics
/// the article's rows are about: not under `backend:cudaMallocAsync`, nor
/// with `PYTORCH_NO_CUDA_MEMORY_CACHING` set.
pub fn cuda_tensors_are_cached_blocks() -> bool {
    let backend = gpu_leak_test::internals::probe::cuda::allocator_backend().unwrap_or_default();
    backend != "cudaMallocAsync" && !uncached()
}

/// Whether `PYTORCH_NO_CUDA_MEMORY_CACHING` switches CUDA caching off: each
/// tensor is then a raw cudaMalloc, and the allocator's statistics stay 0.
pub fn uncached() -> bool {
    std::env::var("PYTORCH_NO_CUDA_MEMORY_CACHING").is_ok_and(|v| !v.trim().is_empty() && v.trim() != "0")
}

/// The CUDA device for a test of the native caching allocator itself (its
/// blocks, cache and statistics), or `None` after a skip line where another
/// backend serves tensors (see [`cuda_tensors_are_cached_blocks`]).
pub fn caching_cuda_device_or_skip(test: &str) -> Option<usize> {
    let index = cuda_device_or_skip(test)?;
    if cuda_tensors_are_cached_blocks() {
        return Some(index);
    }
    println!("{test}: skipped: libtorch's native caching allocator does not serve CUDA tensors here (backend:cudaMallocAsync or PYTORCH_NO_CUDA_MEMORY_CACHING), and this test is about it");
    None
}

/// False where the source that judged the verdict's device sees totals,
/// not allocations (the CUDA allocator's statistics, under
/// `backend:cudaMallocAsync`): there the verdict stands, and no site can be
/// named. The report says so in its note.
pub fn sites_can_be_named(report: &gpu_leak_test::Report) -> bool {
    let judged = report.devices.iter().find(|d| d.device == report.verdict_device);
    let statistics = judged.is_some_and(|d| d.source == "the CUDA allocator's statistics");
    if statistics {
        assert!(report.findings.notes.iter().any(|n| n.contains("no sites can be named")), "{report}");
    }
    !statistics
}

/// Remembers a source line from inside a closure (`mark.set(line!())`), so
/// a test can check that a report names it.
#[derive(Default)]
pub struct LineMark(std::sync::atomic::AtomicU32);

impl LineMark {
    pub fn set(&self, line: u32) {
        self.0.store(line, std::sync::atomic::Ordering::Relaxed);
    }

    /// `tests/<file>:<line>` as reports show it.
    pub fn location(&self, file: &str) -> String {
        format!("{file}:{}", self.0.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// Defines `cpu::<scenario>` and `cuda::<scenario>` tests calling
/// `<scenario>(device)`; the CUDA ones skip (or fail, when CUDA is required)
/// without a GPU.
#[macro_export]
macro_rules! on_each_device {
    ($($scenario:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $scenario() { super::$scenario("cpu") } )*
        }
        mod cuda {
            $(
                #[test]
                fn $scenario() {
                    if super::common::cuda_device_or_skip(concat!("cuda::", stringify!($scenario))).is_some() {
                        super::$scenario("cuda")
                    }
                }
            )*
        }
    };
}

/// A scenario's device name (`cpu`, `cuda`, `cuda:N`) as the builder takes it.
pub fn device(name: &str) -> gpu_leak_test::settings::DeviceChoice {
    name.parse().unwrap_or_else(|why| panic!("{why}"))
}

/// A scenario's scope name (`thread`, `process`, `auto`) as the builder takes it.
pub fn scope(name: &str) -> gpu_leak_test::settings::Scope {
    name.parse().unwrap_or_else(|why| panic!("{why}"))
}

/// This test binary run with `args`, as a runner outside nextest runs it,
/// or (`nextest`) as nextest does, a process per test: the environment
/// either runner sets for the calling test is removed first.
pub fn run_this_binary(args: &[&str], nextest: bool) -> String {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command.args(args).env_remove("NEXTEST").env_remove("NEXTEST_EXECUTION_MODE").env_remove("RUST_TEST_THREADS");
    if nextest {
        command.env("NEXTEST", "1").env("NEXTEST_EXECUTION_MODE", "process-per-test");
    }
    let output = command.output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// Each of the `shapes::` tests named in a run's output: the first line of
/// its report where it failed (the line with `{failed} `shapes::NAME``),
/// else "passed" where libtest ran it and did not list it as failed.
pub fn shape_outcomes(
    names: impl IntoIterator<Item = &'static str>,
    output: &str,
    failed: &str,
) -> std::collections::BTreeMap<&'static str, String> {
    names
        .into_iter()
        .map(|name| {
            let headline = format!("{failed} `shapes::{name}`");
            let first = output.lines().find(|line| line.contains(&headline)).map(str::to_string);
            // With --nocapture the test's own output can come between
            // libtest's "test NAME ... " and its "ok".
            let ran = output.lines().any(|line| line.starts_with(&format!("test shapes::{name} ... ")));
            let listed_as_failed = output.lines().any(|line| line == format!("    shapes::{name}"));
            let passed = ran && !listed_as_failed;
            (name, first.unwrap_or_else(|| if passed { "passed".into() } else { format!("neither passed nor failed:\n{output}") }))
        })
        .collect()
}

/// The bytes of autograd's ready queue that a backward whose first node
/// makes `tasks` leaves' gradients ready at once keeps, on the thread of
/// `tracker`'s entered hook. The queue's blocks are told by their stacks,
/// not by bytes alone: beside other tests, a global table that rehashes on
/// this thread, or a block another thread frees a moment later, moves the
/// level too.
pub fn ready_queue_kept_by_a_wide_backward(tracker: &gpu_leak_test::internals::probe::Tracker, device: tch::Device, tasks: usize) -> u64 {
    use tch::{Kind, Tensor};
    let leaves: Vec<Tensor> = (0..tasks).map(|_| Tensor::zeros([1], (Kind::Float, device)).set_requires_grad(true)).collect();
    // A block recorded before, and freed while nothing recorded, would
    // still be listed.
    tracker.clear_recorded();
    tracker.start_recording_layers(1, true);
    let root = Tensor::stack(&leaves, 0).sum(Kind::Float);
    assert_eq!(Tensor::run_backward(&[root], &leaves, false, false).len(), tasks);
    tracker.stop_recording();
    let mut symbolizer = gpu_leak_test::internals::probe::Symbolizer::new();
    host_object_survivors(tracker, &mut symbolizer)
        .iter()
        .filter(|(_, frames)| frames.iter().any(|f| f.function.contains("ReadyQueue::push")))
        .map(|(survivor, _)| survivor.bytes)
        .sum()
}

/// The recorded blocks of libtorch's host objects that are still alive,
/// each with its frames named. A block freed while nothing recorded is
/// still listed: read while recording, or after `clear_recorded`.
pub fn host_object_survivors(
    tracker: &gpu_leak_test::internals::probe::Tracker,
    symbolizer: &mut gpu_leak_test::internals::probe::Symbolizer,
) -> Vec<(gpu_leak_test::internals::probe::LiveAllocation, Vec<gpu_leak_test::internals::probe::Frame>)> {
    use gpu_leak_test::report::Layer;
    tracker
        .recorded_survivors()
        .into_iter()
        .filter(|s| s.layer == Layer::HostObjects)
        .map(|s| {
            let frames = symbolizer.resolve(&s.stack);
            (s, frames)
        })
        .collect()
}
