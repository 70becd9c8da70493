//! The probes on the CPU: these run in CI.
mod common;

use gpu_leak_test::internals::probe::{cuda, stacks, Symbolizer, Tracker};
use gpu_leak_test::Error;
use std::sync::{Arc, Barrier};
use tch::{Device, Kind, Tensor};

#[test]
fn hook_sees_cpu_allocations_and_frees_with_exact_sizes() {
    let tracker = Tracker::new();
    let before = tracker.view(Device::Cpu);
    {
        let _hook = tracker.enter().unwrap();
        let a = Tensor::zeros([1000], (Kind::Float, Device::Cpu));
        assert_eq!(tracker.live_bytes(Device::Cpu) - before.live_bytes, 4_000);
        let b = Tensor::zeros([10, 10], (Kind::Double, Device::Cpu));
        assert_eq!(tracker.live_bytes(Device::Cpu) - before.live_bytes, 4_800);
        drop(a);
        assert_eq!(tracker.live_bytes(Device::Cpu) - before.live_bytes, 800);
        drop(b);
    }
    let after = tracker.view(Device::Cpu);
    assert_eq!(after.live_bytes, before.live_bytes);
    assert_eq!(after.allocations - before.allocations, 2);
    assert_eq!(after.frees - before.frees, 2);
    assert_eq!(after.peak_bytes, 4_800);
}

#[test]
fn allocations_on_a_thread_without_the_hook_are_not_counted() {
    let tracker = Tracker::new();
    let _hook = tracker.enter().unwrap();
    let kept = std::thread::spawn(|| {
        let t = Tensor::zeros([4096], (Kind::Float, Device::Cpu));
        t.sum(Kind::Float).double_value(&[])
    })
    .join()
    .unwrap();
    assert_eq!(kept, 0.0);
    assert_eq!(tracker.view(Device::Cpu).allocations, 0);
    assert_eq!(tracker.live_bytes(Device::Cpu), 0);
}

#[test]
fn two_threads_with_hooks_count_independently() {
    let barrier = Arc::new(Barrier::new(2));
    let run = |elements: i64, barrier: Arc<Barrier>| {
        std::thread::spawn(move || {
            let tracker = Tracker::new();
            let _hook = tracker.enter().unwrap();
            let mut kept = Vec::new();
            for _ in 0..50 {
                barrier.wait();
                kept.push(Tensor::ones([elements], (Kind::Float, Device::Cpu)));
            }
            tracker.live_bytes(Device::Cpu)
        })
    };
    let small = run(10, barrier.clone());
    let large = run(1000, barrier);
    assert_eq!(small.join().unwrap(), 50 * 40);
    assert_eq!(large.join().unwrap(), 50 * 4000);
}

#[test]
fn a_tracker_entered_on_a_helper_thread_counts_its_allocations() {
    let tracker = Tracker::new();
    let helper = tracker.clone();
    let kept = std::thread::spawn(move || {
        let _hook = helper.enter().unwrap();
        Tensor::zeros([256], (Kind::Float, Device::Cpu))
    })
    .join()
    .unwrap();
    assert_eq!(tracker.live_bytes(Device::Cpu), 1024);
    assert_eq!(tracker.allocations_on_other_threads(), 1);
    drop(kept);
}

#[test]
fn stack_capture_names_this_file_and_line() {
    let tracker = Tracker::new();
    let _hook = tracker.enter().unwrap();
    tracker.start_recording(7);
    let expected_line = line!() + 1;
    let kept = Tensor::zeros([333], (Kind::Float, Device::Cpu));
    let dropped = Tensor::zeros([5], (Kind::Float, Device::Cpu));
    drop(dropped);
    tracker.stop_recording();

    // The kept tensor's own records survive with it, in libtorch's host objects.
    let survivors: Vec<_> = tracker.recorded_survivors().into_iter().filter(|s| s.layer != gpu_leak_test::report::Layer::HostObjects).collect();
    assert_eq!(survivors.len(), 1, "only the kept tensor survives: {survivors:?}");
    let survivor = &survivors[0];
    assert_eq!((survivor.bytes, survivor.tag, survivor.on_owner_thread), (1332, 7, true));
    let frames = Symbolizer::new().resolve(&survivor.stack);
    let user = stacks::first_user_frame(&frames).unwrap_or_else(|| panic!("no user frame in {frames:#?}"));
    let location = user.location().unwrap();
    assert!(location.ends_with(&format!("tests/probe_cpu.rs:{expected_line}")), "{location}\n{frames:#?}");
    assert!(user.function.contains("stack_capture_names_this_file_and_line"), "{}", user.function);
    drop(kept);
}

