//! Advice for the patterns people meet most, in the report's words. The
//! protocol decides; this file only says what a verdict usually means and
//! what to do.
use crate::layer::Layer;
use super::Report;
use crate::verdict::{RetainedDuring, Verdict};

/// Advice for the patterns people meet most.
pub(crate) fn for_report(report: &Report) -> Vec<String> {
    let mut hints = Vec::new();
    match &report.verdict {
        Verdict::Leak(_) => hints.extend(leak_hints(report)),
        Verdict::PeakOverBudget { .. } => hints.push(
            "the peak counts every tensor alive at once, activations saved for backward included. Evaluation without \
             `tch::no_grad(|| ...)` keeps activations alive until the output drops; smaller batches or freeing \
             intermediates early lowers it too."
                .into(),
        ),
        Verdict::PeakOverBaseline { figure, .. } => hints.push(peak_over_baseline_hint(report, figure)),
        Verdict::OutOfMemory { .. } => hints.push(
            "the views show what the device held at the failure: if `tensors alive` is small but reserved is large, \
             the allocator's cache is fragmented (try `cuda::empty_cache()` before the test or smaller batches); \
             if `tensors alive` is large, memory grew inside the test."
                .into(),
        ),
        Verdict::OneTimeRetention { during: RetainedDuring::WarmUp, .. } => hints.push(
            "warm-up kept memory once (optimizer state, cuBLAS workspaces, caches), then stayed flat: that is \
             state, not a leak."
                .into(),
        ),
        _ => {}
    }
    hints.extend(observation_hints(report));
    hints
}

/// What the sites of a leak usually mean: a kept graph, kept host objects,
/// or tensors kept across iterations.
fn leak_hints(report: &Report) -> Vec<String> {
    let mut hints = Vec::new();
    let sites: Vec<&crate::attribution::Site> = report
        .findings.attribution
        .iter()
        .flat_map(|a| &a.sites)
        .filter(|s| s.layer == report.verdict_layer)
        .collect();
    // Autograd's threads run backward() with no frame of the user's.
    if sites.iter().any(|s| s.allocated_by.inside_backward || (s.allocated_by.on_other_thread && s.location.is_none())) {
        hints.push(
            "some survivors were allocated inside backward(): a tensor you keep still holds its autograd \
             graph or gradients. Keep plain numbers (`loss.double_value(&[])`), or `detach()` / copy to the \
             CPU before keeping a tensor."
                .into(),
        );
    }
    if let Some(top) = sites.first() {
        hints.push(report.verdict_layer.kept_hint(top.location.as_deref().unwrap_or("the site above")));
    }
    hints
}

/// What the views beside the verdict show, whatever it is: growth the
/// counted threads do not explain, threads left running, the host heap, the
/// allocator's cache.
fn observation_hints(report: &Report) -> Vec<String> {
    let mut hints = Vec::new();
    for unexplained in &report.devices {
        if let Some(rate) = unexplained.unexplained_bytes_per_iteration {
            hints.push(format!(
                "on {} the process-wide count grew {} per iteration more than the threads this test counts: \
                 threads outside the test (a std::thread, a rayon pool, a tokio runtime's workers) likely keep \
                 tensors, or another test running at the same time does. Run in process scope (`scope = \"process\"`, \
                 the default under cargo nextest) to count every thread, or bring the threads in with \
                 `gpu_leak_test::threads::current_test()` (`.spawn(..)`, or `.attach_current_thread()` in a pool's start handler).",
                crate::layer::device_name(unexplained.device),
                super::bytes(rate.round().max(0.0) as u64),
            ));
        }
    }
    for thread in &report.findings.threads_left_running {
        hints.push(format!(
            "thread `{}` (id {}) started during this test and was still running at its end, holding {} in {} \
             block{} it allocated: a test owns the threads it starts. Join it (or stop its pool) before the test \
             returns; left running, it would keep allocating into whatever ran next in this process.",
            thread.name,
            thread.tid,
            super::bytes(thread.live_bytes),
            thread.live_blocks,
            if thread.live_blocks == 1 { "" } else { "s" }
        ));
    }
    // Where both of the host heap's layers are judged (libtorch's objects
    // and the Rust heap), the view adds nothing to their verdicts.
    let host_layers_judged = [Layer::HostObjects, Layer::RustHeap].iter().all(|&l| report.devices.iter().any(|d| d.layer == l));
    if let Some(rate) = report.figures.host_heap_growth_per_iteration.filter(|_| !host_layers_judged) {
        hints.push(format!(
            "tensor bytes stayed flat, but the host heap grew {} per iteration: something on the host piles up. \
             Usual causes: a tensor kept with its autograd graph (`total = total + loss` keeps every step's graph \
             nodes, which live on the host; keep `loss.double_value(&[])` or `detach()` it), or a Rust collection \
             that grows every iteration. This is a view of the whole process, not a verdict.",
            super::bytes(rate.round().max(0.0) as u64)
        ));
    }
    if let (Some(before), Some(after)) = (&report.figures.before, &report.figures.after) {
        if let (Some(b), Some(a)) = (before.reserved_bytes, after.reserved_bytes) {
            let reserved_growth = a as i64 - b as i64;
            if reserved_growth > 0 && after.live_bytes <= before.live_bytes {
                hints.push(
                    "reserved memory grew while tensors did not: the caching allocator keeps freed blocks for reuse. \
                     nvidia-smi shows this too; it is not a leak."
                        .into(),
                );
            }
        }
    }
    hints
}

/// Where the new peak is reached, by site, and what usually raises each
/// figure.
fn peak_over_baseline_hint(report: &Report, figure: &str) -> String {
    let site = report.findings.peak_sites.as_ref().and_then(|sites| sites.sites.first()).map(|top| {
        format!(
            "the biggest share of the peak, {} of it each iteration, is allocated at {}; ",
            super::bytes(top.survivors.bytes_per_iteration.round().max(0.0) as u64),
            top.location.as_deref().unwrap_or(&top.description)
        )
    });
    let usual = match figure {
        "after_warmup_bytes" => {
            "the level after warm-up is the model, the optimizer's state and caches: a bigger layer, a new parameter \
             group or optimizer state raises it."
        }
        _ => {
            "a peak is the activations saved for backward and the temporaries alive at once: a bigger batch or \
             hidden size, an output kept past its use, or evaluation without `tch::no_grad` raises it."
        }
    };
    format!("{}{usual}", site.unwrap_or_default())
}
