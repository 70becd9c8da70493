//! gpu-leak-test: make GPU (and CPU) memory leaks in libtorch code fail
//! `cargo test`, with a report that names the allocation site.
//!
//! ```ignore
//! use gpu_leak_test::gpu_leak_test;
//!
//! #[gpu_leak_test(threshold_mb = 0.0)]
//! fn training_step_keeps_nothing(device: tch::Device) -> impl FnMut() {
//!     let vs = tch::nn::VarStore::new(device);
//!     // ... build the model and optimizer once ...
//!     move || { /* one training step */ }
//! }
//! ```
//!
//! The verdict comes from libtorch's per-thread allocation hook: every
//! allocation and free the test's threads make, counted exactly, so the
//! caching allocator, cuBLAS workspaces and lazy initialisation cannot fool
//! it. The allocator's and the driver's views are shown beside it.
pub mod attribution;
pub mod config;
pub mod device;
pub mod error;
mod ffi;
pub mod probe;
pub mod protocol;
pub mod refs;
pub mod report;
mod leak_test;
pub mod scope;
mod threads;
pub mod verdict;

pub use config::{Options, Settings};
pub use device::DeviceChoice;
pub use error::{Error, Result};
// The derive macro `TensorRefs` shares the trait's name, as serde's do.
pub use gpu_leak_test_macros::{gpu_leak_test, TensorRefs};
pub use leak_test::{cuda_device_or_skip, LeakTest};
pub use refs::{watch, TensorRefs};
pub use report::Report;
pub use threads::{current_test, detach_current_thread, TestThreads, ThreadGuard};
pub use tch;
pub use verdict::Verdict;

