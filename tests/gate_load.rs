//! A synthetic GPU gate: 48 CUDA leak tests of about a second each, to time
//! the gate on one GPU against several (`device = "auto"` spreads nextest's
//! slots over the GPUs). Ignored by default: run them on a GPU runner with
//!
//!     cargo nextest run --run-ignored only -E 'binary(gate_load)' --test-threads 8
//!
//! On a machine without CUDA they skip (or fail, with
//! GPU_LEAK_TEST_REQUIRE_CUDA=1).
use gpu_leak_test::LeakTest;
use tch::{Kind, Tensor};

/// A few large matmuls per iteration: work that keeps one GPU busy for
/// about a second over warm-up and measured iterations, and keeps nothing.
fn gate_load(name: &str) {
    if gpu_leak_test::settings::cuda_device_or_skip(name).is_none() {
        return;
    }
    LeakTest::new(name).device(gpu_leak_test::settings::DeviceChoice::Auto).check_with_setup(|device| {
        let a = Tensor::randn([8192, 8192], (Kind::Float, device));
        move || {
            let mut total = 0.0;
            for _ in 0..6 {
                total += a.matmul(&a).mean(Kind::Float).double_value(&[]);
            }
            std::hint::black_box(total);
        }
    });
}

macro_rules! gate_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            #[ignore = "a load for timing the GPU gate; run with --run-ignored only"]
            fn $name() {
                gate_load(stringify!($name))
            }
        )*
    };
}

gate_tests!(
    load_01, load_02, load_03, load_04, load_05, load_06, load_07, load_08, load_09, load_10, load_11, load_12,
    load_13, load_14, load_15, load_16, load_17, load_18, load_19, load_20, load_21, load_22, load_23, load_24,
    load_25, load_26, load_27, load_28, load_29, load_30, load_31, load_32, load_33, load_34, load_35, load_36,
    load_37, load_38, load_39, load_40, load_41, load_42, load_43, load_44, load_45, load_46, load_47, load_48,
);
