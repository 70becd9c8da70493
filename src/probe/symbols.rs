//! Function names for addresses in loaded libraries that carry no line
//! tables (libtorch's, libc's, libstdc++'s), read from their ELF symbol
//! tables: one pass per library for every address a report needs, reading
//! only the names it matched.
//!
//! `backtrace` parses and sorts a library's whole symbol table before its
//! first lookup: `libtorch_cpu.so` has 554,000 symbols and 80 MB of names,
//! which cost 0.6 s on the CPU CI machine (`libtorch_cuda.so` as much again
//! on a GPU runner), paid by every failing test that runs in a process of
//! its own. Libraries with line tables (the test binary: your code, this
//! crate, the shim) still go through `backtrace`, for `file:line`.
use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// One section header, the fields used here.
struct Section {
    name: u32,
    kind: u32,
    offset: u64,
    size: u64,
    link: u32,
}

const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;
const SYMBOL_SIZE: usize = 24;

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap())
}
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// A 64-bit little-endian ELF file's sections.
struct Elf {
    file: File,
    sections: Vec<Section>,
    section_names: Vec<u8>,
}

impl Elf {
    fn open(path: &std::path::Path) -> Option<Elf> {
        let file = File::open(path).ok()?;
        let mut header = [0u8; 64];
        file.read_exact_at(&mut header, 0).ok()?;
        // \x7fELF, 64-bit, little-endian.
        if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
            return None;
        }
        let (offset, entry_size) = (u64_at(&header, 0x28), u16_at(&header, 0x3a) as usize);
        let (count, names_index) = (u16_at(&header, 0x3c) as usize, u16_at(&header, 0x3e) as usize);
        if entry_size < 64 || count == 0 || names_index >= count {
            return None;
        }
        let mut table = vec![0u8; entry_size * count];
        file.read_exact_at(&mut table, offset).ok()?;
        let sections: Vec<Section> = table
            .chunks_exact(entry_size)
            .map(|h| Section { name: u32_at(h, 0), kind: u32_at(h, 4), offset: u64_at(h, 24), size: u64_at(h, 32), link: u32_at(h, 40) })
            .collect();
        let names = &sections[names_index];
        let mut section_names = vec![0u8; names.size as usize];
        file.read_exact_at(&mut section_names, names.offset).ok()?;
        Some(Elf { file, sections, section_names })
    }

    fn section_name(&self, section: &Section) -> &[u8] {
        let start = (section.name as usize).min(self.section_names.len());
        let end = self.section_names[start..].iter().position(|&b| b == 0).map_or(self.section_names.len(), |n| start + n);
        &self.section_names[start..end]
    }

    /// Line tables mean `backtrace` can give `file:line` here.
    fn has_line_tables(&self) -> bool {
        self.sections.iter().any(|s| matches!(self.section_name(s), b".debug_line" | b".zdebug_line"))
    }

    /// The NUL-terminated string at `offset` of string table `table`.
    fn string(&self, table: &Section, offset: u32) -> Option<Vec<u8>> {
        let mut name = Vec::new();
        let mut at = table.offset + offset as u64;
        let end = table.offset + table.size;
        let mut chunk = [0u8; 256];
        while at < end {
            let length = chunk.len().min((end - at) as usize);
            self.file.read_exact_at(&mut chunk[..length], at).ok()?;
            match chunk[..length].iter().position(|&b| b == 0) {
                Some(nul) => {
                    name.extend_from_slice(&chunk[..nul]);
                    return Some(name);
                }
                None => name.extend_from_slice(&chunk[..length]),
            }
            at += length as u64;
        }
        None
    }

    /// For each of `wanted` (link-time addresses, sorted), the name of the
    /// function symbol whose range holds it, the tightest where symbols
    /// overlap (aliases, a function inside a bigger one): one pass over the
    /// symbol table (the full one where the file has it, else the dynamic
    /// one), matched in the shim, which is optimised in every profile.
    fn function_names(&self, wanted: &[u64]) -> HashMap<u64, String> {
        let table = self
            .sections
            .iter()
            .find(|s| s.kind == SHT_SYMTAB)
            .or_else(|| self.sections.iter().find(|s| s.kind == SHT_DYNSYM));
        let Some(table) = table else { return HashMap::new() };
        let Some(strings) = self.sections.get(table.link as usize) else { return HashMap::new() };
        // Each wanted address's tightest symbol so far: its size and name.
        let mut best_sizes = vec![u64::MAX; wanted.len()];
        let mut best_names = vec![0u32; wanted.len()];
        // Read the table in pieces: it can be tens of megabytes.
        const CHUNK_SYMBOLS: usize = 1 << 16;
        let mut chunk = vec![0u8; CHUNK_SYMBOLS * SYMBOL_SIZE];
        let mut at = table.offset;
        let end = table.offset + table.size;
        while at + SYMBOL_SIZE as u64 <= end {
            let length = (chunk.len() as u64).min(end - at) as usize / SYMBOL_SIZE * SYMBOL_SIZE;
            if self.file.read_exact_at(&mut chunk[..length], at).is_err() {
                break;
            }
            match_function_symbols(&chunk[..length], wanted, &mut best_sizes, &mut best_names);
            at += length as u64;
        }
        wanted
            .iter()
            .zip(best_sizes.iter().zip(&best_names))
            .filter(|(_, (&size, _))| size != u64::MAX)
            .filter_map(|(&address, (_, &name))| Some((address, demangle(&self.string(strings, name)?))))
            .collect()
    }
}

