//! The loaded ELF objects, as the dynamic loader lists them: where each lies
//! in memory and which file it is. The caching unwinder builds its modules
//! from them, and symbol lookup finds the file an address belongs to.
use std::ops::Range;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One loaded ELF object, read from its program headers.
pub(crate) struct LoadedObject {
    /// The loader's name for it: a path, or empty for the main program.
    pub(crate) name: PathBuf,
    /// The load bias: an address in the file plus this is its address in memory.
    pub(crate) base: u64,
    /// From the lowest loaded segment's start to the highest one's end.
    pub(crate) mapped: Range<u64>,
    /// The executable segment.
    pub(crate) text: Option<Range<u64>>,
    /// `.eh_frame_hdr` (PT_GNU_EH_FRAME).
    pub(crate) eh_frame_hdr: Option<Range<u64>>,
}

impl LoadedObject {
    /// The file to read: the loader's path, or `/proc/self/exe` for the main program.
    pub(crate) fn file(&self) -> &Path {
        if self.name.as_os_str().is_empty() {
            Path::new("/proc/self/exe")
        } else {
            &self.name
        }
    }
}

/// Every loaded object, and the loader's count of loads so far
/// (`dlpi_adds`: it grows with every `dlopen`).
pub(crate) fn loaded_objects() -> (Vec<LoadedObject>, u64) {
    // SAFETY (the body): the loader passes a valid `dl_phdr_info` whose name
    // and program headers live for the call, and `data` is `found` below.
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        let found = &mut *(data as *mut (Vec<LoadedObject>, u64));
        let info = &*info;
        found.1 = info.dlpi_adds;
        let base = info.dlpi_addr;
        let headers = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
        let name = if info.dlpi_name.is_null() { c"" } else { std::ffi::CStr::from_ptr(info.dlpi_name) };
        let mut object = LoadedObject {
            name: PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())),
            base,
            // Empty until the loaded segments below widen it.
            mapped: Range { start: u64::MAX, end: 0 },
            text: None,
            eh_frame_hdr: None,
        };
        for h in headers {
            let range = base + h.p_vaddr..base + h.p_vaddr + h.p_memsz;
            match h.p_type {
                libc::PT_LOAD => {
                    object.mapped = object.mapped.start.min(range.start)..object.mapped.end.max(range.end);
                    if h.p_flags & libc::PF_X != 0 {
                        object.text = Some(range);
                    }
                }
                libc::PT_GNU_EH_FRAME => object.eh_frame_hdr = Some(range),
                _ => {}
            }
        }
        if object.mapped.start < object.mapped.end {
            found.0.push(object);
        }
        0
    }
    let mut found: (Vec<LoadedObject>, u64) = (Vec::new(), 0);
    // SAFETY: the callback only reads what the loader hands it.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut found as *mut _ as *mut libc::c_void) };
    found
}
