//! A fast in-process stack walker for Linux x86-64: framehop's DWARF
//! unwinder over the `.eh_frame` sections of the loaded modules, with a
//! per-thread cache of unwind rules. Return addresses recur across the
//! allocations of a training step, so after the first few walks almost every
//! frame is a cache hit. libgcc's `_Unwind_Backtrace` (what `backtrace`
//! uses) parses the unwind tables again on every walk.
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Arc, RwLock};

type Walker = UnwinderX86_64<&'static [u8]>;

/// The unwinder for the modules loaded so far, and how many loads libc had
/// counted when it was built (`dlpi_adds`): a new `dlopen` means a rebuild.
struct Loaded {
    walker: Arc<Walker>,
    loads: u64,
}

static LOADED: RwLock<Option<Loaded>> = RwLock::new(None);

/// # Safety
/// The slice must lie in memory that stays mapped (a loaded module's
/// segments; modules are not unloaded while tests run).
unsafe fn memory(range: &Range<u64>) -> &'static [u8] {
    std::slice::from_raw_parts(range.start as *const u8, (range.end - range.start) as usize)
}

/// Reads the `.eh_frame` address from `.eh_frame_hdr` (version 1,
/// pointer encoded as in DWARF's `DW_EH_PE_*`).
fn eh_frame_start(hdr: &[u8], hdr_address: u64) -> Option<u64> {
    if hdr.len() < 8 || hdr[0] != 1 {
        return None;
    }
    let encoding = hdr[1];
    let field = &hdr[4..];
    let value = match encoding & 0x0f {
        0x0b => i32::from_le_bytes(field.get(..4)?.try_into().ok()?) as i64, // sdata4
        0x03 => u32::from_le_bytes(field.get(..4)?.try_into().ok()?) as i64, // udata4
        0x04 | 0x0c => i64::from_le_bytes(field.get(..8)?.try_into().ok()?), // (s|u)data8
        _ => return None,
    };
    match encoding & 0x70 {
        0x00 => Some(value as u64),                                  // absolute
        0x10 => Some((hdr_address as i64 + 4 + value) as u64),        // pc-relative
        0x30 => Some((hdr_address as i64 + value) as u64),            // data-relative to the header
        _ => None,
    }
}

fn build() -> Loaded {
    let (objects, loads) = super::objects::loaded_objects();
    let mut walker = Walker::new();
    for object in objects {
        let Some(hdr_range) = object.eh_frame_hdr.clone() else { continue };
        // SAFETY: program headers describe mapped memory of a loaded module.
        let hdr = unsafe { memory(&hdr_range) };
        let Some(eh_frame) = eh_frame_start(hdr, hdr_range.start) else { continue };
        if !(object.mapped.start..object.mapped.end).contains(&eh_frame) {
            continue;
        }
        // The section's length is not recorded; everything up to the end of
        // its segment is readable, and the header's table says where FDEs are.
        let eh_frame_range = eh_frame..object.mapped.end;
        let svma = |r: &Range<u64>| r.start - object.base..r.end - object.base;
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: object.text.as_ref().map(svma),
            // SAFETY: as above.
            text: object.text.as_ref().map(|r| unsafe { memory(r) }),
            eh_frame_svma: Some(svma(&eh_frame_range)),
            eh_frame: Some(unsafe { memory(&eh_frame_range) }),
            eh_frame_hdr_svma: Some(svma(&hdr_range)),
            eh_frame_hdr: Some(hdr),
            ..Default::default()
        };
        walker.add_module(Module::new(object.name.to_string_lossy().into_owned(), object.mapped.clone(), object.base, info));
    }
    Loaded { walker: Arc::new(walker), loads }
}

/// The walker for the modules loaded now, rebuilt after a `dlopen`.
fn walker() -> Arc<Walker> {
    let loads = loaded_objects_count();
    if let Some(loaded) = LOADED.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
        if loaded.loads == loads {
            return loaded.walker.clone();
        }
    }
    let mut slot = LOADED.write().unwrap_or_else(|e| e.into_inner());
    let fresh = build();
    let walker = fresh.walker.clone();
    *slot = Some(fresh);
    walker
}

/// libc's count of loads so far, read without walking every object.
fn loaded_objects_count() -> u64 {
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _: libc::size_t, data: *mut libc::c_void) -> libc::c_int {
        *(data as *mut u64) = (*info).dlpi_adds;
        1 // stop after the first object
    }
    let mut adds = 0u64;
    // SAFETY: the callback writes one u64.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut adds as *mut u64 as *mut libc::c_void) };
    adds
}