/// For each of `wanted` (sorted), the tightest function symbol among
/// `symbols` (whole Elf64_Sym entries) whose range holds it, where tighter
/// than `best_sizes` says (`u64::MAX`: none yet); its name's offset goes to
/// `best_names`. Called piece by piece over a table.
fn match_function_symbols(symbols: &[u8], wanted: &[u64], best_sizes: &mut [u64], best_names: &mut [u32]) {
    assert!(symbols.len() % SYMBOL_SIZE == 0 && best_sizes.len() == wanted.len() && best_names.len() == wanted.len());
    // SAFETY: `symbols` holds `len / SYMBOL_SIZE` whole entries, and
    // `best_sizes` and `best_names` have one element per wanted address
    // (checked above); the shim reads and writes only within them.
    unsafe {
        super::ffi::glt_match_function_symbols(
            symbols.as_ptr(),
            symbols.len() / SYMBOL_SIZE,
            wanted.as_ptr(),
            wanted.len(),
            best_sizes.as_mut_ptr(),
            best_names.as_mut_ptr(),
        )
    };
}

/// A name as the stack symbolizer shows names `backtrace` resolves:
/// Rust's demangled without its hash, else C++'s (the same demanglers, their
/// default options), else the raw name.
fn demangle(raw: &[u8]) -> String {
    let text = String::from_utf8_lossy(raw);
    if let Ok(rust) = rustc_demangle::try_demangle(&text) {
        return format!("{rust:#}");
    }
    cpp_demangle::Symbol::new(raw).ok().and_then(|symbol| symbol.demangle().ok()).unwrap_or_else(|| text.into_owned())
}

