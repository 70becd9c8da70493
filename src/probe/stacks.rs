//! Unresolved stacks captured at allocation time, resolved only when a
//! report needs them, and the rule that finds the user's frame in them.
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Deep enough to reach user code through libtorch's dispatcher and autograd
/// wrappers (typically 30 to 60 frames).
pub const DEFAULT_MAX_FRAMES: usize = 96;

/// Return addresses of one call stack, innermost first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Stack {
    ips: Box<[usize]>,
}

impl Stack {
    /// Captures up to `max_frames` return addresses of the calling thread,
    /// with the caching unwinder where there is one.
    #[inline(never)]
    pub fn capture(max_frames: usize) -> Stack {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        {
            // Walk into a buffer kept per thread, then copy out exactly the
            // frames found: one allocation per stack, not a grow and a shrink.
            thread_local! {
                static SCRATCH: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
            }
            let walked = SCRATCH.try_with(|scratch| {
                let mut ips = scratch.try_borrow_mut().ok()?;
                ips.clear();
                super::unwind::capture(&mut ips, max_frames).then(|| Stack { ips: Box::from(&ips[..]) })
            });
            if let Ok(Some(stack)) = walked {
                return stack;
            }
        }
        Self::capture_with_libgcc(max_frames)
    }

    /// Captures with libgcc's unwinder (through `backtrace`): slower, since
    /// it reads the unwind tables again for every frame, but available
    /// everywhere.
    #[inline(never)]
    pub fn capture_with_libgcc(max_frames: usize) -> Stack {
        let mut ips = Vec::with_capacity(max_frames.min(128));
        // SAFETY: trace_unsynchronized only requires that no other unwinding
        // runs concurrently on this thread, which a plain walk guarantees.
        unsafe {
            backtrace::trace_unsynchronized(|frame| {
                // The walk can end on a null return address.
                if !frame.ip().is_null() {
                    ips.push(frame.ip() as usize);
                }
                ips.len() < max_frames
            })
        };
        Stack { ips: ips.into_boxed_slice() }
    }

    #[cfg(feature = "internals")]
    pub fn from_ips(ips: Vec<usize>) -> Stack {
        Stack { ips: ips.into_boxed_slice() }
    }

    pub fn ips(&self) -> &[usize] {
        &self.ips
    }
}

/// Runs `f` with stack walks on this thread ending at this frame: the
/// frames further out (the harness, the test runner, thread start) are the
/// same for every allocation and never the user's, so walking them only
/// costs time.
#[inline(never)]
pub fn stop_walks_here<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    {
        let marker = 0u8;
        // An address inside this frame: frames of `f` lie below it.
        let here = std::hint::black_box(&marker) as *const u8 as u64;
        let previous = super::unwind::BOUNDARY.with(|b| b.replace(here));
        struct Restore(u64);
        impl Drop for Restore {
            fn drop(&mut self) {
                super::unwind::BOUNDARY.with(|b| b.set(self.0));
            }
        }
        let _restore = Restore(previous);
        f()
    }
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    f()
}

/// The caching unwinder's rule-cache counts on this thread: (hits, misses
/// from slot collisions, other misses). `None` where there is no caching
/// unwinder. For benchmarks and diagnosis.
#[cfg(feature = "internals")]
pub fn unwinder_cache_stats() -> Option<(u64, u64, u64)> {
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    return Some(super::unwind::cache_stats());
    #[allow(unreachable_code)]
    None
}

/// One resolved frame. Inlined functions give several frames per address.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Frame {
    /// Demangled, without the hash suffix.
    pub function: String,
    /// Its source file, where line tables say.
    pub file: Option<String>,
    /// Its line in that file.
    pub line: Option<u32>,
}

impl Frame {
    /// `file:line` where both are known.
    pub fn location(&self) -> Option<String> {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => Some(format!("{file}:{line}")),
            (Some(file), None) => Some(file.clone()),
            _ => None,
        }
    }
}

