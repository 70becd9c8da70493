#![doc = include_str!("../README.md")]
#![warn(missing_docs, unreachable_pub, unnameable_types)]
// The guide shows the `#[test]` a leak test expands into.
#![allow(clippy::test_attr_in_doctest)]
// The root holds what a user writes or reads: the attribute, `LeakTest`,
// `Options`, `Report`, `Verdict`, the error, `TensorRefs`. What a report is
// made of is under `report`, the values options take under `settings`, and
// bringing threads into a test under `threads`. `internals` is for this
// crate's own tests and benches, behind a feature only they turn on;
// `__private` is what the macros expand into.

/// The guide's pages, compiled as doc tests so their examples cannot rot;
/// docs.rs shows the README, which links them.
#[cfg(doctest)]
mod guide {
    #[doc = include_str!("../docs/options.md")]
    struct Options;
    #[doc = include_str!("../docs/baselines.md")]
    struct Baselines;
    #[doc = include_str!("../docs/reports.md")]
    struct Reports;
    #[doc = include_str!("../docs/ci.md")]
    struct Ci;
    #[doc = include_str!("../docs/how-it-measures.md")]
    struct HowItMeasures;
    #[doc = include_str!("../docs/what-to-know.md")]
    struct WhatToKnow;
}

mod baseline;
mod config;
mod disk;
mod environment;
mod error;
mod isolation;
mod layer;
mod leak_test;
mod protocol;
mod refs;
pub mod report;
mod scope;
mod test_binary;
pub mod threads;
mod verdict;

pub use config::Options;
pub use error::{Error, Result};
// The derive macro `TensorRefs` shares the trait's name, as serde's do.
pub use gpu_leak_test_macros::{gpu_leak_test, TensorRefs};
pub use leak_test::LeakTest;
pub use refs::{watch, TensorRefs};
pub use report::Report;
/// The tch this crate is built with: the attribute's expansion names it,
/// and a test that names it gets the same one.
pub use tch;
pub use verdict::Verdict;

/// The Rust heap's count, in every test binary that links this crate: see
/// [`settings::RustHeap`] for a binary with an allocator of its own.
#[cfg(feature = "rust-heap")]
#[global_allocator]
static RUST_HEAP: layer::rust_heap::RustHeap = layer::rust_heap::RustHeap::new(std::alloc::System);

/// The values options take, the settings a test resolves to, the config
/// file's parts, and the allocator that counts the Rust heap.
pub mod settings {
    pub use crate::baseline::{BaselineMode, BaselineSettings};
    pub use crate::config::{Plots, Settings, Suppression, CONFIG_FILE_NAME};
    pub use crate::device::DeviceChoice;
    pub use crate::error::InvalidValue;
    pub use crate::layer::rust_heap::RustHeap;
    pub use crate::leak_test::cuda_device_or_skip;
    pub use crate::scope::Scope;
}

/// The measurement machinery: memory sources, stack capture, attribution.
/// Unstable: for this crate's benchmarks and probe tests, not for users,
/// and compiled only with the `internals` feature, which only they turn on.
// `path = "."` keeps the files where they are: src/probe/, src/device.rs.
#[cfg(feature = "internals")]
#[doc(hidden)]
#[path = "."]
pub mod internals {
    pub mod attribution;
    pub mod device;
    pub mod probe;
    /// Switches that make a layer's sources blind, for the "cannot
    /// measure" tests and the benchmark's variants without a layer.
    pub mod switches {
        pub use crate::layer::host_objects::switch_off_host_objects;
        pub use crate::layer::rust_heap::switch_off_rust_heap;
        pub use crate::layer::tensors::switch_off;
    }
    /// A layer's canary run on its own, for the tests of the canary.
    pub mod canaries {
        pub use crate::layer::rust_heap::rust_heap_canary;
    }
}
#[cfg(not(feature = "internals"))]
#[path = "."]
// Their items are `pub` for the feature's build, unreachable without it.
#[allow(unreachable_pub)]
mod internals {
    pub(crate) mod attribution;
    pub(crate) mod device;
    pub(crate) mod probe;
}
use internals::{attribution, device, probe};

/// What `#[gpu_leak_test]` and `#[derive(TensorRefs)]` expand into. Not a
/// public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::refs::with_suffix;

    /// A text value of the attribute as its option's field type takes it.
    /// The attribute checked the text with the same rule at compile time,
    /// so parsing cannot fail here.
    pub fn checked_text<T: std::str::FromStr>(text: &str) -> T
    where
        T::Err: std::fmt::Debug,
    {
        text.parse().expect("#[gpu_leak_test] checked this value at compile time")
    }
}