/// Names for those of `addresses` that lie in a loaded library without line
/// tables: the demangled name of the function whose symbol holds each
/// (`None` where no symbol does). Addresses in libraries with line tables,
/// or in no library, are left out: `backtrace` resolves those.
pub(crate) fn names_in_libraries_without_line_tables(addresses: &[usize]) -> HashMap<usize, Option<String>> {
    let (modules, _) = super::objects::loaded_objects();
    let mut by_module: HashMap<usize, Vec<u64>> = HashMap::new();
    for &address in addresses {
        if let Some(index) = modules.iter().position(|m| m.mapped.contains(&(address as u64))) {
            by_module.entry(index).or_default().push(address as u64 - modules[index].base);
        }
    }
    let mut names = HashMap::new();
    for (index, mut wanted) in by_module {
        let module = &modules[index];
        let Some(elf) = Elf::open(module.file()) else { continue };
        if elf.has_line_tables() {
            continue;
        }
        wanted.sort_unstable();
        wanted.dedup();
        let found = elf.function_names(&wanted);
        for address in wanted {
            names.insert((address + module.base) as usize, found.get(&address).cloned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libc_function_is_named_from_its_symbol_table() {
        // An address inside `qsort`'s code (glibc has no line tables here;
        // where it does, there is nothing to check).
        let address = libc::qsort as *const () as usize + 1;
        let names = names_in_libraries_without_line_tables(&[address]);
        if let Some(name) = names.get(&address) {
            let name = name.as_deref().expect("qsort has a symbol");
            assert!(name.contains("qsort"), "{name}");
        }
    }

    #[test]
    fn a_libtorch_function_is_named_as_backtrace_names_it() {
        let address = c10_get_allocator_address();
        let ours = names_in_libraries_without_line_tables(&[address]);
        let mut theirs = None;
        backtrace::resolve(address as *mut std::ffi::c_void, |symbol| theirs = symbol.name().map(|n| format!("{n:#}")));
        assert_eq!(ours.get(&address).cloned().flatten(), theirs);
        assert_eq!(theirs.as_deref(), Some("c10::GetAllocator(c10::DeviceType const&)"));
    }

    /// An address inside libc10's `c10::GetAllocator`, which the shim links.
    fn c10_get_allocator_address() -> usize {
        // SAFETY: dlsym with a NUL-terminated name.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"_ZN3c1012GetAllocatorERKNS_10DeviceTypeE".as_ptr()) };
        assert!(!symbol.is_null(), "libc10 is loaded");
        symbol as usize + 4
    }

    #[test]
    fn addresses_in_the_test_binary_are_left_to_backtrace() {
        #[inline(never)]
        fn here() -> usize {
            here as *const () as usize + 1
        }
        assert!(!names_in_libraries_without_line_tables(&[here()]).contains_key(&here()));
    }

    /// An Elf64_Sym: name offset, kind, address, size.
    fn symbol(name: u32, kind: u8, value: u64, size: u64) -> Vec<u8> {
        let mut bytes = vec![0u8; SYMBOL_SIZE];
        bytes[0..4].copy_from_slice(&name.to_le_bytes());
        bytes[4] = kind;
        bytes[8..16].copy_from_slice(&value.to_le_bytes());
        bytes[16..24].copy_from_slice(&size.to_le_bytes());
        bytes
    }

    #[test]
    fn each_address_takes_the_tightest_function_symbol_that_holds_it_across_pieces() {
        const FUNCTION: u8 = 2;
        const INDIRECT_FUNCTION: u8 = 10;
        const OBJECT: u8 = 1;
        let first_piece = [
            symbol(1, FUNCTION, 0x1000, 0x100),         // holds 0x1010 and 0x1080
            symbol(2, OBJECT, 0x1010, 0x4),             // data, not a function
            symbol(3, FUNCTION, 0x1080, 0x10),          // inside 1: tighter for 0x1080
            symbol(4, FUNCTION, 0x1080, 0x10),          // an alias of 3, later: 3 stays
            symbol(5, FUNCTION, 0x2000, 0),             // no size: holds nothing
        ]
        .concat();
        let second_piece = [
            symbol(6, INDIRECT_FUNCTION, 0x3000, 0x20), // holds 0x301f, not 0x3020
            symbol(7, FUNCTION, 0x0ff0, 0x3000),        // wider than 1, 3 and 6
        ]
        .concat();
        let wanted = [0x1010, 0x1080, 0x2000, 0x301f, 0x3020];
        let (mut sizes, mut names) = (vec![u64::MAX; wanted.len()], vec![0u32; wanted.len()]);
        match_function_symbols(&first_piece, &wanted, &mut sizes, &mut names);
        match_function_symbols(&second_piece, &wanted, &mut sizes, &mut names);
        assert_eq!(names, [1, 3, 7, 6, 7]);
        assert_eq!(sizes, [0x100, 0x10, 0x3000, 0x20, 0x3000]);
    }

    #[test]
    fn names_are_demangled_as_backtrace_shows_them() {
        assert_eq!(demangle(b"_ZN3c1012GetAllocatorERKNS_10DeviceTypeE"), "c10::GetAllocator(c10::DeviceType const&)");
        assert_eq!(demangle(b"_ZN3std2rt10lang_start17h0123456789abcdefE"), "std::rt::lang_start");
        assert_eq!(demangle(b"not_mangled"), "not_mangled");
    }
}
