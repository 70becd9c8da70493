// Memory allocated through the CUDA driver outside libtorch's allocators,
// seen through CUPTI's callback API.
//
// A custom-kernel crate's cuMemAlloc (cudarc), NCCL's buffers, a library's
// cudaMalloc or cudaHostAlloc: none of them reach libtorch's allocators, so
// neither the hook nor the trace tracker sees them. CUPTI calls back on the
// calling thread at the exit of every driver API call we enable: only the
// allocation and free calls, so kernel launches cost nothing more.
//
// Each allocation is sorted by its caller, from the stack: one made from
// libc10_cuda.so is the CUDA caching allocator's (its segments: reserve, not
// a leak; or, with caching switched off, a tensor), and a pinned block made
// from libtorch_cuda.so is the caching host allocator's (host memory: its
// statistics count it in process scope, its events name the sites).
// Everything else is "outside libtorch". Both kinds go to
// the hook of the allocating thread (thread scope) and to the process sink,
// each with its own device type; frees go where their allocation went.
//
// One CUPTI subscriber per process: a profiler (torch.profiler's Kineto,
// Nsight Systems) that holds it makes this layer blind, and the leak test
// says so. We hold it only while an observation is open.
#include "shim.h"

#include <dlfcn.h>
#include <link.h>
#include <unwind.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <type_traits>
#include <unordered_map>

#ifdef GLT_CUDA_TRACE
#include <cupti.h>
#endif

namespace {

// The span of an object's executable segments.
glt::CodeRange executable_range(const struct dl_phdr_info* object) {
  glt::CodeRange range{UINTPTR_MAX, 0};
  for (int i = 0; i < object->dlpi_phnum; ++i) {
    const auto& segment = object->dlpi_phdr[i];
    if (segment.p_type == PT_LOAD && (segment.p_flags & PF_X) != 0) {
      uintptr_t from = object->dlpi_addr + segment.p_vaddr;
      range.start = from < range.start ? from : range.start;
      range.end = from + segment.p_memsz > range.end ? from + segment.p_memsz : range.end;
    }
  }
  return range.end != 0 ? range : glt::CodeRange{};
}

}  // namespace

namespace glt {
CodeRange code_of(const char* library, uintptr_t address) {
  struct Search {
    const char* library;
    uintptr_t address;
    CodeRange range;
  } search{library, address, {}};
  dl_iterate_phdr(
      [](struct dl_phdr_info* object, size_t, void* data) -> int {
        auto* search = static_cast<Search*>(data);
        bool named = search->library != nullptr && object->dlpi_name != nullptr &&
                     std::strstr(object->dlpi_name, search->library) != nullptr;
        CodeRange range = executable_range(object);
        if (named || (search->library == nullptr && range.contains(search->address))) {
          search->range = range;
          return 1;
        }
        return 0;
      },
      &search);
  return search.range;
}
}  // namespace glt

using glt::copy_string;

