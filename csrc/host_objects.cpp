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

#include <link.h>
#include <malloc.h>

#include <cstring>

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

void report(void* ptr, int64_t size) {
  if (reporting) {
    return;
  }
  reporting = true;
  if (glt::host_object_hooks.load(std::memory_order_relaxed) != 0) {
    glt::report_host_object_to_hook(ptr, size);
  }
  if (glt::host_objects_observed.load(std::memory_order_relaxed) != 0) {
    glt::report_process_event(ptr, size, glt::kHostObjectsDeviceType, -1);
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
    dl_iterate_phdr(
        [](struct dl_phdr_info* info, size_t, void*) -> int {
          if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, "libc10_cuda.so") == nullptr) {
            return 0;
          }
          uintptr_t start = UINTPTR_MAX, end = 0;
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const auto& segment = info->dlpi_phdr[i];
            if (segment.p_type == PT_LOAD && (segment.p_flags & PF_X) != 0) {
              uintptr_t from = info->dlpi_addr + segment.p_vaddr;
              start = from < start ? from : start;
              end = from + segment.p_memsz > end ? from + segment.p_memsz : end;
            }
          }
          if (end != 0) {
            c10_cuda_start.store(start, std::memory_order_relaxed);
            c10_cuda_end.store(end, std::memory_order_release);
          }
          return 1;
        },
        nullptr);
  }
}
}  // namespace glt


extern "C" {
// Starts (observed = 1) or stops (0) reporting the process's C++ heap to the
// process-wide sink: only while an observation is open, so operator new
// costs one load outside leak tests.
void glt_process_observe_host_objects(int observed) {
  glt::host_objects_observed.store(observed != 0 ? 1 : 0, std::memory_order_relaxed);
}

// Stops (off = 1) or restarts (0) every report of the C++ heap.
void glt_host_objects_switch_off(int off) { switched_off.store(off != 0, std::memory_order_relaxed); }
}