/// The calling thread's stack, for reads the walker may make.
fn stack_bounds() -> Range<u64> {
    thread_local! {
        static BOUNDS: Range<u64> = {
            // SAFETY: pthread_getattr_np fills `attr` for the calling thread.
            unsafe {
                let mut attr: libc::pthread_attr_t = std::mem::zeroed();
                let mut start: *mut libc::c_void = std::ptr::null_mut();
                let mut size: libc::size_t = 0;
                if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) == 0 {
                    libc::pthread_attr_getstack(&attr, &mut start, &mut size);
                    libc::pthread_attr_destroy(&mut attr);
                }
                start as u64..start as u64 + size as u64
            }
        };
    }
    BOUNDS.with(|b| b.clone())
}

/// framehop keeps 509 rules per cache, one slot per `address % 509`, and a
/// training step's allocations return through about 2,000 addresses of
/// libtorch's: one cache missed 6.5% of lookups, each a re-read of the
/// unwind tables. A bank of caches, picked by the address's next digits in
/// base 509, gives every address one of 509 x 32 slots.
const CACHE_BANKS: usize = 32;

/// The bank of caches, one per thread that captures stacks.
struct RuleCaches(Vec<CacheX86_64>);

impl RuleCaches {
    fn new() -> RuleCaches {
        RuleCaches((0..CACHE_BANKS).map(|_| CacheX86_64::new()).collect())
    }

    /// The cache that holds the rule of `address` (framehop's lookup address).
    fn for_address(&mut self, address: u64) -> &mut CacheX86_64 {
        &mut self.0[(address / 509 % CACHE_BANKS as u64) as usize]
    }
}

thread_local! {
    static CACHE: RefCell<RuleCaches> = RefCell::new(RuleCaches::new());
    /// Walks on this thread stop once they reach the frame whose stack lies
    /// above this address (see `stacks::stop_walks_here`).
    pub(crate) static BOUNDARY: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Walks the calling thread's stack into `ips` (innermost first, at most
/// `max_frames`). Returns false where it could not start, so the caller
/// can fall back to the slow walker.
#[inline(never)]
pub(crate) fn capture(ips: &mut Vec<usize>, max_frames: usize) -> bool {
    let (ip, sp, bp): (u64, u64, u64);
    // SAFETY: reads three registers, touches no memory.
    unsafe {
        std::arch::asm!(
            "lea {ip}, [rip]",
            "mov {sp}, rsp",
            "mov {bp}, rbp",
            ip = out(reg) ip,
            sp = out(reg) sp,
            bp = out(reg) bp,
            options(nomem, nostack, preserves_flags),
        );
    }
    let stack = stack_bounds();
    if !stack.contains(&sp) {
        return false;
    }
    let walker = walker();
    let boundary = BOUNDARY.with(|b| b.get());
    let mut read_stack = |address: u64| {
        if address % 8 == 0 && address >= sp && address + 8 <= stack.end {
            // SAFETY: inside this thread's stack, below its top.
            Ok(unsafe { std::ptr::read(address as *const u64) })
        } else {
            Err(())
        }
    };
    CACHE.with(|cache| {
        let Ok(mut cache) = cache.try_borrow_mut() else { return false };
        let mut regs = UnwindRegsX86_64::new(ip, sp, bp);
        let mut address = FrameAddress::from_instruction_pointer(ip);
        ips.push(ip as usize);
        while ips.len() < max_frames && regs.sp() <= boundary {
            let cache = cache.for_address(address.address_for_lookup());
            match walker.unwind_frame(address, &mut regs, cache, &mut read_stack) {
                Ok(Some(return_address)) => match FrameAddress::from_return_address(return_address) {
                    Some(next) => {
                        ips.push(return_address as usize);
                        address = next;
                    }
                    None => break,
                },
                Ok(None) | Err(_) => break,
            }
        }
        ips.len() > 2
    })
}

/// Rule-cache lookups of the calling thread's walker: (hits, misses by slot
/// collision, other misses). For benchmarks.
#[cfg(feature = "internals")]
pub(crate) fn cache_stats() -> (u64, u64, u64) {
    CACHE.with(|cache| {
        cache.borrow().0.iter().map(|bank| bank.stats()).fold((0, 0, 0), |(hits, wrong, other), stats| {
            (
                hits + stats.hit_count,
                wrong + stats.miss_wrong_address_count,
                other + stats.miss_empty_slot_count + stats.miss_wrong_modules_count,
            )
        })
    })
}