#ifdef GLT_CUDA_TRACE
namespace {

using glt::code_of;
using glt::CodeRange;

CodeRange cuda_allocator_code;  // libc10_cuda.so
CodeRange torch_cuda_code;      // libtorch_cuda.so

// Which of libtorch's allocators made the call on this thread's stack, if
// one did: the frames are walked up to the first one in its code.
enum class Caller { Outside, CudaAllocator, HostAllocator };

// This library's own code (the test binary's), where the canary's driver
// call is made: the canary's walk must get back to it through the driver's
// and CUPTI's frames, or no caller can be told apart (see the canary).
CodeRange own_code;
thread_local bool walking_canary = false;
thread_local bool canary_walk_came_back = false;

struct Walk {
  bool pinned;
  int frames;
  bool left_own_code;
  Caller caller;
};

_Unwind_Reason_Code step(struct _Unwind_Context* context, void* data) {
  auto* walk = static_cast<Walk*>(data);
  uintptr_t ip = _Unwind_GetIP(context);
  if (walking_canary) {
    bool own = own_code.contains(ip);
    canary_walk_came_back = canary_walk_came_back || (own && walk->left_own_code);
    walk->left_own_code = walk->left_own_code || !own;
  }
  if (cuda_allocator_code.contains(ip)) {
    walk->caller = Caller::CudaAllocator;
    return _URC_END_OF_STACK;
  }
  if (walk->pinned && torch_cuda_code.contains(ip)) {
    walk->caller = Caller::HostAllocator;
    return _URC_END_OF_STACK;
  }
  // The allocator's call is a few frames below the driver's; a caller this
  // far up is the test's own code.
  return ++walk->frames > 96 ? _URC_END_OF_STACK : _URC_NO_REASON;
}

Caller caller_of_this_call(bool pinned) {
  Walk walk{pinned, 0, false, Caller::Outside};
  _Unwind_Backtrace(step, &walk);
  return walk.caller;
}

// A live allocation: where its events went, and its size.
struct Entry {
  int64_t bytes;
  int32_t device_type;
  int32_t index;
};

// The ledger allocates through malloc, not operator new: its own nodes must
// not count as libtorch's host objects.
template <typename T>
struct MallocAllocator {
  using value_type = T;
  MallocAllocator() = default;
  template <typename U>
  MallocAllocator(const MallocAllocator<U>&) {}
  T* allocate(size_t n) {
    void* block = std::malloc(n * sizeof(T));
    if (block == nullptr) {
      throw std::bad_alloc();
    }
    return static_cast<T*>(block);
  }
  void deallocate(T* block, size_t) { std::free(block); }
  template <typename U>
  bool operator==(const MallocAllocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const MallocAllocator<U>&) const { return false; }
};

// Keys: device and host pointers share CUDA's unified address space; a
// cuMemCreate handle is an opaque number, kept apart by its top bit.
constexpr uint64_t kHandleBit = 1ull << 63;

std::mutex ledger_mutex;
std::unordered_map<uint64_t, Entry, std::hash<uint64_t>, std::equal_to<uint64_t>,
                   MallocAllocator<std::pair<const uint64_t, Entry>>>
    ledger;

std::atomic<bool> switched_off{false};
// Set while CUPTI is subscribed ahead of its first user (see
// glt_driver_calls_subscribe_ahead): a call then is as one made before the
// subscription, neither counted nor in the ledger.
std::atomic<bool> ahead_of_users{false};
// libtorch's CUDA allocator's own calls are reported only where they are
// the tensors' source; otherwise they are its segments, which the trace
// tracker counts already.
std::atomic<bool> counting_cuda_allocator{false};

typedef CUresult (*cu_ctx_get_device_fn)(CUdevice*);
cu_ctx_get_device_fn cu_ctx_get_device = nullptr;

int32_t current_device() {
  CUdevice device = 0;
  if (cu_ctx_get_device == nullptr || cu_ctx_get_device(&device) != CUDA_SUCCESS) {
    return 0;
  }
  return static_cast<int32_t>(device);
}

void record_allocation(uint64_t key, int64_t bytes, bool pinned, int32_t index) {
  if (bytes <= 0 || switched_off.load(std::memory_order_relaxed)) {
    return;
  }
  int32_t device_type = glt::kOutsideLibtorchDeviceType;
  switch (caller_of_this_call(pinned)) {
    case Caller::Outside:
      device_type = glt::kOutsideLibtorchDeviceType;
      break;
    case Caller::CudaAllocator:
      if (pinned || !counting_cuda_allocator.load(std::memory_order_relaxed)) {
        return;
      }
      device_type = glt::kCudaAllocatorCallsDeviceType;
      break;
    case Caller::HostAllocator:
      // Counted from the host allocator's statistics in process scope; the
      // events name the sites, and count on the hook's threads.
      device_type = glt::kPinnedByLibtorchDeviceType;
      break;
  }
  int32_t slot_index = pinned ? -1 : index;
  {
    std::lock_guard<std::mutex> guard(ledger_mutex);
    ledger[key] = Entry{bytes, device_type, slot_index};
  }
  void* address = reinterpret_cast<void*>(key);
  glt::report_to_hook(address, bytes, device_type, slot_index);
  glt::report_process_event(address, bytes, device_type, slot_index);
}

void record_free(uint64_t key) {
  Entry entry;
  {
    std::lock_guard<std::mutex> guard(ledger_mutex);
    auto found = ledger.find(key);
    if (found == ledger.end()) {
      return;
    }
    entry = found->second;
    ledger.erase(found);
  }
  void* address = reinterpret_cast<void*>(key);
  glt::report_to_hook(address, -entry.bytes, entry.device_type, entry.index);
  glt::report_process_event(address, -entry.bytes, entry.device_type, entry.index);
}

// A call that returns `*dptr`, `bytesize` long, on the current device.
template <typename Params>
void record_device_allocation(const Params* p) {
  record_allocation(*p->dptr, static_cast<int64_t>(p->bytesize), false, current_device());
}

// Called by CUPTI on the calling thread. It must not throw: CUPTI is C.
void CUPTIAPI on_driver_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) noexcept {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || ahead_of_users.load(std::memory_order_relaxed)) {
    return;
  }
  const auto* call = static_cast<const CUpti_CallbackData*>(data);
  if (call->callbackSite != CUPTI_API_EXIT || call->functionReturnValue == nullptr ||
      *static_cast<const CUresult*>(call->functionReturnValue) != CUDA_SUCCESS) {
    return;
  }
  const void* params = call->functionParams;
  try {
    switch (id) {
      case CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2:
        record_device_allocation(static_cast<const cuMemAlloc_v2_params*>(params));
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2: {
        auto* p = static_cast<const cuMemAllocPitch_v2_params*>(params);
        record_allocation(*p->dptr, static_cast<int64_t>(*p->pPitch * p->Height), false, current_device());
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged:
        record_device_allocation(static_cast<const cuMemAllocManaged_params*>(params));
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync:
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz:
        record_device_allocation(static_cast<const cuMemAllocAsync_params*>(params));
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync:
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz:
        record_device_allocation(static_cast<const cuMemAllocFromPoolAsync_params*>(params));
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemCreate: {
        auto* p = static_cast<const cuMemCreate_params*>(params);
        bool on_device = p->prop != nullptr && p->prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
        record_allocation(*p->handle | kHandleBit, static_cast<int64_t>(p->size), !on_device,
                          on_device ? p->prop->location.id : -1);
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost:
      case CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2: {
        auto* p = static_cast<const cuMemAllocHost_v2_params*>(params);
        record_allocation(reinterpret_cast<uint64_t>(*p->pp), static_cast<int64_t>(p->bytesize), true, -1);
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc: {
        auto* p = static_cast<const cuMemHostAlloc_params*>(params);
        record_allocation(reinterpret_cast<uint64_t>(*p->pp), static_cast<int64_t>(p->bytesize), true, -1);
        break;
      }
      case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
        record_free(static_cast<const cuMemFree_v2_params*>(params)->dptr);
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync:
      case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz:
        record_free(static_cast<const cuMemFreeAsync_params*>(params)->dptr);
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemRelease:
        record_free(static_cast<const cuMemRelease_params*>(params)->handle | kHandleBit);
        break;
      case CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost:
        record_free(reinterpret_cast<uint64_t>(static_cast<const cuMemFreeHost_params*>(params)->p));
        break;
      default:
        break;
    }
  } catch (...) {
    // Out of memory for the ledger: the event is lost, the program is not.
  }
}

const CUpti_CallbackId kAllocationCalls[] = {
    CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,           CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,       CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz, CUPTI_DRIVER_TRACE_CBID_cuMemCreate,
    CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost,          CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc,          CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
    CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,          CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuMemRelease,            CUPTI_DRIVER_TRACE_CBID_cuMemFreeHost,
};

// CUPTI's entry points, found in the process (libtorch_cpu of the CUDA wheel
// needs libcupti, so it is loaded with libtorch) or loaded beside it.
struct Cupti {
  decltype(&cuptiSubscribe) subscribe = nullptr;
  decltype(&cuptiUnsubscribe) unsubscribe = nullptr;
  decltype(&cuptiEnableCallback) enable_callback = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

bool find_cupti(Cupti& cupti, std::string& why) {
  void* library = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
  if (library == nullptr) {
    library = dlopen("libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  }
  if (library == nullptr) {
    library = dlopen("libcupti.so", RTLD_NOW | RTLD_GLOBAL);
  }
  if (library == nullptr) {
    const char* err = dlerror();
    why = std::string("CUPTI (libcupti.so.13) is not loaded and could not be loaded: ") +
          (err != nullptr ? err : "dlopen failed") +
          ". It ships in the nvidia-cuda-cupti wheel PyTorch's CUDA wheel installs (nvidia/cu13/lib); put that "
          "folder on LD_LIBRARY_PATH";
    return false;
  }
  cupti.subscribe = reinterpret_cast<decltype(cupti.subscribe)>(dlsym(library, "cuptiSubscribe"));
  cupti.unsubscribe = reinterpret_cast<decltype(cupti.unsubscribe)>(dlsym(library, "cuptiUnsubscribe"));
  cupti.enable_callback = reinterpret_cast<decltype(cupti.enable_callback)>(dlsym(library, "cuptiEnableCallback"));
  cupti.result_string = reinterpret_cast<decltype(cupti.result_string)>(dlsym(library, "cuptiGetResultString"));
  if (cupti.subscribe == nullptr || cupti.unsubscribe == nullptr || cupti.enable_callback == nullptr) {
    why = "the loaded libcupti lacks cuptiSubscribe, cuptiUnsubscribe or cuptiEnableCallback";
    return false;
  }
  void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (driver != nullptr) {
    cu_ctx_get_device = reinterpret_cast<cu_ctx_get_device_fn>(dlsym(driver, "cuCtxGetDevice"));
  }
  return true;
}

std::string result_text(const Cupti& cupti, CUptiResult result) {
  const char* text = nullptr;
  if (cupti.result_string != nullptr) {
    cupti.result_string(result, &text);
  }
  return std::string(text != nullptr ? text : "unknown CUPTI error") + " (CUPTI result " +
         std::to_string(static_cast<int>(result)) + ")";
}

std::mutex subscription_mutex;
Cupti cupti;
CUpti_SubscriberHandle subscriber = nullptr;
int subscription_users = 0;

// Subscribes to CUPTI and enables the allocation calls' callbacks, under
// subscription_mutex. False, with `why`, where it cannot.
bool subscribe(std::string& why) {
  if (cupti.subscribe == nullptr && !find_cupti(cupti, why)) {
    return false;
  }
  cuda_allocator_code = code_of("libc10_cuda.so");
  torch_cuda_code = code_of("libtorch_cuda.so");
  own_code = code_of(nullptr, reinterpret_cast<uintptr_t>(&caller_of_this_call));
  CUptiResult result = cupti.subscribe(&subscriber, on_driver_call, nullptr);
  if (result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED) {
    subscriber = nullptr;
    why =
        "another CUPTI subscriber holds CUPTI in this process (a profiler: torch.profiler's Kineto, Nsight "
        "Systems, or a tool loaded through CUDA_INJECTION64_PATH), and CUPTI takes one. Run leak tests without "
        "the profiler, or profile in a separate run";
    return false;
  }
  if (result != CUPTI_SUCCESS) {
    subscriber = nullptr;
    why = "cuptiSubscribe failed: " + result_text(cupti, result);
    return false;
  }
  for (CUpti_CallbackId id : kAllocationCalls) {
    result = cupti.enable_callback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
    if (result != CUPTI_SUCCESS) {
      cupti.unsubscribe(subscriber);
      subscriber = nullptr;
      why = "cuptiEnableCallback failed: " + result_text(cupti, result);
      return false;
    }
  }
  return true;
}

}  // namespace

// The CUDA driver's entry points the canary calls, from the loaded driver.
namespace {
struct Driver {
  CUresult (*retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*release)(CUdevice) = nullptr;
  CUresult (*push)(CUcontext) = nullptr;
  CUresult (*pop)(CUcontext*) = nullptr;
  CUresult (*alloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*free)(CUdeviceptr) = nullptr;
  CUresult (*alloc_host)(void**, size_t) = nullptr;
  CUresult (*free_host)(void*) = nullptr;
};

bool find_driver(Driver& driver, std::string& why) {
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (library == nullptr) {
    why = "the CUDA driver (libcuda.so.1) is not loaded";
    return false;
  }
  auto find = [&](auto& entry, const char* name) {
    entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(dlsym(library, name));
    return entry != nullptr;
  };
  if (!(find(driver.retain, "cuDevicePrimaryCtxRetain") && find(driver.release, "cuDevicePrimaryCtxRelease_v2") &&
        find(driver.push, "cuCtxPushCurrent_v2") && find(driver.pop, "cuCtxPopCurrent_v2") &&
        find(driver.alloc, "cuMemAlloc_v2") && find(driver.free, "cuMemFree_v2") &&
        find(driver.alloc_host, "cuMemAllocHost_v2") && find(driver.free_host, "cuMemFreeHost"))) {
    why = "the loaded CUDA driver lacks one of the calls the canary makes";
    return false;
  }
  return true;
}

// Runs `body` with cuda:device's primary context current on this thread.
template <typename F>
CUresult in_context(const Driver& driver, int device, F&& body) {
  CUcontext context = nullptr;
  CUresult result = driver.retain(&context, device);
  if (result != CUDA_SUCCESS) {
    return result;
  }
  result = driver.push(context);
  if (result == CUDA_SUCCESS) {
    result = body();
    CUcontext popped = nullptr;
    driver.pop(&popped);
  }
  driver.release(device);
  return result;
}
}  // namespace

#endif  // GLT_CUDA_TRACE

extern "C" {

// Starts counting driver allocation calls for one more user (CUPTI is
// subscribed for the first). On failure *why says what stands in the way
// (another subscriber, no CUPTI, a build without CUDA headers) and nothing
// is counted; the caller does not call glt_driver_calls_stop then.
void glt_driver_calls_start(char** why) {
  *why = nullptr;
#ifdef GLT_CUDA_TRACE
  std::lock_guard<std::mutex> guard(subscription_mutex);
  if (subscription_users > 0) {
    ++subscription_users;
    return;
  }
  std::string reason;
  if (subscriber == nullptr && !subscribe(reason)) {
    *why = copy_string(reason);
    return;
  }
  ahead_of_users.store(false, std::memory_order_relaxed);
  subscription_users = 1;
#else
  *why = copy_string(
      "this build of gpu-leak-test found no CUDA headers (see the build warning), so it cannot subscribe to CUPTI");
#endif
}

// Subscribes to CUPTI ahead of its first user, where nothing holds it yet:
// CUPTI's start-up (13 to 18 ms on an H200) then runs on another thread
// while CUDA starts. The callbacks report nothing until
// glt_driver_calls_start takes the subscription over, and
// glt_driver_calls_release_unused hands it back where no user came. A
// failure here is left for glt_driver_calls_start to find and explain.
void glt_driver_calls_subscribe_ahead() {
#ifdef GLT_CUDA_TRACE
  std::lock_guard<std::mutex> guard(subscription_mutex);
  if (subscription_users > 0 || subscriber != nullptr) {
    return;
  }
  ahead_of_users.store(true, std::memory_order_relaxed);
  std::string ignored;
  if (!subscribe(ignored)) {
    ahead_of_users.store(false, std::memory_order_relaxed);
  }
#endif
}

// Unsubscribes a subscription made ahead that no user took over.
void glt_driver_calls_release_unused() {
#ifdef GLT_CUDA_TRACE
  std::lock_guard<std::mutex> guard(subscription_mutex);
  if (subscription_users == 0 && subscriber != nullptr) {
    cupti.unsubscribe(subscriber);
    subscriber = nullptr;
    ahead_of_users.store(false, std::memory_order_relaxed);
  }
#endif
}

// One user fewer; the last one hands CUPTI back, so a profiler run later in
// the process can subscribe.
void glt_driver_calls_stop() {
#ifdef GLT_CUDA_TRACE
  std::lock_guard<std::mutex> guard(subscription_mutex);
  if (subscription_users > 0 && --subscription_users == 0) {
    cupti.unsubscribe(subscriber);
    subscriber = nullptr;
    std::lock_guard<std::mutex> ledger_guard(ledger_mutex);
    ledger.clear();
  }
#endif
}

// For tests of the "cannot measure" verdict: reports nothing while set.
void glt_driver_calls_switch_off(int off) {
#ifdef GLT_CUDA_TRACE
  switched_off.store(off != 0, std::memory_order_relaxed);
#endif
}

// Reports what libtorch's CUDA allocator asks the driver for (on != 0):
// where caching is off, or the cudaMallocAsync backend reports nothing to
// the hook, that is each tensor.
void glt_driver_calls_count_cuda_allocator(int on) {
#ifdef GLT_CUDA_TRACE
  counting_cuda_allocator.store(on != 0, std::memory_order_relaxed);
#else
  (void)on;
#endif
}

// Holds CUPTI as a profiler would, until released with the same call and
// hold = 0: for tests of the message a second subscriber gets. *why is set
// where it could not subscribe.
void glt_driver_calls_hold_cupti_as_profiler(int hold, char** why) {
  *why = nullptr;
#ifdef GLT_CUDA_TRACE
  static CUpti_SubscriberHandle profiler = nullptr;
  std::lock_guard<std::mutex> guard(subscription_mutex);
  std::string reason;
  if (cupti.subscribe == nullptr && !find_cupti(cupti, reason)) {
    *why = copy_string(reason);
    return;
  }
  if (hold != 0 && profiler == nullptr) {
    CUptiResult result = cupti.subscribe(
        &profiler, [](void*, CUpti_CallbackDomain, CUpti_CallbackId, const void*) {}, nullptr);
    if (result != CUPTI_SUCCESS) {
      profiler = nullptr;
      *why = copy_string("cuptiSubscribe failed: " + result_text(cupti, result));
    }
  } else if (hold == 0 && profiler != nullptr) {
    cupti.unsubscribe(profiler);
    profiler = nullptr;
  }
#else
  (void)hold;
  *why = copy_string("this build of gpu-leak-test found no CUDA headers");
#endif
}

// A canary: allocates `bytes` through the driver from here, outside
// libtorch's allocators, on cuda:device (pinned host memory in its context
// where `pinned`), and frees it; the allocation is reported as any other
// would be in between. *why is set where a driver call failed. *walked is
// 1 where the caller's stack could be walked from CUPTI's callback back to
// this call through the driver's frames: without that, libtorch's own
// driver calls cannot be told from others.
void glt_driver_calls_canary(int device, int64_t bytes, int pinned, int* walked, char** why) {
  *why = nullptr;
  *walked = 0;
#ifdef GLT_CUDA_TRACE
  Driver driver;
  std::string reason;
  if (!find_driver(driver, reason)) {
    *why = copy_string(reason);
    return;
  }
  walking_canary = true;
  canary_walk_came_back = false;
  CUresult result = in_context(driver, device, [&] {
    if (pinned != 0) {
      void* block = nullptr;
      CUresult made = driver.alloc_host(&block, static_cast<size_t>(bytes));
      return made == CUDA_SUCCESS ? driver.free_host(block) : made;
    }
    CUdeviceptr block = 0;
    CUresult made = driver.alloc(&block, static_cast<size_t>(bytes));
    return made == CUDA_SUCCESS ? driver.free(block) : made;
  });
  walking_canary = false;
  *walked = canary_walk_came_back ? 1 : 0;
  if (result != CUDA_SUCCESS) {
    *why = copy_string("the canary's driver allocation failed with CUresult " + std::to_string(result));
  }
#else
  (void)device;
  (void)bytes;
  (void)pinned;
  *why = copy_string("this build of gpu-leak-test found no CUDA headers");
#endif
}

}  // extern "C"
