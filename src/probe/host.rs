//! The host heap: glibc's `mallinfo2`, the bytes malloc has handed out and
//! not had back, for the whole process. A view beside the tensor counts, not
//! a verdict: it sees every allocation of the process, Rust's and C++'s
//! (autograd's graph nodes are host objects), and the harness's own.

/// glibc's `struct mallinfo2` (every field a `size_t`).
#[repr(C)]
#[derive(Default)]
struct MallInfo2 {
    arena: usize,
    ordblks: usize,
    smblks: usize,
    hblks: usize,
    hblkhd: usize,
    usmblks: usize,
    fsmblks: usize,
    uordblks: usize,
    fordblks: usize,
    keepcost: usize,
}

type MallInfo2Fn = unsafe extern "C" fn() -> MallInfo2;

/// `mallinfo2`, looked up at run time: it exists from glibc 2.33 on, and a
/// binary that named it would not load on an older runner.
fn mallinfo2() -> Option<MallInfo2Fn> {
    static FUNCTION: std::sync::OnceLock<Option<MallInfo2Fn>> = std::sync::OnceLock::new();
    *FUNCTION.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name; a non-null result is the
        // function glibc documents with this signature.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"mallinfo2".as_ptr()) };
        (!symbol.is_null()).then(|| unsafe { std::mem::transmute::<*mut libc::c_void, MallInfo2Fn>(symbol) })
    })
}

/// Bytes of the host heap in use: small chunks from the arenas plus large
/// ones mapped on their own. `None` where the C library has no `mallinfo2`.
pub fn heap_in_use() -> Option<u64> {
    let function = mallinfo2()?;
    // SAFETY: mallinfo2 takes no arguments and returns the struct by value.
    let info = unsafe { function() };
    Some((info.uordblks + info.hblkhd) as u64)
}

/// Memory the kernel says a process can still take without swapping
/// (`MemAvailable` in /proc/meminfo); `None` where it does not say.
pub fn available_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