#[test]
fn backward_on_cpu_is_seen_and_recognised() {
    let tracker = Tracker::new();
    let _hook = tracker.enter().unwrap();
    let w = Tensor::randn([64, 64], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let x = Tensor::randn([8, 64], (Kind::Float, Device::Cpu));
    let loss = x.matmul(&w).relu().sum(Kind::Float);
    tracker.start_recording(1);
    loss.backward();
    tracker.stop_recording();
    // The gradient of w outlives backward() and was allocated inside it.
    let survivors = tracker.recorded_survivors();
    let mut symbolizer = Symbolizer::new();
    assert!(
        survivors.iter().any(|s| s.bytes == 64 * 64 * 4 && stacks::is_inside_backward(&symbolizer.resolve(&s.stack))),
        "{:#?}",
        survivors.iter().map(|s| (s.bytes, symbolizer.resolve(&s.stack))).collect::<Vec<_>>()
    );
}

#[test]
fn cuda_queries_without_cuda_return_the_error_not_a_panic() {
    if cuda::is_available() {
        eprintln!("skipped cuda_queries_without_cuda_return_the_error_not_a_panic: this machine has CUDA");
        return;
    }
    assert_eq!(cuda::device_count(), 0);
    let no_cuda = |e: Error| {
        assert!(matches!(e, Error::NoCudaDevice { .. }), "{e:?}");
        assert!(e.to_string().starts_with("no CUDA device"), "{e}");
    };
    no_cuda(cuda::allocator_stats(0).unwrap_err());
    no_cuda(cuda::driver_memory(0).unwrap_err());
    no_cuda(cuda::synchronize(0).unwrap_err());
    no_cuda(cuda::reset_peak_stats(0).unwrap_err());
    no_cuda(cuda::empty_cache().unwrap_err());
    no_cuda(cuda::clear_cublas_workspaces().unwrap_err());
    no_cuda(cuda::check_device(3).unwrap_err());
}

#[test]
fn frees_of_tensors_from_before_the_tracker_are_not_counted() {
    // Made under another tracker, so libtorch knows its size and reports
    // its free to whichever hook is current then.
    let old = {
        let earlier = Tracker::new();
        let _hook = earlier.enter().unwrap();
        Tensor::zeros([512], (Kind::Float, Device::Cpu))
    };
    let tracker = Tracker::new();
    let _hook = tracker.enter().unwrap();
    drop(old);
    assert_eq!(tracker.live_bytes(Device::Cpu), 0);
    assert_eq!(tracker.foreign_frees(), 1);
    let new = Tensor::zeros([8], (Kind::Float, Device::Cpu));
    assert_eq!(tracker.live_bytes(Device::Cpu), 32);
    drop(new);
    assert_eq!(tracker.view(Device::Cpu).frees, 1);
}

/// C++ operator new and delete, called by their Itanium names, as
/// libtorch's compiled code calls them: the shim's replacements.
mod cxx {
    use std::ffi::c_void;
    extern "C" {
        #[link_name = "_Znwm"]
        pub fn new(bytes: usize) -> *mut c_void;
        #[link_name = "_ZnwmSt11align_val_t"]
        pub fn new_aligned(bytes: usize, align: usize) -> *mut c_void;
        #[link_name = "_ZdlPv"]
        pub fn delete(ptr: *mut c_void);
        #[link_name = "_ZdlPvm"]
        pub fn delete_sized(ptr: *mut c_void, bytes: usize);
        #[link_name = "_ZdlPvSt11align_val_t"]
        pub fn delete_aligned(ptr: *mut c_void, align: usize);
        #[link_name = "_ZdlPvmSt11align_val_t"]
        pub fn delete_sized_aligned(ptr: *mut c_void, bytes: usize, align: usize);
    }
}

/// autograd's ready queue is a heap in a vector that never shrinks: the
/// first backward in which more tasks wait in it than ever before keeps a
/// bigger one, a one-off of host objects that can land in a measured
/// iteration. Grown beforehand, as the prewarm grows a CUDA device's, it
/// keeps nothing. On the CPU the queue is the calling thread's own, so
/// each run is on a thread of its own.
#[test]
fn a_ready_queue_grown_beforehand_keeps_nothing_when_a_backward_fills_it() {
    let kept_on_a_thread_of_its_own = |grown: bool| {
        std::thread::spawn(move || {
            let tracker = Tracker::new();
            let _hook = tracker.enter().unwrap();
            // The thread's queue made, and every op's first call done.
            common::ready_queue_kept_by_a_wide_backward(&tracker, Device::Cpu, 2);
            if grown {
                cuda::grow_autograd_ready_queue(Device::Cpu, 64).unwrap();
            }
            common::ready_queue_kept_by_a_wide_backward(&tracker, Device::Cpu, 24)
        })
        .join()
        .unwrap()
    };
    // From room for 2 tasks to room for 32: 4,360 B on libtorch 2.11.
    let kept = kept_on_a_thread_of_its_own(false);
    assert!(kept >= 32 * 32, "the queue's growth is the mechanism this guards against: {kept} B kept");
    assert_eq!(kept_on_a_thread_of_its_own(true), 0, "a queue grown to 64 tasks beforehand grew again");
}

/// The mechanism, on a thread of its own in a process of its own (no other
/// hooked thread in it to fill the table meanwhile); the test below runs it.
mod cpu_size_table {
    use super::*;
    use gpu_leak_test::internals::probe::hook;
    use gpu_leak_test::report::Layer;

    /// The host objects a hooked thread keeps after holding `blocks` CPU
    /// blocks at once and freeing them all.
    fn kept_by_holding(blocks: usize) -> i64 {
        std::thread::spawn(move || {
            let tracker = Tracker::new();
            let _hook = tracker.enter().unwrap();
            // The op's first call made.
            drop(Tensor::empty([1], (Kind::Uint8, Device::Cpu)));
            let before = tracker.layer_view(Layer::HostObjects).live_bytes;
            let held: Vec<Tensor> = (0..blocks).map(|_| Tensor::empty([1], (Kind::Uint8, Device::Cpu))).collect();
            drop(held);
            tracker.layer_view(Layer::HostObjects).live_bytes - before
        })
        .join()
        .unwrap()
    }

    #[test]
    #[ignore = "run alone by a_cpu_size_table_grown_beforehand_keeps_nothing_when_blocks_fill_it"]
    fn alone() {
        // The process's first thread-scope leak test grows the table to 8,192
        // blocks.
        let report = common::located("cpu_size_table")
            .device(common::device("cpu"))
            .scope(common::scope("thread"))
            .run(|_| drop(Tensor::ones([4], (Kind::Float, Device::Cpu))))
            .unwrap();
        assert!(report.passed(), "{report}");
        assert_eq!(kept_by_holding(4_096), 0, "the table grew after a leak test's prewarm");
        // 16,384 records need as many buckets (8 B each), and the last
        // growth's array is the hooked thread's to keep.
        let kept = kept_by_holding(16_384);
        assert!(kept >= 16_384 * 8, "the table's growth is the mechanism this guards against: {kept} B kept");
        hook::grow_cpu_size_table(65_536).unwrap();
        assert_eq!(kept_by_holding(32_768), 0, "a table grown to 65,536 blocks beforehand grew again");
    }
}

/// libtorch records each CPU block a hooked thread allocates in one table
/// for the whole process, whose bucket array never shrinks: the insert
/// that finds it full keeps a bigger one, on whichever hooked thread makes
/// it, though other threads' blocks filled it (the host-objects "leak"
/// that turned CI red once). Grown beforehand, as a leak test's prewarm
/// grows it, it keeps nothing.
#[test]
fn a_cpu_size_table_grown_beforehand_keeps_nothing_when_blocks_fill_it() {
    let output = common::run_this_binary(&["cpu_size_table::alone", "--exact", "--ignored"], false);
    assert!(output.contains("test result: ok. 1 passed"), "{output}");
}

/// The drain a leak test runs before each sample on a CUDA runner (the
/// host-objects layer's `settle`) is a backward of its own on the calling
/// thread: it must run one (libtorch's host objects come and go), keep
/// nothing, and leave the body's own graph to the body.
#[test]
fn draining_a_threads_ready_queue_keeps_nothing_and_leaves_a_kept_graph_alone() {
    use gpu_leak_test::report::Layer;
    std::thread::spawn(|| {
        let tracker = Tracker::new();
        let _hook = tracker.enter().unwrap();
        let x = Tensor::ones([4], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let kept = (&x * 2).sum(Kind::Float);
        // The thread's queue made, and every op's first call done.
        cuda::drain_autograd_ready_queue().unwrap();
        let before = tracker.layer_view(Layer::HostObjects);
        for _ in 0..10 {
            cuda::drain_autograd_ready_queue().unwrap();
        }
        let after = tracker.layer_view(Layer::HostObjects);
        assert!(after.allocations - before.allocations >= 10, "the drain ran no backward: {before:?} -> {after:?}");
        assert_eq!(after.live_bytes, before.live_bytes, "ten drains kept host objects");
        let grads = Tensor::run_backward(&[kept], &[&x], false, false);
        assert_eq!(Vec::<f32>::try_from(&grads[0]).unwrap(), vec![2.0; 4], "the kept graph was not the body's any more");
    })
    .join()
    .unwrap();
}

/// A sized delete finds its block's mark from the size it is given, an
/// unsized one asks malloc: every size, the odd ones whose mark is the
/// signpost's own place, blocks malloc maps on their own, and aligned ones,
/// each counted at its usable size and given back to the byte.
#[test]
fn host_objects_of_every_size_count_exactly_whichever_delete_frees_them() {
    use gpu_leak_test::report::Layer;
    let sizes: Vec<usize> = (0..=1100).chain([4093, 65_536, 200_000, 1 << 21]).collect();
    let tracker = Tracker::new();
    let _hook = tracker.enter().unwrap();
    let before = tracker.layer_view(Layer::HostObjects);
    let mut blocks = Vec::with_capacity(2 * sizes.len());
    for (i, &bytes) in sizes.iter().enumerate() {
        // SAFETY: plain allocations, each freed below by a delete of its form.
        let (plain, aligned) = unsafe { (cxx::new(bytes), cxx::new_aligned(bytes, 64)) };
        assert!(!plain.is_null() && !aligned.is_null());
        blocks.push((plain, bytes, None, i));
        blocks.push((aligned, bytes, Some(64), i));
    }
    // SAFETY: each pointer is a live block from the shim's operator new.
    let usable: i64 = blocks.iter().map(|&(ptr, ..)| unsafe { libc::malloc_usable_size(ptr) } as i64).sum();
    let grown = tracker.layer_view(Layer::HostObjects);
    assert_eq!(grown.live_bytes - before.live_bytes, usable);
    assert_eq!(grown.allocations - before.allocations, blocks.len() as u64);
    for &(ptr, bytes, align, i) in &blocks {
        // SAFETY: each block freed once, with the size and alignment it was
        // allocated with; a third of them without the size.
        unsafe {
            match (align, i % 3 == 0) {
                (None, true) => cxx::delete(ptr),
                (None, false) => cxx::delete_sized(ptr, bytes),
                (Some(align), true) => cxx::delete_aligned(ptr, align),
                (Some(align), false) => cxx::delete_sized_aligned(ptr, bytes, align),
            }
        }
    }
    let after = tracker.layer_view(Layer::HostObjects);
    assert_eq!(after.live_bytes, before.live_bytes, "every block given back to the byte");
    assert_eq!(after.frees - before.frees, blocks.len() as u64);
}
