//! Memory outside libtorch's allocators, judged: device memory a test
//! allocates through the CUDA driver itself (as cudarc does), and pinned
//! host memory, kept or reused. Each scenario runs in both scopes; without
//! a GPU each test prints why it skips.
mod common;

use common::{cuda_device_or_skip, LineMark};
use gpu_leak_test::{report::Layer, Report, Verdict};
use std::cell::RefCell;
use std::ffi::{c_int, c_void, CString};
use tch::{Device, Kind, Tensor};

const FILE: &str = "tests/outside.rs";
const SCOPES: [&str; 2] = ["thread", "process"];
/// What each raw allocation asks the driver for.
const RAW_BYTES: usize = 4 << 20;

/// The CUDA driver, reached as a custom-kernel crate reaches it: dlopen and
/// dlsym, not through libtorch.
struct Driver {
    alloc: unsafe extern "C" fn(*mut u64, usize) -> c_int,
    free: unsafe extern "C" fn(u64) -> c_int,
    alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    free_host: unsafe extern "C" fn(*mut c_void) -> c_int,
    retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> c_int,
    set_current: unsafe extern "C" fn(*mut c_void) -> c_int,
}

impl Driver {
    fn load() -> Driver {
        let name = CString::new("libcuda.so.1").unwrap();
        // SAFETY: dlopen of the driver libtorch already loaded.
        let library = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
        assert!(!library.is_null(), "libcuda.so.1 is not loadable");
        // SAFETY: each symbol is the driver function of that C signature.
        unsafe {
            Driver {
                alloc: symbol(library, "cuMemAlloc_v2"),
                free: symbol(library, "cuMemFree_v2"),
                alloc_host: symbol(library, "cuMemAllocHost_v2"),
                free_host: symbol(library, "cuMemFreeHost"),
                retain: symbol(library, "cuDevicePrimaryCtxRetain"),
                set_current: symbol(library, "cuCtxSetCurrent"),
            }
        }
    }

    /// Makes cuda:index's primary context current on this thread, as
    /// cudarc's device handle does.
    fn bind(&self, index: usize) {
        let mut context = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context stays retained for the process.
        unsafe {
            assert_eq!((self.retain)(&mut context, index as c_int), 0);
            assert_eq!((self.set_current)(context), 0);
        }
    }

    fn device_block(&self, bytes: usize) -> u64 {
        let mut pointer = 0u64;
        // SAFETY: valid out-pointer, a current context (bind).
        assert_eq!(unsafe { (self.alloc)(&mut pointer, bytes) }, 0, "cuMemAlloc_v2 failed");
        pointer
    }

    fn host_block(&self, bytes: usize) -> *mut c_void {
        let mut pointer = std::ptr::null_mut();
        // SAFETY: valid out-pointer, a current context (bind).
        assert_eq!(unsafe { (self.alloc_host)(&mut pointer, bytes) }, 0, "cuMemAllocHost_v2 failed");
        pointer
    }
}

/// The CUDA device to test on, with the driver's calls counted (off by
/// default until verified on a GPU runner), or `None` after a skip line.
fn cuda_with_driver_calls(test: &str) -> Option<usize> {
    gpu_leak_test::internals::probe::driver::turn_on();
    cuda_device_or_skip(test)
}

/// The function `name` of `library`, as the pointer type `F`.
///
/// # Safety
/// `F` must be the function's own type.
unsafe fn symbol<F: Copy>(library: *mut c_void, name: &str) -> F {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    let symbol = CString::new(name).unwrap();
    // SAFETY: a valid handle and a NUL-terminated name.
    let found = unsafe { libc::dlsym(library, symbol.as_ptr()) };
    assert!(!found.is_null(), "the driver lacks {name}");
    // SAFETY: the caller names the function's type; sizes checked above.
    unsafe { std::mem::transmute_copy(&found) }
}

fn assert_leak_at(report: &Report, layer: Layer, line: &str) {
    assert!(matches!(report.verdict, Verdict::Leak(_)), "expected a leak:\n{report}");
    assert_eq!(report.verdict_layer, layer, "{report}");
    let top = report.top_site().unwrap_or_else(|| panic!("no allocation site:\n{report}"));
    let named = [top.location.as_deref(), top.called_from.as_deref()];
    assert!(named.contains(&Some(line)), "call site {line} not in {named:?}\n{report}");
}

/// Runs the iteration `setup` returns as a leak test on `cuda:index`, in
/// each scope, and checks each report; located at the caller.
#[track_caller]
fn in_each_scope<I: FnMut()>(name: &str, index: usize, mut setup: impl FnMut() -> I, mut check: impl FnMut(&str, &Report)) {
    for scope in SCOPES {
        let report = common::located(name)
            .device(Device::Cuda(index))
            .scope(common::scope(scope))
            .run_with_setup(|_| setup())
            .unwrap();
        println!("{report}\n");
        check(scope, &report);
    }
}

