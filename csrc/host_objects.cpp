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
// They forward to malloc and free. Each block counts its malloc_usable_size
// on both sides, so a free subtracts what its allocation added. Rust's heap
// does not go through operator new: a test's own Vec<f64> is not counted
// here.
//
// Who counted a block is written in the block itself, in 4 bytes past what
// the caller asked for (see `Mark`), and a sized delete finds it from the
// size it is given (see `tail_offset`). Outside leak tests the cost is those
// two stores and a few loads per call. A thread-local flag keeps the
// count from counting itself. Left out: what the CUDA caching allocator
// allocates for its own books (see below).
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#include "shim.h"

namespace {

// The common path of every operator new and delete is kept to a few
// lines of code, straight through: what it rarely needs (tags, reports,
// the shared shard, malloc's size) is out of line, in cold code. In the
// allocation-heavy CUDA step a counted new and delete pair cost about four
// times what it costs in a loop of its own (benches/RESULTS.md), where its
// code stays in the nearest cache.
#define GLT_LIKELY(x) __builtin_expect(!!(x), 1)
#define GLT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define GLT_COLD __attribute__((noinline, cold))

// This file is linked into the executable, so its thread-locals need no
// lookup through the dynamic linker: initial-exec reads them at a fixed
// offset from the thread pointer, where the general model's call makes
// the compiler save registers on every new and delete.
#define GLT_THREAD_LOCAL thread_local __attribute__((tls_model("initial-exec")))

// Trivial thread-local state: safe to touch while a thread is torn down.
GLT_THREAD_LOCAL bool reporting = false;

// What each operator new and delete reads besides its block, its thread's
// sums and two thread-locals, on one cache line of its own: between two of
// libtorch's calls that line may have left the nearest cache, and one line
// comes back where up to four did (in the bench's binary these lay on four,
// among other files' globals). Each is written when a test starts or ends
// something, never per call.
struct alignas(64) Switches {
  // Threads with a gpu-leak-test hook pushed (shim.cpp's push and pop).
  std::atomic<int> hooks{0};
  // Hooks without a tag: each C++ heap free must reach them (see
  // report_to_hook).
  std::atomic<int> untagged_hooks{0};
  // The open observation's epoch, 0 while none is open (see marks).
  std::atomic<uint16_t> epoch{0};
  // Set by a test of the "cannot measure" verdict, and by the benchmark's
  // variants without this layer: nothing is reported.
  std::atomic<bool> switched_off{false};
  // While attribution records sites in process scope, every event also goes
  // to the process sink's tracker, which keeps the blocks with their stacks.
  std::atomic<bool> recording_sites{false};
  // The code of libc10_cuda.so, once CUDA is loaded (see
  // from_the_cuda_allocator): its start, then its length.
  std::atomic<uintptr_t> c10_cuda_start{0};
  std::atomic<uintptr_t> c10_cuda_bytes{0};
};
Switches switches;

// The flags are ORed, not tested one by one, here and on the common path
// below: each branch there is one more for the predictor to have forgotten
// between libtorch's calls.
inline bool counting() {
  return ((switches.hooks.load(std::memory_order_relaxed) | switches.epoch.load(std::memory_order_relaxed)) != 0) &
         !switches.switched_off.load(std::memory_order_relaxed);
}

// Both scopes count without a lock or a map. Every block carries a mark in
// the last 4 bytes of its usable size, which operator new asks malloc for
// beyond the caller's bytes: the observation that counted it (its epoch),
// and the tracker whose hooked thread allocated it (a tag and the tag's
// generation). A free reads the mark beside the next chunk's header, which
// malloc_usable_size reads anyway, so it costs no cache line of its own.
// (A side table of marks cost a cache miss on nearly every free: the
// allocation-heavy step on CUDA took 1.065x its plain time.) A mark is
// valid only for its own address, and only while its epoch or its tag's
// generation is current, so a block made before an observation or a tracker
// is not theirs, as in the tracker's own map. Sums are kept in per-thread
// shards. The trackers' maps are still fed while attribution records sites.
namespace marks {
constexpr size_t kMarkBytes = sizeof(uint32_t);
constexpr int kTags = 256;

// epoch (16 bits) | tag (8) | the tag's generation (8), XORed with a hash of
// the block's address.
struct Mark {
  uint16_t epoch = 0;
  uint8_t tag = 0;
  uint8_t generation = 0;
};

inline uint32_t address_hash(const void* ptr) {
  return static_cast<uint32_t>((reinterpret_cast<uintptr_t>(ptr) * 0x9E3779B97F4A7C15ull) >> 32);
}

inline uint32_t load_word(const void* ptr, size_t offset) {
  uint32_t word = 0;
  std::memcpy(&word, static_cast<const char*>(ptr) + offset, sizeof(word));
  return word;
}

inline void store_word(void* ptr, size_t offset, uint32_t word) {
  std::memcpy(static_cast<char*>(ptr) + offset, &word, sizeof(word));
}

inline void write(void* ptr, size_t usable, Mark mark) {
  uint32_t word = ((uint32_t(mark.epoch) << 16) | (uint32_t(mark.tag) << 8) | mark.generation) ^ address_hash(ptr);
  store_word(ptr, usable - kMarkBytes, word);
}

inline Mark read(const void* ptr, size_t usable) {
  uint32_t word = load_word(ptr, usable - kMarkBytes) ^ address_hash(ptr);
  return Mark{static_cast<uint16_t>(word >> 16), static_cast<uint8_t>(word >> 8), static_cast<uint8_t>(word)};
}

// Epochs skip this value, so that no mark reads as a signpost.
constexpr uint16_t kNoEpoch = 0xFFFF;

// A sized delete knows the caller's bytes, not the block's usable size, and
// asking malloc for that reads the next chunk's header only after the
// block's own: a wait dearest on CUDA, where autograd's device thread frees
// what the forward made (benches/RESULTS.md). So operator new also leaves
// a signpost right after the caller's bytes, at `tail_offset`, saying how
// far past it the mark is (the slack, in bytes).
// Where the slack is 0 the signpost's place is the mark's own; where it is
// over 255 bytes the signpost says "ask malloc". Its word is the address's
// hash XOR kSignpostKey XOR the slack: a mark never reads as one, since its
// top 16 bits are its epoch (never kNoEpoch) under the same hash, and a
// stale or foreign word passes for one with odds of 2^-24.
constexpr uint32_t kSignpostKey = uint32_t(kNoEpoch) << 16;
constexpr uint32_t kMaxSlack = 0xFF;
constexpr uint32_t kAskMalloc = kMaxSlack + 1;

// The signpost's word at `ptr` for `slack` (or kAskMalloc).
inline uint32_t signpost_word(const void* ptr, uint32_t slack) { return address_hash(ptr) ^ kSignpostKey ^ slack; }

// Where the signpost of a block of `bytes` caller bytes is: 4-aligned, so it
// and a mark at the usable size's end are one slot or do not overlap.
inline size_t tail_offset(size_t bytes) { return ((bytes == 0 ? 1 : bytes) + 3) & ~size_t(3); }

inline void write_signpost(void* ptr, size_t tail, size_t usable) {
  size_t slack = usable - kMarkBytes - tail;
  if (slack != 0) {
    store_word(ptr, tail, signpost_word(ptr, slack <= kMaxSlack ? uint32_t(slack) : kAskMalloc));
  }
}

// The usable size a sized delete's signpost gives, or 0 where there is none
// (malloc must be asked).
inline size_t usable_from_signpost(const void* ptr, size_t tail) {
  uint32_t slack = load_word(ptr, tail) ^ signpost_word(ptr, 0);
  return slack <= kMaxSlack ? tail + kMarkBytes + slack : 0;
}

// Makes a freed block's signpost say "ask malloc": the block's next owner
// may leave those bytes unwritten, and a delete given a wrong size (undefined
// behaviour, harmless under glibc) must not find it there.
inline void clear_signpost(void* ptr, size_t tail) {
  store_word(ptr, tail, signpost_word(ptr, kAskMalloc));
}

// The last epoch given out; the open one is `switches.epoch`.
uint16_t last_epoch = 0;
// Per tag: its generation, with kHeld set while a tracker holds it.
constexpr uint16_t kHeld = 0x100;
std::atomic<uint16_t> tag_state[kTags];
// A tracker recording sites gets its blocks' events itself too.
std::atomic<bool> tag_recording[kTags];

// One writer per shard (its thread), so updates are a relaxed load and
// store, not a locked instruction; threads beyond the shards share the
// last one, which takes atomic additions. Sums are read against a
// baseline taken when their counting starts, so nothing is ever zeroed
// under a writer.
struct Sums {
  std::atomic<int64_t> bytes;
  std::atomic<uint64_t> allocations;
  std::atomic<uint64_t> frees;
};
struct alignas(128) Shard {
  Sums process;
  Sums tags[kTags];
};
constexpr int kShards = 512;
constexpr int kShared = kShards - 1;
Shard shards[kShards];
std::atomic<int> next_shard{0};
// This thread's shard, claimed at its first count.
GLT_THREAD_LOCAL Shard* own_shard = nullptr;

__attribute__((noinline)) Shard* claim_shard() {
  int next = next_shard.fetch_add(1, std::memory_order_relaxed);
  own_shard = &shards[next < kShared ? next : kShared];
  return own_shard;
}

template <typename T>
inline void bump(std::atomic<T>& counter, T by, bool shared) {
  if (shared) {
    counter.fetch_add(by, std::memory_order_relaxed);
  } else {
    counter.store(counter.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
}

inline void add(Sums& sums, int64_t bytes, bool shared) {
  bump(sums.bytes, bytes, shared);
  bump<uint64_t>(bytes > 0 ? sums.allocations : sums.frees, 1, shared);
}

// Adds `bytes` (negative for a free) to whoever `mark` names.
GLT_COLD void count(Mark mark, int64_t bytes) {
  Shard* shard = own_shard != nullptr ? own_shard : claim_shard();
  bool shared = shard == &shards[kShared];
  if (mark.epoch != 0) {
    add(shard->process, bytes, shared);
  }
  if (mark.tag != 0) {
    add(shard->tags[mark.tag], bytes, shared);
  }
}

// `count` for a block the open observation counts and no tracker's tag
// names: what a passing process-scope test does for every new and delete.
// Inline, with the shard found through one thread-local pointer, as GCC at
// -O2 made the count a call, which cost about 2 of the 9 ns a counted pair
// adds (benches/RESULTS.md); a thread's first count and threads beyond the
// shards take `count`.
__attribute__((always_inline)) inline void count_for_process(uint16_t epoch, int64_t bytes) {
  Shard* shard = own_shard;
  // One comparison: below the shared shard, and not null (which wraps).
  if (GLT_UNLIKELY(reinterpret_cast<uintptr_t>(shard) - reinterpret_cast<uintptr_t>(&shards[0]) >=
                   kShared * sizeof(Shard))) {
    count(Mark{epoch, 0, 0}, bytes);
    return;
  }
  add(shard->process, bytes, false);
}

// The mark of a block being freed, with only what is still current kept.
inline Mark current(Mark mark) {
  if (mark.epoch != switches.epoch.load(std::memory_order_relaxed)) {
    mark.epoch = 0;
  }
  if (mark.tag != 0 && tag_state[mark.tag].load(std::memory_order_relaxed) != (kHeld | mark.generation)) {
    mark.tag = 0;
  }
  return mark;
}

struct Figures {
  int64_t bytes = 0;
  uint64_t allocations = 0;
  uint64_t frees = 0;
};

// The process's sums (tag 0), or one tag's, over every shard in use.
Figures figures_of(int tag) {
  Figures total;
  int used = next_shard.load(std::memory_order_relaxed);
  for (int i = 0; i < kShards && i <= used; ++i) {
    const Sums& sums = tag == 0 ? shards[i].process : shards[i].tags[tag];
    total.bytes += sums.bytes.load(std::memory_order_relaxed);
    total.allocations += sums.allocations.load(std::memory_order_relaxed);
    total.frees += sums.frees.load(std::memory_order_relaxed);
  }
  return total;
}

Figures minus(Figures now, Figures base) {
  return {now.bytes - base.bytes, now.allocations - base.allocations, now.frees - base.frees};
}

// Trackers' tags, each one's sums when it was taken, and the process's
// when the observation opened.
std::mutex tags_mutex;
int next_tag = 1;
Figures tag_baseline[kTags];
Figures process_baseline;
}  // namespace marks

// Who counts a block allocated now on this thread, telling them, where a
// hook is pushed or attribution records sites. A report may allocate, so
// this runs under the guard.
__attribute__((noinline)) marks::Mark on_allocation_reported(void* ptr, int64_t size) {
  marks::Mark mark;
  if (reporting) {
    return mark;
  }
  reporting = true;
  if (switches.hooks.load(std::memory_order_relaxed) != 0) {
    bool hooked = false;
    uint8_t tag = glt::current_hook_tag(&hooked);
    // A tracker without a tag counts its blocks itself, as does one that
    // records their sites.
    if (hooked && (tag == 0 || marks::tag_recording[tag].load(std::memory_order_relaxed))) {
      glt::report_to_hook(ptr, size, glt::kHostObjectsDeviceType, -1);
    }
    if (tag != 0) {
      mark.tag = tag;
      mark.generation = static_cast<uint8_t>(marks::tag_state[tag].load(std::memory_order_relaxed));
    }
  }
  mark.epoch = switches.epoch.load(std::memory_order_relaxed);
  if (mark.epoch != 0 && switches.recording_sites.load(std::memory_order_relaxed)) {
    glt::report_process_event(ptr, size, glt::kHostObjectsDeviceType, -1);
  }
  marks::count(mark, size);
  reporting = false;
  return mark;
}

// Who counts a block allocated now on this thread. A passing process-scope
// test reports nothing, so its count needs no guard: a load of the flag
// keeps the count from counting blocks a report on this thread allocates.
inline marks::Mark on_allocation(void* ptr, int64_t size) {
  if (GLT_UNLIKELY((switches.hooks.load(std::memory_order_relaxed) != 0) |
                   switches.recording_sites.load(std::memory_order_relaxed))) {
    return on_allocation_reported(ptr, size);
  }
  marks::Mark mark;
  if (GLT_UNLIKELY(reporting)) {
    return mark;
  }
  mark.epoch = switches.epoch.load(std::memory_order_relaxed);
  if (GLT_LIKELY(mark.epoch != 0)) {
    marks::count_for_process(mark.epoch, size);
  }
  return mark;
}

// Reports a free outside the count (rarer, and a report may allocate, so
// under the guard): to every hook, where one counts its blocks itself or
// records them, as the block may be any of theirs; and to the process
// sink's tracker while attribution records sites.
__attribute__((noinline)) void report_free(void* ptr, bool to_hooks, bool to_process) {
  reporting = true;
  if (to_hooks) {
    glt::report_to_hook(ptr, -1, glt::kHostObjectsDeviceType, -1);
  }
  if (to_process) {
    glt::report_process_event(ptr, -1, glt::kHostObjectsDeviceType, -1);
  }
  reporting = false;
}

// A free of a block with a tracker's tag, or while hooks or attribution
// want frees reported.
GLT_COLD void on_free_reported(void* ptr, size_t usable, marks::Mark mark) {
  mark = marks::current(mark);
  if (mark.epoch != 0 || mark.tag != 0) {
    // No longer anyone's, should the block be handed out again uncounted.
    marks::write(ptr, usable, marks::Mark{});
    marks::count(mark, -static_cast<int64_t>(usable));
  }
  bool to_hooks = (mark.tag != 0 && marks::tag_recording[mark.tag].load(std::memory_order_relaxed)) ||
                  switches.untagged_hooks.load(std::memory_order_relaxed) != 0;
  bool to_process = mark.epoch != 0 && switches.recording_sites.load(std::memory_order_relaxed);
  if (to_hooks || to_process) {
    report_free(ptr, to_hooks, to_process);
  }
}

// Inline for the same reason as `count_for_process`; a block without a tag
// while nothing wants frees reported (a passing process-scope test) takes
// the short way, which does what `on_free_reported` does for it.
__attribute__((always_inline)) inline void on_free(void* ptr, size_t usable) {
  if (GLT_UNLIKELY(reporting)) {
    return;
  }
  marks::Mark mark = marks::read(ptr, usable);
  if (GLT_UNLIKELY((mark.tag != 0) | (switches.untagged_hooks.load(std::memory_order_relaxed) != 0) |
                   switches.recording_sites.load(std::memory_order_relaxed))) {
    on_free_reported(ptr, usable, mark);
    return;
  }
  uint16_t open_epoch = switches.epoch.load(std::memory_order_relaxed);
  if (GLT_LIKELY((mark.epoch == open_epoch) & (open_epoch != 0))) {
    // No longer anyone's, should the block be handed out again uncounted.
    marks::write(ptr, usable, marks::Mark{});
    marks::count_for_process(mark.epoch, -static_cast<int64_t>(usable));
  }
}

// Whether `caller` is in libc10_cuda.so's code: operator new called from
// there is the CUDA caching allocator's own bookkeeping (a Block for every
// split of its reserve, its pools' tree nodes), which follows the state of
// its cache, not the test's objects. Device memory is judged on its own.
// The length is 0 until the start is set, so a reader that sees the length
// sees the start it goes with.
inline bool from_the_cuda_allocator(void* caller) {
  uintptr_t bytes = switches.c10_cuda_bytes.load(std::memory_order_acquire);
  // One comparison: an address below the start wraps past the range.
  return reinterpret_cast<uintptr_t>(caller) - switches.c10_cuda_start.load(std::memory_order_relaxed) < bytes;
}

// Every block gets a mark and a signpost, counted or not: a free must never
// read a stale one, nor the caller's bytes. The signpost goes first, so
// that the mark wins should a strange malloc make them overlap.
inline void* marked(void* ptr, std::size_t bytes, void* caller) {
  size_t usable = malloc_usable_size(ptr);
  marks::Mark mark;
  if (counting() & !from_the_cuda_allocator(caller)) {
    mark = on_allocation(ptr, static_cast<int64_t>(usable));
  }
  marks::write_signpost(ptr, marks::tail_offset(bytes), usable);
  marks::write(ptr, usable, mark);
  return ptr;
}

inline void release(void* ptr) noexcept {
  if (ptr == nullptr) {
    return;
  }
  if (counting()) {
    on_free(ptr, malloc_usable_size(ptr));
  }
  std::free(ptr);
}

// A sized delete: the size is the one operator new was given (the
// standard's rule, [expr.delete]), so the signpost is where it was left.
inline void release_sized(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) {
    return;
  }
  if (counting()) {
    size_t tail = marks::tail_offset(bytes);
    size_t usable = marks::usable_from_signpost(ptr, tail);
    if (GLT_LIKELY(usable != 0)) {
      marks::clear_signpost(ptr, tail);
    } else {
      usable = malloc_usable_size(ptr);
    }
    on_free(ptr, usable);
  }
  std::free(ptr);
}

// Room for the caller's bytes, rounded up to the signpost's place, and the
// mark. The rounding never moves a block to a larger malloc size class:
// their bounds are multiples of 4 bytes, and this is the least multiple of
// 4 that holds the caller's bytes and the mark.
inline std::size_t with_mark(std::size_t bytes) {
  if (bytes > SIZE_MAX - 2 * marks::kMarkBytes) {
    throw std::bad_alloc();
  }
  return marks::tail_offset(bytes) + marks::kMarkBytes;
}

// The standard's loop: call the new-handler until it gives memory or throws.
void* allocate(std::size_t bytes, void* caller) {
  std::size_t asked = with_mark(bytes);
  for (;;) {
    if (void* ptr = std::malloc(asked)) {
      return marked(ptr, bytes, caller);
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
  std::size_t asked = with_mark(bytes);
  for (;;) {
    void* ptr = nullptr;
    if (posix_memalign(&ptr, align, asked) == 0 && ptr != nullptr) {
      return marked(ptr, bytes, caller);
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
void operator delete(void* ptr, std::size_t bytes) noexcept { release_sized(ptr, bytes); }
void operator delete[](void* ptr, std::size_t bytes) noexcept { release_sized(ptr, bytes); }
void operator delete(void* ptr, const std::nothrow_t&) noexcept { release(ptr); }
void operator delete[](void* ptr, const std::nothrow_t&) noexcept { release(ptr); }
void operator delete(void* ptr, std::align_val_t) noexcept { release(ptr); }
void operator delete[](void* ptr, std::align_val_t) noexcept { release(ptr); }
void operator delete(void* ptr, std::size_t bytes, std::align_val_t) noexcept { release_sized(ptr, bytes); }
void operator delete[](void* ptr, std::size_t bytes, std::align_val_t) noexcept { release_sized(ptr, bytes); }
void operator delete(void* ptr, std::align_val_t, const std::nothrow_t&) noexcept { release(ptr); }
void operator delete[](void* ptr, std::align_val_t, const std::nothrow_t&) noexcept { release(ptr); }

namespace glt {
void count_pushed_hooks(int change) { switches.hooks.fetch_add(change, std::memory_order_relaxed); }

void count_untagged_hooks(int change) { switches.untagged_hooks.fetch_add(change, std::memory_order_relaxed); }

void leave_out_cuda_allocator() {
  if (switches.c10_cuda_bytes.load(std::memory_order_acquire) == 0) {
    CodeRange code = code_of("libc10_cuda.so");
    if (code.end != 0) {
      switches.c10_cuda_start.store(code.start, std::memory_order_relaxed);
      switches.c10_cuda_bytes.store(code.end - code.start, std::memory_order_release);
    }
  }
}
}  // namespace glt


extern "C" {
// Starts (observed = 1) or stops (0) reporting the process's C++ heap to the
// process-wide sink: only while an observation is open, so outside leak
// tests operator new reads one cache line of its own besides its block.
void glt_process_observe_host_objects(int observed) {
  using namespace marks;
  std::lock_guard<std::mutex> guard(tags_mutex);
  if (observed != 0) {
    process_baseline = figures_of(0);
    // A new epoch: blocks marked in an earlier one are not this one's.
    // 0 is "none open", and kNoEpoch keeps marks apart from signposts.
    last_epoch = static_cast<uint16_t>(last_epoch + 1);
    if (last_epoch == 0 || last_epoch == kNoEpoch) {
      last_epoch = 1;
    }
    switches.epoch.store(last_epoch, std::memory_order_release);
  } else {
    switches.epoch.store(0, std::memory_order_release);
  }
}

// The process's counted C++ heap since the observation opened: live bytes
// of the blocks allocated since, and the allocations and frees counted.
void glt_process_host_objects(int64_t* bytes, uint64_t* events) {
  using namespace marks;
  std::lock_guard<std::mutex> guard(tags_mutex);
  Figures figures = minus(figures_of(0), process_baseline);
  *bytes = figures.bytes;
  *events = figures.allocations + figures.frees;
}

// A tag for one tracker's C++ heap blocks, 1..255, or 0 where all are held
// (the tracker then counts its blocks itself). Each taking starts a new
// generation of the tag, so blocks of its earlier holders are not the new
// one's.
int glt_host_objects_acquire_tag() {
  using namespace marks;
  std::lock_guard<std::mutex> guard(tags_mutex);
  for (int tried = 1; tried < kTags; ++tried) {
    int tag = next_tag;
    next_tag = next_tag + 1 < kTags ? next_tag + 1 : 1;
    uint16_t state = tag_state[tag].load(std::memory_order_relaxed);
    if ((state & kHeld) == 0) {
      tag_baseline[tag] = figures_of(tag);
      tag_state[tag].store(kHeld | ((state + 1) & 0xFF), std::memory_order_relaxed);
      return tag;
    }
  }
  return 0;
}

void glt_host_objects_release_tag(int tag) {
  using namespace marks;
  if (tag <= 0 || tag >= kTags) {
    return;
  }
  std::lock_guard<std::mutex> guard(tags_mutex);
  tag_state[tag].store(tag_state[tag].load(std::memory_order_relaxed) & 0xFF, std::memory_order_relaxed);
  tag_recording[tag].store(false, std::memory_order_relaxed);
}

// One tag's counted C++ heap since it was acquired.
void glt_host_objects_of_tag(int tag, int64_t* bytes, uint64_t* allocations, uint64_t* frees) {
  using namespace marks;
  Figures figures;
  if (tag > 0 && tag < kTags) {
    std::lock_guard<std::mutex> guard(tags_mutex);
    figures = minus(figures_of(tag), tag_baseline[tag]);
  }
  *bytes = figures.bytes;
  *allocations = figures.allocations;
  *frees = figures.frees;
}

// Also reports the tag's blocks to its tracker's hook (record = 1), which
// keeps them with their stacks, for attribution.
void glt_host_objects_record_tag(int tag, int record) {
  if (tag > 0 && tag < marks::kTags) {
    marks::tag_recording[tag].store(record != 0, std::memory_order_relaxed);
  }
}

// Also feeds the process sink's tracker (record = 1), for attribution.
void glt_process_record_host_object_sites(int record) { switches.recording_sites.store(record != 0, std::memory_order_relaxed); }

// Stops (off = 1) or restarts (0) every report of the C++ heap.
void glt_host_objects_switch_off(int off) { switches.switched_off.store(off != 0, std::memory_order_relaxed); }
}
