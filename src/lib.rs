//! gpu-leak-test: make GPU (and CPU) memory leaks in libtorch code fail
//! `cargo test`, with a report that names the allocation site.
pub mod config;
pub mod error;
mod ffi;
pub mod probe;

pub use error::{Error, Result};
pub use tch;