/// Resolves addresses to frames, caching each address: the stacks of one
/// report share most of their frames.
#[derive(Default)]
pub struct Symbolizer {
    cache: HashMap<usize, Arc<[Frame]>>,
}

impl Symbolizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Resolves at once every address of `stacks` that lies in a library
    /// without line tables (libtorch's, libc's), one pass over each such
    /// library's symbol table; [`Symbolizer::resolve`] then finds them
    /// cached. Call it with every stack a report will resolve.
    pub fn prepare<'s>(&mut self, stacks: impl IntoIterator<Item = &'s Stack>) {
        #[cfg(target_os = "linux")]
        {
            let mut wanted: Vec<usize> =
                stacks.into_iter().flat_map(|s| s.ips().iter().copied()).filter(|ip| !self.cache.contains_key(ip)).collect();
            wanted.sort_unstable();
            wanted.dedup();
            for (ip, name) in super::symbols::names_in_libraries_without_line_tables(&wanted) {
                let function = name.unwrap_or_else(|| format!("<unknown at {ip:#x}>"));
                self.cache.insert(ip, Arc::from([Frame { function, file: None, line: None }]));
            }
        }
        #[cfg(not(target_os = "linux"))]
        drop(stacks.into_iter());
    }

    pub fn resolve(&mut self, stack: &Stack) -> Vec<Frame> {
        stack.ips().iter().flat_map(|&ip| self.resolve_address(ip).iter().cloned().collect::<Vec<_>>()).collect()
    }

    fn resolve_address(&mut self, ip: usize) -> Arc<[Frame]> {
        self.cache
            .entry(ip)
            .or_insert_with(|| {
                let mut frames = Vec::new();
                backtrace::resolve(ip as *mut std::ffi::c_void, |symbol| {
                    frames.push(Frame {
                        function: symbol.name().map(|n| format!("{n:#}")).unwrap_or_else(|| "<unknown>".into()),
                        file: symbol.filename().map(|p| p.display().to_string()),
                        line: symbol.lineno(),
                    });
                });
                if frames.is_empty() {
                    frames.push(Frame { function: format!("<unknown at {ip:#x}>"), file: None, line: None });
                }
                frames.into()
            })
            .clone()
    }
}

/// Crates whose frames are never "the user's code": the standard library,
/// tch and torch-sys, the unwinder, test frameworks, and this crate.
const LIBRARY_PREFIXES: &[&str] = &[
    "std::",
    "core::",
    "alloc::",
    "tch::",
    "torch_sys::",
    "backtrace::",
    "gpu_leak_test::",
    "test::",
    "rstest::",
    "<tch::",
    "<core::",
    "<alloc::",
    "<std::",
    "<gpu_leak_test::",
    "__rust",
];

/// True for a source file of this crate (the harness itself).
pub fn is_own_source(file: &str) -> bool {
    file.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src/"))
        || file.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/csrc/"))
}

/// Frames without a source file (C++ libtorch without debug info, libc), in
/// the standard library, in a crate from a registry, or in this crate's own
/// sources, are library frames.
pub fn is_library_frame(frame: &Frame) -> bool {
    let Some(file) = frame.file.as_deref() else { return true };
    if LIBRARY_PREFIXES.iter().any(|prefix| frame.function.starts_with(prefix)) {
        return true;
    }
    file.starts_with("/rustc/")
        || file.contains("/.cargo/registry/")
        || file.contains("/.cargo/git/")
        || file.contains("/rustlib/src/")
        || is_own_source(file)
        || !(file.ends_with(".rs"))
}

/// The innermost frame of the user's code, where an allocation "happened"
/// from the user's point of view.
#[cfg(feature = "internals")]
pub fn first_user_frame(frames: &[Frame]) -> Option<&Frame> {
    frames.iter().find(|frame| !is_library_frame(frame))
}

