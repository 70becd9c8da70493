#![doc = include_str!("../README.md")]
#![warn(missing_docs, unreachable_pub, unnameable_types)]
// The guide shows the `#[test]` a leak test expands into.
#![allow(clippy::test_attr_in_doctest)]
// The public API is the handful of names re-exported below. Everything else
// is private, or reachable through `internals` (unstable, for this crate's
// benches and probe tests) and `__private` (what the derive expands into).

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
mod threads;
mod verdict;

pub use attribution::{Attribution, Site};
pub use baseline::{BaselineMode, BaselineOutcome, BaselineStatus, FigureChange, Figures};
pub use probe::Frame;
pub use config::{Options, Plots, Settings, Suppression, CONFIG_FILE_NAME};
pub use error::{Error, InvalidValue, Result};
// The derive macro `TensorRefs` shares the trait's name, as serde's do.
pub use gpu_leak_test_macros::{gpu_leak_test, TensorRefs};
pub use layer::Layer;
pub use leak_test::{cuda_device_or_skip, LeakTest};
pub use refs::{watch, GraphRetention, Reference, TensorRefs};
pub use report::{DeviceResult, MemoryViews, Report};
pub use tch;
pub use threads::{current_test, detach_current_thread, TestThreads, ThreadGuard, ThreadLeftRunning};
pub use device::DeviceChoice;
pub use scope::Scope;
pub use verdict::{Leak, LeakRate, Phase, RetainedDuring, Verdict};

/// The measurement machinery: memory sources, stack capture, attribution.
/// Unstable: for this crate's benchmarks and probe tests, not for users.
// `path = "."` keeps the files where they are: src/probe/, src/device.rs.
#[doc(hidden)]
#[path = "."]
pub mod internals {
    pub mod attribution;
    pub mod device;
    pub mod probe;
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
