// What shim.cpp, host_objects.cpp and driver_calls.cpp share: where C++
// heap and driver events go, and two helpers.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

// The device types of the events the shim reports (kHostObjectsDeviceType,
// kOutsideLibtorchDeviceType, kCudaAllocatorCallsDeviceType,
// kPinnedByLibtorchDeviceType): build.rs writes them from
// build_support/event_kinds.rs, their one definition, which the Rust side
// reads too.
#include "glt_event_kinds.h"

namespace glt {

// A copy of `text` on the malloc heap, for the Rust side to free with
// glt_free_string (shim.cpp).
char* copy_string(const std::string& text);

// Executable code of one loaded object.
struct CodeRange {
  uintptr_t start = 0;
  uintptr_t end = 0;
  bool contains(uintptr_t address) const { return address >= start && address < end; }
};

// The code of the loaded library whose path contains `library`, or of the
// object holding `address` (library == nullptr); empty where none is
// loaded (driver_calls.cpp).
CodeRange code_of(const char* library, uintptr_t address = 0);

// A gpu-leak-test hook was pushed on some thread (change = 1) or popped
// (-1): operator new reports only while one is pushed or a process-wide
// observation is open (host_objects.cpp).
void count_pushed_hooks(int change);

// The tag of the innermost gpu-leak-test hook on this thread (0 where its
// tracker has none), and whether there is one (shim.cpp).
uint8_t current_hook_tag(bool* hooked);
// A hook without a tag came to be (change = 1) or went (-1): each C++ heap
// free must reach those (see report_to_hook; host_objects.cpp).
void count_untagged_hooks(int change);

// Reports a block the hook cannot see itself (a C++ heap block, a driver
// allocation; size > 0) to the hook on this thread, where there is one,
// and its free (size < 0) to every hook.
void report_to_hook(void* ptr, int64_t size, int32_t device_type, int32_t index);

// Finds libc10_cuda.so's code once CUDA is loaded (later calls do
// nothing): operator new called from there is the CUDA caching
// allocator's own bookkeeping, left out of the count.
void leave_out_cuda_allocator();

// Reports an event to the process-wide sink, where one is set.
void report_process_event(void* ptr, int64_t size, int32_t device_type, int32_t index);

}  // namespace glt