/// True when the stack passes through libtorch's autograd engine, i.e. the
/// allocation was made by `backward()`.
pub fn is_inside_backward(frames: &[Frame]) -> bool {
    frames.iter().any(|frame| {
        frame.function.contains("torch::autograd::Engine")
            || frame.function.contains("torch::autograd::Node")
            || frame.function.contains("torch_sys::at_backward")
            || frame.function.contains("atg_backward")
            || frame.function.contains("at_run_backward")
            || frame.function.contains("tch::tensor::Tensor::backward")
            || frame.function.contains("tch::wrappers::tensor::Tensor::backward")
    })
}

/// Shows `file` relative to `root` where it lies under it.
pub fn relative_to(file: &str, root: &Path) -> String {
    Path::new(file).strip_prefix(root).map(|p| p.display().to_string()).unwrap_or_else(|_| file.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, file: Option<&str>) -> Frame {
        Frame { function: function.into(), file: file.map(Into::into), line: Some(7) }
    }

    #[test]
    fn user_frame_skips_libraries() {
        let frames = vec![
            frame("c10::alloc_cpu", None),
            frame("torch_sys::atg_add", Some("/root/.cargo/registry/src/x/torch-sys/src/lib.rs")),
            frame("tch::wrappers::tensor_generated::Tensor::g_add", Some("/root/.cargo/registry/src/x/tch/src/a.rs")),
            frame("core::ops::function::FnMut::call_mut", Some("/rustc/abc/library/core/src/ops/function.rs")),
            frame("gpu_leak_test::protocol::run", Some(concat!(env!("CARGO_MANIFEST_DIR"), "/src/protocol/mod.rs"))),
            frame("my_tests::leaks::{{closure}}", Some("/work/crate/tests/leaks.rs")),
            frame("my_tests::leaks", Some("/work/crate/tests/leaks.rs")),
        ];
        assert_eq!(first_user_frame(&frames).unwrap().function, "my_tests::leaks::{{closure}}");
    }

    #[test]
    fn no_user_frame_on_autograd_threads() {
        let frames = vec![frame("c10::cuda::alloc", None), frame("torch::autograd::Engine::thread_main", None)];
        assert!(first_user_frame(&frames).is_none());
        assert!(is_inside_backward(&frames));
    }

    #[test]
    fn the_caching_unwinder_finds_the_same_frames_as_libgcc() {
        #[inline(never)]
        fn both() -> (Stack, Stack) {
            (Stack::capture(DEFAULT_MAX_FRAMES), Stack::capture_with_libgcc(DEFAULT_MAX_FRAMES))
        }
        let (fast, slow) = both();
        let mut symbolizer = Symbolizer::new();
        let names = |stack: &Stack, symbolizer: &mut Symbolizer| -> Vec<String> {
            symbolizer.resolve(stack).into_iter().map(|f| f.function).collect()
        };
        let (fast, slow) = (names(&fast, &mut symbolizer), names(&slow, &mut symbolizer));
        // Both start inside their own capture function; from the caller on
        // they must agree frame for frame.
        let from_caller = |names: &[String]| names.iter().position(|n| n.contains("both")).map(|i| names[i..].to_vec());
        assert_eq!(from_caller(&fast), from_caller(&slow), "fast:\n{fast:#?}\nslow:\n{slow:#?}");
        assert!(from_caller(&fast).unwrap().len() > 5);
    }

    #[test]
    fn capture_and_resolve_finds_this_function() {
        #[inline(never)]
        fn here() -> Stack {
            Stack::capture(DEFAULT_MAX_FRAMES)
        }
        let stack = here();
        assert!(!stack.ips().is_empty());
        let frames = Symbolizer::new().resolve(&stack);
        assert!(
            frames.iter().any(|f| f.function.contains("capture_and_resolve_finds_this_function")),
            "{frames:#?}"
        );
    }
}
