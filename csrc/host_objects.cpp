// libtorch's host objects: the C++ heap, counted exactly.
//
// Autograd's graph nodes, saved-variable records, TensorImpls and
// libtorch's containers come from C++ operator new, not from the CPU
// allocator that counts tensor storage. A program may replace the global
// allocation functions, and the definition in the executable replaces the
// library's for every shared object, libtorch included ([replacement.
// functions]); this file is linked into every test binary that uses
// gpu-leak-test, so these definitions are the process's.
//
// They forward to malloc and free. Each block counts its malloc_usable_size,
// which the Rust side keeps per block, so a free subtracts what its
// allocation added. Rust's heap does not go through operator new: a test's
// own Vec<f64> is not counted here.
//
// Outside leak tests the cost is one relaxed load per call. A thread-local
// flag keeps the count from counting itself. Left out: what the CUDA
// caching allocator allocates for its own books (see below).
#include <c10/util/ThreadLocalDebugInfo.h>

#include <malloc.h>
#include <sys/mman.h>

#include <cstdlib>
#include <new>

#include "shim.h"

namespace {

// Trivial thread-local state: safe to touch while a thread is torn down.
thread_local bool reporting = false;

// Set by a test of the "cannot measure" verdict, and by the benchmark's
// variants without this layer: nothing is reported.
std::atomic<bool> switched_off{false};

inline bool counting() {
  return (glt::host_object_hooks.load(std::memory_order_relaxed) != 0 ||
          glt::host_objects_observed.load(std::memory_order_relaxed) != 0) &&
         !switched_off.load(std::memory_order_relaxed);
}

// Process scope counts without a lock or a map: which live blocks were
// counted is one byte per 16-byte granule of the address space (glibc's
// blocks are 16-aligned), in pages mapped as they are first needed, and
// their bytes are summed over per-thread shards. A byte, not a bit, so
// marking is a plain store, not a locked read-modify-write on a word other
// threads' blocks share: only the thread that allocates or frees a block
// writes its byte, and no two do so at once. A free clears its block's
// byte and subtracts its usable size only where the byte was set, so
// blocks made before the observation are not the test's, as in the
// tracker's map.
// The map is still fed while attribution records sites.
namespace counted_blocks {
constexpr int kGranuleShift = 4;
constexpr int kLeafShift = 24;  // a leaf covers 16 MiB: 2^20 granules, 1 MiB
constexpr int kMidShift = 36;   // a mid table covers 64 GiB: 4,096 leaves
constexpr int kAddressBits = 47;
constexpr size_t kTop = size_t(1) << (kAddressBits - kMidShift);
constexpr size_t kMid = size_t(1) << (kMidShift - kLeafShift);
constexpr size_t kLeafWords = size_t(1) << (kLeafShift - kGranuleShift);

using Word = std::atomic<uint8_t>;
using Mid = std::atomic<Word*>;
std::atomic<Mid*> top[kTop];

// Zeroed memory from the kernel: operator new must not call itself.
void* map_zeroed(size_t bytes) {
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return mapped == MAP_FAILED ? nullptr : mapped;
}

template <typename T>
T* get_or_map(std::atomic<T*>& slot, size_t count) {
  T* present = slot.load(std::memory_order_acquire);
  if (present != nullptr) {
    return present;
  }
  T* fresh = static_cast<T*>(map_zeroed(count * sizeof(T)));
  if (fresh == nullptr) {
    return nullptr;
  }
  if (slot.compare_exchange_strong(present, fresh, std::memory_order_acq_rel)) {
    return fresh;
  }
  munmap(fresh, count * sizeof(T));
  return present;
}

// The byte marking `address`, mapping its pages where `map` is set;
// nullptr where none is mapped (or the address is beyond 47 bits).
Word* word_of(uintptr_t address, bool map) {
  if ((address >> kAddressBits) != 0) {
    return nullptr;
  }
  auto& mid_slot = top[address >> kMidShift];
  Mid* mid = map ? get_or_map(mid_slot, kMid) : mid_slot.load(std::memory_order_acquire);
  if (mid == nullptr) {
    return nullptr;
  }
  auto& leaf_slot = mid[(address >> kLeafShift) & (kMid - 1)];
  Word* leaf = map ? get_or_map(leaf_slot, kLeafWords) : leaf_slot.load(std::memory_order_acquire);
  if (leaf == nullptr) {
    return nullptr;
  }
  return &leaf[(address >> kGranuleShift) & (kLeafWords - 1)];
}

// One writer per shard (its thread), so updates are a relaxed load and
// store, not a locked instruction; threads beyond the shards share the
// last one, which takes atomic additions.
struct alignas(64) Shard {
  std::atomic<int64_t> bytes{0};
  std::atomic<uint64_t> events{0};
};
constexpr int kShards = 512;
constexpr int kShared = kShards - 1;
Shard shards[kShards];
std::atomic<int> next_shard{0};
thread_local int shard_index = -1;

void add(int64_t bytes) {
  if (shard_index < 0) {
    int next = next_shard.fetch_add(1, std::memory_order_relaxed);
    shard_index = next < kShared ? next : kShared;
  }
  Shard& shard = shards[shard_index];
  if (shard_index == kShared) {
    shard.bytes.fetch_add(bytes, std::memory_order_relaxed);
    shard.events.fetch_add(1, std::memory_order_relaxed);
  } else {
    shard.bytes.store(shard.bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
    shard.events.store(shard.events.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
}

void on_allocation(void* ptr, int64_t bytes) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  Word* word = word_of(address, true);
  if (word == nullptr) {
    return;
  }
  if (word->load(std::memory_order_relaxed) == 0) {
    word->store(1, std::memory_order_relaxed);
    add(bytes);
  }
}

void on_free(void* ptr) {
  auto address = reinterpret_cast<uintptr_t>(ptr);
  Word* word = word_of(address, false);
  if (word == nullptr) {
    return;
  }
  if (word->load(std::memory_order_relaxed) != 0) {
    word->store(0, std::memory_order_relaxed);
    add(-static_cast<int64_t>(malloc_usable_size(ptr)));
  }
}

// Forgets every counted block and zeroes the sums, for a new observation.
void reset() {
  for (auto& mid_slot : top) {
    Mid* mid = mid_slot.load(std::memory_order_acquire);
    if (mid == nullptr) {
      continue;
    }
    for (size_t m = 0; m < kMid; ++m) {
      if (Word* leaf = mid[m].load(std::memory_order_acquire)) {
        // The pages read as zero again, without a write to each.
        madvise(leaf, kLeafWords * sizeof(Word), MADV_DONTNEED);
      }
    }
  }
  for (auto& shard : shards) {
    shard.bytes.store(0, std::memory_order_relaxed);
    shard.events.store(0, std::memory_order_relaxed);
  }
}
}  // namespace counted_blocks

// While attribution records sites in process scope, every event also goes
// to the process sink's tracker, which keeps the blocks with their stacks.
std::atomic<bool> recording_sites{false};

void report(void* ptr, int64_t size) {
  if (reporting) {
    return;
  }
  reporting = true;
  if (glt::host_object_hooks.load(std::memory_order_relaxed) != 0) {
    glt::report_to_hook(ptr, size, glt::kHostObjectsDeviceType, -1);
  }
  if (glt::host_objects_observed.load(std::memory_order_relaxed) != 0) {
    if (size > 0) {
      counted_blocks::on_allocation(ptr, size);
    } else {
      counted_blocks::on_free(ptr);
    }
    if (recording_sites.load(std::memory_order_relaxed)) {
      glt::report_process_event(ptr, size, glt::kHostObjectsDeviceType, -1);
    }
  }
  reporting = false;
}

// The code of libc10_cuda.so, once CUDA is loaded: operator new called from
// there is the CUDA caching allocator's own bookkeeping (a Block for every
// split of its reserve, its pools' tree nodes), which follows the state of
// its cache, not the test's objects. Device memory is judged on its own.
std::atomic<uintptr_t> c10_cuda_start{0};
std::atomic<uintptr_t> c10_cuda_end{0};

inline bool from_the_cuda_allocator(void* caller) {
  auto address = reinterpret_cast<uintptr_t>(caller);
  return address >= c10_cuda_start.load(std::memory_order_relaxed) &&
         address < c10_cuda_end.load(std::memory_order_relaxed);
}

inline void* counted(void* ptr, void* caller) {
  if (ptr != nullptr && counting() && !from_the_cuda_allocator(caller)) {
    report(ptr, static_cast<int64_t>(malloc_usable_size(ptr)));
  }
  return ptr;
}

inline void release(void* ptr) noexcept {
  if (ptr == nullptr) {
    return;
  }
  if (counting()) {
    report(ptr, -1);
  }
  std::free(ptr);
}

// The standard's loop: call the new-handler until it gives memory or throws.
void* allocate(std::size_t bytes, void* caller) {
  if (bytes == 0) {
    bytes = 1;
  }
  for (;;) {
    if (void* ptr = std::malloc(bytes)) {
      return counted(ptr, caller);
    }
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) {
      throw std::bad_alloc();
    }
    handler();
  }
}

void* allocate_aligned(std::size_t bytes, std::align_val_t alignment, void* caller) {
  std::size_t align = static_cast<std::size_t>(alignment);
  if (align < sizeof(void*)) {
    align = sizeof(void*);
  }
  if (bytes == 0) {
    bytes = 1;
  }
  for (;;) {
    void* ptr = nullptr;
    if (posix_memalign(&ptr, align, bytes) == 0 && ptr != nullptr) {
      return counted(ptr, caller);
    }
    std::new_handler handler = std::get_new_handler();
    if (handler == nullptr) {
      throw std::bad_alloc();
    }
    handler();
  }
}

template <typename F>
void* without_throwing(F&& allocate_block) noexcept {
  try {
    return allocate_block();
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

// Each form passes its caller's address on: where the call came from
// decides whether the block is the CUDA allocator's bookkeeping.
#define GLT_CALLER __builtin_return_address(0)

void* operator new(std::size_t bytes) { return allocate(bytes, GLT_CALLER); }
void* operator new[](std::size_t bytes) { return allocate(bytes, GLT_CALLER); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept {
  void* caller = GLT_CALLER;
  return without_throwing([&] { return allocate(bytes, caller); });
}
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept {
  void* caller = GLT_CALLER;
  return without_throwing([&] { return allocate(bytes, caller); });
}
void* operator new(std::size_t bytes, std::align_val_t alignment) { return allocate_aligned(bytes, alignment, GLT_CALLER); }
void* operator new[](std::size_t bytes, std::align_val_t alignment) {
  return allocate_aligned(bytes, alignment, GLT_CALLER);
}
void* operator new(std::size_t bytes, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  void* caller = GLT_CALLER;
  return without_throwing([&] { return allocate_aligned(bytes, alignment, caller); });
}
void* operator new[](std::size_t bytes, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  void* caller = GLT_CALLER;
  return without_throwing([&] { return allocate_aligned(bytes, alignment, caller); });
}

void operator delete(void* ptr) noexcept { release(ptr); }
void operator delete[](void* ptr) noexcept { release(ptr); }
void operator delete(void* ptr, std::size_t) noexcept { release(ptr); }
void operator delete[](void* ptr, std::size_t) noexcept { release(ptr); }
void operator delete(void* ptr, const std::nothrow_t&) noexcept { release(ptr); }
void operator delete[](void* ptr, const std::nothrow_t&) noexcept { release(ptr); }
void operator delete(void* ptr, std::align_val_t) noexcept { release(ptr); }
void operator delete[](void* ptr, std::align_val_t) noexcept { release(ptr); }
void operator delete(void* ptr, std::size_t, std::align_val_t) noexcept { release(ptr); }
void operator delete[](void* ptr, std::size_t, std::align_val_t) noexcept { release(ptr); }
void operator delete(void* ptr, std::align_val_t, const std::nothrow_t&) noexcept { release(ptr); }
void operator delete[](void* ptr, std::align_val_t, const std::nothrow_t&) noexcept { release(ptr); }

namespace glt {
std::atomic<int> host_object_hooks{0};
std::atomic<int> host_objects_observed{0};
}  // namespace glt

namespace glt {
void leave_out_cuda_allocator() {
  if (c10_cuda_end.load(std::memory_order_acquire) == 0) {
    CodeRange code = code_of("libc10_cuda.so");
    if (code.end != 0) {
      c10_cuda_start.store(code.start, std::memory_order_relaxed);
      c10_cuda_end.store(code.end, std::memory_order_release);
    }
  }
}
}  // namespace glt


extern "C" {
// Starts (observed = 1) or stops (0) reporting the process's C++ heap to the
// process-wide sink: only while an observation is open, so operator new
// costs one load outside leak tests.
void glt_process_observe_host_objects(int observed) {
  if (observed != 0) {
    counted_blocks::reset();
  }
  glt::host_objects_observed.store(observed != 0 ? 1 : 0, std::memory_order_release);
}

// The process's counted C++ heap since the observation opened: live bytes
// of the blocks allocated since, and the allocations and frees counted.
void glt_process_host_objects(int64_t* bytes, uint64_t* events) {
  int64_t total = 0;
  uint64_t counted = 0;
  for (auto& shard : counted_blocks::shards) {
    total += shard.bytes.load(std::memory_order_relaxed);
    counted += shard.events.load(std::memory_order_relaxed);
  }
  *bytes = total;
  *events = counted;
}

// Also feeds the process sink's tracker (record = 1), for attribution.
void glt_process_record_host_object_sites(int record) { recording_sites.store(record != 0, std::memory_order_relaxed); }

// Stops (off = 1) or restarts (0) every report of the C++ heap.
void glt_host_objects_switch_off(int off) { switched_off.store(off != 0, std::memory_order_relaxed); }
}
