// The one loop of attribution that reads a library's whole symbol table
// (src/probe/symbols.rs): libtorch_cpu.so has 554,000 symbols. It is here
// because the shim is compiled optimised in every profile (build.rs), and
// `cargo test` builds this crate at opt-level 0, where the same loop in
// Rust made naming libtorch_cpu.so's frames cost 117 to 137 ms of every
// failing test's attribution; with the loop here, 10 to 17 ms.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace {

constexpr size_t kSymbolBytes = 24;  // Elf64_Sym
constexpr uint8_t kFunction = 2;      // STT_FUNC
constexpr uint8_t kIndirectFunction = 10;  // STT_GNU_IFUNC

template <typename T>
T field(const uint8_t* symbol, size_t at) {
  T value;
  std::memcpy(&value, symbol + at, sizeof(T));
  return value;
}

}  // namespace

// For each of `wanted` (sorted link-time addresses), the function symbol
// among `count` Elf64_Sym entries at `symbols` whose range holds it, where
// it is tighter than the one already in `best_sizes` / `best_names`
// (UINT64_MAX where none yet): a table read in pieces is passed piece by
// piece. Where sizes tie, the earlier symbol stays.
extern "C" void glt_match_function_symbols(const uint8_t* symbols, size_t count, const uint64_t* wanted,
                                           size_t wanted_count, uint64_t* best_sizes, uint32_t* best_names) {
  const uint64_t* wanted_end = wanted + wanted_count;
  for (size_t i = 0; i < count; ++i) {
    const uint8_t* symbol = symbols + i * kSymbolBytes;
    uint8_t kind = symbol[4] & 0xf;
    uint64_t value = field<uint64_t>(symbol, 8);
    uint64_t size = field<uint64_t>(symbol, 16);
    if ((kind != kFunction && kind != kIndirectFunction) || size == 0) {
      continue;
    }
    for (const uint64_t* address = std::lower_bound(wanted, wanted_end, value);
         address != wanted_end && *address - value < size; ++address) {
      size_t j = static_cast<size_t>(address - wanted);
      if (size < best_sizes[j]) {
        best_sizes[j] = size;
        best_names[j] = field<uint32_t>(symbol, 0);
      }
    }
  }
}
