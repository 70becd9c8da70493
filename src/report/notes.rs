//! What a run notes beside its verdict, as typed values; this file holds
//! their prose. The protocol decides which notes a report gets, and the
//! report keeps each as the sentence written here (the JSON's `notes`).
use crate::layer::Layer;
use crate::verdict::{GrowthEvidence, Phase};
use std::fmt;

/// One note of a run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Note {
    /// A CUDA body whose driver allocations outside libtorch were not
    /// followed.
    OutsideLibtorchNotJudged,
    /// Process scope while `cargo test` runs other tests beside this one.
    ProcessScopeBesideOtherTests,
    /// The counting CPU allocator could not be installed.
    CpuAllocatorNotCounted,
    /// The Rust heap was not followed: why, and what to do.
    RustHeapNotCounted { reason: String },
    /// How a layer was counted, where that limits what it can name.
    Coverage(String),
    /// Confirmation stopped early: one more iteration could run the machine
    /// out of memory.
    ConfirmationStopped { after: u32, layer: Layer, grew: u64, free: u64 },
    /// Which evidence decided a leak with no exact pattern.
    Evidence { layer: Layer, evidence: GrowthEvidence },
    /// The body failed during attribution; the leak verdict stands.
    AttributionStopped { label: &'static str, phase: Phase, iteration: u32, message: String },
    /// Host objects grew beside a tensor leak, and attribution stopped
    /// before it could tell whether they are the kept tensors' records.
    HostObjectsUnexplained { bytes_per_iteration: u64 },
    /// The body failed while finding where a peak over its baseline is
    /// reached.
    PeakSitesStopped { label: &'static str, iteration: u32 },
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use super::bytes;
        match self {
            Note::OutsideLibtorchNotJudged => write!(
                f,
                "memory allocated through the CUDA driver outside libtorch's allocators (a custom kernel's cuMemAlloc, \
                 a library's cudaHostAlloc) was not judged: {}=0 switches counting it off",
                crate::probe::driver::DRIVER_CALLS_VAR
            ),
            Note::ProcessScopeBesideOtherTests => f.write_str(
                "process scope under `cargo test`'s parallel threads: leak tests run one at a time, but other tests \
                 running meanwhile are counted too. Run with `--test-threads=1` or under `cargo nextest run` if a site \
                 below is not this test's.",
            ),
            Note::CpuAllocatorNotCounted => {
                f.write_str("the counting CPU allocator could not be installed: host memory was not counted")
            }
            Note::RustHeapNotCounted { reason } => write!(f, "Rust heap: not counted, because {reason}"),
            Note::Coverage(text) => f.write_str(text),
            Note::ConfirmationStopped { after, layer, grew, free } => write!(
                f,
                "confirmation stopped after {after} iterations: {layer} grew {} in its latest iteration, and {} is \
                 free there; the verdict stands on the iterations run",
                bytes(*grew),
                bytes(*free)
            ),
            Note::Evidence { layer, evidence } => write!(f, "{layer}: {}", evidence.describe()),
            Note::AttributionStopped { label, phase, iteration, message } => write!(
                f,
                "attribution stopped: the body failed ({label}) in {phase} iteration {iteration}: {message}; the leak \
                 verdict above was reached before it, and the sites are unknown"
            ),
            Note::HostObjectsUnexplained { bytes_per_iteration } => write!(
                f,
                "libtorch's host objects grew {} per iteration beside the tensors' leak; attribution stopped before it \
                 could tell whether that is the kept tensors' own records (TensorImpl, StorageImpl) or something more \
                 (a kept graph), so the tensors' leak is the verdict",
                bytes(*bytes_per_iteration)
            ),
            Note::PeakSitesStopped { label, iteration } => write!(
                f,
                "finding where the peak is reached stopped: the body failed ({label}) in attribution iteration {iteration}"
            ),
        }
    }
}