#[test]
fn raw_driver_allocations_kept_each_iteration_fail_naming_the_call() {
    let Some(index) = cuda_with_driver_calls("raw_driver_allocations_kept_each_iteration_fail_naming_the_call") else {
        return;
    };
    let driver = Driver::load();
    let (mark, kept) = (LineMark::default(), RefCell::new(Vec::new()));
    let keep = || {
        || {
            driver.bind(index);
            mark.set(line!() + 1);
            kept.borrow_mut().push(driver.device_block(RAW_BYTES));
        }
    };
    in_each_scope("raw_driver_allocations_kept", index, keep, |scope, report| {
        kept.borrow_mut().drain(..).for_each(|block| unsafe {
            (driver.free)(block);
        });
        assert_leak_at(report, Layer::OutsideLibtorch(Device::Cuda(index)), &mark.location(FILE));
        let Verdict::Leak(leak) = &report.verdict else { unreachable!() };
        assert_eq!(leak.bytes_per_iteration, RAW_BYTES as f64, "{report}");
        let judged = report.judged(Layer::OutsideLibtorch(Device::Cuda(index))).unwrap();
        assert!(judged.source.contains("CUPTI") || scope == "thread", "{report}");
        assert!(report.to_string().contains("outside libtorch"), "{report}");
        // The tensors of the device stay clean: the leak is not libtorch's.
        assert!(!report.judged(Layer::Tensors(Device::Cuda(index))).unwrap().verdict.is_failure(), "{report}");
    });
}

#[test]
fn raw_driver_allocations_freed_each_iteration_pass() {
    let Some(index) = cuda_with_driver_calls("raw_driver_allocations_freed_each_iteration_pass") else { return };
    let driver = Driver::load();
    let allocate_and_free = || {
        || {
            driver.bind(index);
            let block = driver.device_block(RAW_BYTES);
            let host = driver.host_block(64 << 10);
            // SAFETY: blocks this iteration allocated.
            unsafe {
                (driver.free)(block);
                (driver.free_host)(host);
            }
        }
    };
    in_each_scope("raw_driver_allocations_freed", index, allocate_and_free, |_, report| {
        assert!(report.passed(), "{report}");
        assert!(report.judged(Layer::OutsideLibtorch(Device::Cuda(index))).is_some(), "the layer is judged:\n{report}");
    });
}

#[test]
fn raw_pinned_host_blocks_kept_fail_on_the_cpu_outside_libtorch() {
    let Some(index) = cuda_with_driver_calls("raw_pinned_host_blocks_kept_fail_on_the_cpu_outside_libtorch") else {
        return;
    };
    let driver = Driver::load();
    let (mark, kept) = (LineMark::default(), RefCell::new(Vec::new()));
    let keep = || {
        || {
            driver.bind(index);
            mark.set(line!() + 1);
            kept.borrow_mut().push(driver.host_block(64 << 10));
        }
    };
    in_each_scope("raw_pinned_host_blocks_kept", index, keep, |_, report| {
        kept.borrow_mut().drain(..).for_each(|block| unsafe {
            (driver.free_host)(block);
        });
        assert_leak_at(report, Layer::OutsideLibtorch(Device::Cpu), &mark.location(FILE));
    });
}

#[test]
fn kept_pinned_copies_fail_naming_their_line() {
    let Some(index) = cuda_with_driver_calls("kept_pinned_copies_fail_naming_their_line") else { return };
    let device = Device::Cuda(index);
    let (mark, kept) = (LineMark::default(), RefCell::new(Vec::new()));
    let keep = || {
        || {
            let out = Tensor::randn([64, 256], (Kind::Float, device));
            mark.set(line!() + 1);
            kept.borrow_mut().push(out.to_device(Device::Cpu).pin_memory(device));
        }
    };
    in_each_scope("kept_pinned_copies", index, keep, |_, report| {
        kept.borrow_mut().clear();
        assert_leak_at(report, Layer::Tensors(Device::Cpu), &mark.location(FILE));
    });
}

#[test]
fn a_reused_pinned_staging_buffer_passes() {
    let Some(index) = cuda_with_driver_calls("a_reused_pinned_staging_buffer_passes") else { return };
    let device = Device::Cuda(index);
    let staged = || {
        let mut staging = Tensor::zeros([64, 256], (Kind::Float, Device::Cpu)).pin_memory(device);
        move || {
            let out = Tensor::randn([64, 256], (Kind::Float, device));
            staging.copy_(&out);
            // A fresh pinned copy dropped each step reuses the cached block.
            let _copy = out.to_device(Device::Cpu).pin_memory(device);
        }
    };
    in_each_scope("reused_pinned_staging", index, staged, |_, report| assert!(report.passed(), "{report}"));
}
