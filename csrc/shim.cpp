// The C ABI between gpu-leak-test and libtorch.
//
// Every entry point catches every C++ exception and hands its message back as
// a heap string (free it with glt_free_string); nothing unwinds across the
// FFI boundary. Only device-generic c10 headers are used, so building needs no
// CUDA toolkit: the CUDA side of libtorch is reached at run time through its
// registered allocator and device guard, and through dlsym.
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/stack.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/headeronly/version.h>

#include <dlfcn.h>
#include <unistd.h>

#include "shim.h"

// The CUDA trace tracker needs the CUDA allocator's class, whose header pulls
// in the CUDA runtime headers. build.rs defines GLT_CUDA_TRACE where it finds
// them (the torch wheel's nvidia/cu13/include plus nvidia-cuda-crt); without
// them process scope sees CUDA through nothing and says so at run time.
#ifdef GLT_CUDA_TRACE
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace glt {
char* copy_string(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, text.c_str(), text.size() + 1);
  }
  return out;
}
}  // namespace glt

namespace {

using glt::copy_string;

// Runs `body`; on a C++ exception returns its message (without c10's long
// C++ backtrace), otherwise nullptr.
template <typename F>
char* guarded(F&& body) {
  try {
    body();
    return nullptr;
  } catch (const c10::Error& e) {
    return copy_string(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return copy_string(e.what());
  } catch (...) {
    return copy_string("unknown C++ exception");
  }
}

std::string directory_of_loaded_c10() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&c10::GetAllocator), &info) == 0 ||
      info.dli_fname == nullptr) {
    return "";
  }
  std::string path(info.dli_fname);
  auto slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

void* torch_cuda_handle = nullptr;

c10::DeviceAllocator* cuda_allocator() {
  return c10::getDeviceAllocator(c10::DeviceType::CUDA);
}

const c10::impl::DeviceGuardImplInterface* cuda_guard() {
  // Throws "PyTorch is not linked with support for cuda devices" when
  // libtorch_cuda was never loaded.
  return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

}  // namespace

extern "C" {

void glt_free_string(char* text) { std::free(text); }

// Loads libtorch_cuda.so from the folder libc10.so was loaded from, so its
// static initialisers register the CUDA allocator and device guard. Linkers
// drop it with --as-needed when nothing references it. On success *loaded is
// 1; where the library is missing or cannot load (a CPU-only libtorch), it is
// 0 and *why says what dlopen reported.
char* glt_load_torch_cuda(int* loaded, char** why) {
  return guarded([&] {
    *loaded = 0;
    *why = nullptr;
    if (torch_cuda_handle != nullptr) {
      *loaded = 1;
      return;
    }
    std::string path = directory_of_loaded_c10() + "libtorch_cuda.so";
    torch_cuda_handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (torch_cuda_handle == nullptr) {
      // Fall back to the loader's search path (LD_LIBRARY_PATH, runpath).
      torch_cuda_handle = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_GLOBAL);
    }
    if (torch_cuda_handle != nullptr) {
      *loaded = 1;
      glt::leave_out_cuda_allocator();
    } else {
      const char* err = dlerror();
      *why = copy_string(err != nullptr ? err : "dlopen failed");
    }
  });
}

// *loaded is 1 where libtorch_cuda.so is in the process already (loaded by
// glt_load_torch_cuda, or by the test binary's own link), without loading it.
char* glt_torch_cuda_loaded(int* loaded) {
  return guarded([&] {
    if (torch_cuda_handle == nullptr) {
      std::string path = directory_of_loaded_c10() + "libtorch_cuda.so";
      torch_cuda_handle = dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
      if (torch_cuda_handle == nullptr) {
        torch_cuda_handle = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
      }
    }
    *loaded = torch_cuda_handle != nullptr ? 1 : 0;
    if (torch_cuda_handle != nullptr) {
      glt::leave_out_cuda_allocator();
    }
  });
}

char* glt_cuda_device_count(int32_t* count) {
  return guarded([&] { *count = static_cast<int32_t>(cuda_guard()->deviceCount()); });
}

struct glt_stat {
  int64_t current;
  int64_t peak;
};

struct glt_allocator_stats {
  glt_stat allocated_bytes;
  glt_stat reserved_bytes;
  glt_stat active_bytes;
  glt_stat requested_bytes;
  glt_stat allocations;
  glt_stat segments;
  int64_t num_alloc_retries;
  int64_t num_ooms;
};

char* glt_cuda_allocator_stats(int32_t device, glt_allocator_stats* out) {
  return guarded([&] {
    auto stats = cuda_allocator()->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    auto aggregate = [](const c10::CachingDeviceAllocator::StatArray& array) {
      const auto& stat = array[static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE)];
      return glt_stat{stat.current, stat.peak};
    };
    out->allocated_bytes = aggregate(stats.allocated_bytes);
    out->reserved_bytes = aggregate(stats.reserved_bytes);
    out->active_bytes = aggregate(stats.active_bytes);
    out->requested_bytes = aggregate(stats.requested_bytes);
    out->allocations = aggregate(stats.allocation);
    out->segments = aggregate(stats.segment);
    out->num_alloc_retries = stats.num_alloc_retries;
    out->num_ooms = stats.num_ooms;
  });
}

char* glt_cuda_empty_cache() {
  return guarded([&] { cuda_allocator()->emptyCache(); });
}

char* glt_cuda_reset_peak_stats(int32_t device) {
  return guarded([&] { cuda_allocator()->resetPeakStats(static_cast<c10::DeviceIndex>(device)); });
}

char* glt_cuda_synchronize(int32_t device) {
  return guarded([&] { cuda_guard()->synchronizeDevice(static_cast<c10::DeviceIndex>(device)); });
}

char* glt_cuda_driver_memory(int32_t device, uint64_t* free_bytes, uint64_t* total_bytes) {
  return guarded([&] {
    auto info = cuda_allocator()->getMemoryInfo(static_cast<c10::DeviceIndex>(device));
    *free_bytes = info.first;
    *total_bytes = info.second;
  });
}

// The device memory this process holds on `device`, as the driver counts it
// per process (NVML, what nvidia-smi lists): the confirmation view beside
// the counted layers. NVML and the driver are found at run time, so no
// header or link is needed. *available is 0, with *why set, where NVML
// cannot say (no NVML, a container whose processes it does not list, MIG).
char* glt_cuda_process_memory(int32_t device, uint64_t* bytes, int* available, char** why) {
  return guarded([&] {
    *bytes = 0;
    *available = 0;
    *why = nullptr;
    auto unavailable = [&](const std::string& reason) { *why = copy_string(reason); };
    // nvmlProcessInfo_t (the _v2 and _v3 queries' layout).
    struct ProcessInfo {
      unsigned int pid;
      unsigned long long used_gpu_memory;
      unsigned int gpu_instance_id;
      unsigned int compute_instance_id;
    };
    using init_fn = int (*)();
    using by_bus_id_fn = int (*)(const char*, void**);
    using processes_fn = int (*)(void*, unsigned int*, ProcessInfo*);
    using device_get_fn = int (*)(int*, int);
    using bus_id_fn = int (*)(char*, int, int);
    static void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (nvml == nullptr) {
      return unavailable("NVML (libnvidia-ml.so.1) could not be loaded");
    }
    static int initialised = [] {
      auto init = reinterpret_cast<init_fn>(dlsym(nvml, "nvmlInit_v2"));
      return init != nullptr ? init() : -1;
    }();
    if (initialised != 0) {
      return unavailable("nvmlInit_v2 failed with NVML error " + std::to_string(initialised));
    }
    auto by_bus_id = reinterpret_cast<by_bus_id_fn>(dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2"));
    auto processes = reinterpret_cast<processes_fn>(dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses_v3"));
    if (processes == nullptr) {
      processes = reinterpret_cast<processes_fn>(dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses_v2"));
    }
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    auto device_get = driver != nullptr ? reinterpret_cast<device_get_fn>(dlsym(driver, "cuDeviceGet")) : nullptr;
    auto bus_id = driver != nullptr ? reinterpret_cast<bus_id_fn>(dlsym(driver, "cuDeviceGetPCIBusId")) : nullptr;
    if (by_bus_id == nullptr || processes == nullptr || device_get == nullptr || bus_id == nullptr) {
      return unavailable("NVML or the CUDA driver lacks the per-process query");
    }
    // CUDA's ordinal and NVML's index differ under CUDA_VISIBLE_DEVICES;
    // the PCI bus id is the same device to both.
    int cu_device = 0;
    char bus[32] = {};
    void* handle = nullptr;
    if (device_get(&cu_device, device) != 0 || bus_id(bus, sizeof bus, cu_device) != 0 || by_bus_id(bus, &handle) != 0) {
      return unavailable("NVML does not know cuda:" + std::to_string(device));
    }
    ProcessInfo infos[256];
    unsigned int count = 256;
    int status = processes(handle, &count, infos);
    if (status != 0) {
      return unavailable("NVML's process list failed with NVML error " + std::to_string(status));
    }
    unsigned int self = static_cast<unsigned int>(getpid());
    for (unsigned int i = 0; i < count; ++i) {
      if (infos[i].pid != self) {
        continue;
      }
      if (infos[i].used_gpu_memory == ~0ull) {
        return unavailable("NVML does not count memory per process here (a container or MIG)");
      }
      *bytes = infos[i].used_gpu_memory;
      *available = 1;
      return;
    }
    unavailable("NVML does not list this process (its PID namespace differs, or the device has no context yet)");
  });
}

}  // extern "C"

namespace {

// libtorch_cuda's own functions that no header this shim may include
// declares (their headers need cuBLAS's): looked up by their mangled names.
// Null where missing (a CPU-only libtorch, or one that renamed them).
void* torch_cuda_function(const char* mangled) {
  void* symbol = dlsym(RTLD_DEFAULT, mangled);
  if (symbol == nullptr && torch_cuda_handle != nullptr) {
    symbol = dlsym(torch_cuda_handle, mangled);
  }
  return symbol;
}

// What libtorch's first matmul on a thread makes and keeps for good: the
// thread's cuBLAS handle with its workspace, and its cuBLASLt handle and
// workspace (at::cuda::getCurrentCUDABlasHandle, getCurrentCUDABlasLtHandle,
// getCUDABlasLtWorkspace), on the thread's current device and stream. No
// kernel runs, so no GEMM kernel is loaded that the test may never use.
// False where one of them is missing.
bool ready_blas_on_this_thread(int32_t device) {
  // The getters warn on stderr ("no current CUDA context") on a thread
  // that has launched nothing yet, as autograd's worker has not here: the
  // device's primary context is made current first, as a thread's first
  // launch would (cudaSetDevice does since CUDA 12).
  using set_device_fn = int (*)(int);
  static auto set_device = reinterpret_cast<set_device_fn>(dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  if (set_device == nullptr || set_device(device) != 0) {
    return false;
  }
  using no_argument_fn = void* (*)();
  // 2.12 added `bool setup = true`, which changed the mangled name.
  using with_setup_fn = void* (*)(bool);
  void* handle = torch_cuda_function("_ZN2at4cuda24getCurrentCUDABlasHandleEv");
  void* handle_with_setup = torch_cuda_function("_ZN2at4cuda24getCurrentCUDABlasHandleEb");
  void* lt_handle = torch_cuda_function("_ZN2at4cuda26getCurrentCUDABlasLtHandleEv");
  void* lt_workspace = torch_cuda_function("_ZN2at4cuda22getCUDABlasLtWorkspaceEv");
  if ((handle == nullptr && handle_with_setup == nullptr) || lt_handle == nullptr || lt_workspace == nullptr) {
    return false;
  }
  if (handle != nullptr) {
    reinterpret_cast<no_argument_fn>(handle)();
  } else {
    reinterpret_cast<with_setup_fn>(handle_with_setup)(true);
  }
  reinterpret_cast<no_argument_fn>(lt_handle)();
  reinterpret_cast<no_argument_fn>(lt_workspace)();
  return true;
}

}  // namespace

extern "C" {

// at::cuda::clearCublasWorkspaces(). *available is 0 where it is missing.
char* glt_cuda_clear_cublas_workspaces(int* available) {
  return guarded([&] {
    using clear_fn = void (*)();
    void* symbol = torch_cuda_function("_ZN2at4cuda21clearCublasWorkspacesEv");
    *available = symbol != nullptr ? 1 : 0;
    if (symbol != nullptr) {
      reinterpret_cast<clear_fn>(symbol)();
    }
  });
}

// libtorch's cuBLAS state for `device` on the calling thread, made before a
// test measures, where its first matmul would. *ready is 0 where libtorch
// lacks one of the functions, or CUDA's runtime its cudaSetDevice: the
// caller then prewarms through a matmul and its backward.
char* glt_cuda_ready_blas_here(int32_t device, int* ready) {
  return guarded([&] {
    c10::DeviceGuard guard(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    *ready = ready_blas_on_this_thread(device) ? 1 : 0;
  });
}

// The same on autograd's worker thread for `device` (started here if it was
// not), which runs the backward's matmuls. The worker is reached by a
// backward through a view, which runs no kernel, with a hook on the view's
// gradient. On a device's first prewarm the caller runs this on a thread
// beside the test's own: where many processes start CUDA at once, the two
// threads wait on the driver at the same time rather than one after the
// other. Later, with the worker's state made, it runs on the test thread.
char* glt_cuda_ready_blas_on_worker(int32_t device, int* ready) {
  return guarded([&] {
    *ready = 0;
    c10::Device on(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    c10::DeviceGuard guard(on);
    at::AutoGradMode grad_mode(true);
    auto options = at::TensorOptions().dtype(at::kFloat).device(on);
    at::Tensor leaf = at::empty({1}, options).requires_grad_(true);
    at::Tensor view = leaf.view({1});
    std::atomic<bool> ready_there{false};
    view.register_hook([&ready_there, device](const at::Tensor&) { ready_there = ready_blas_on_this_thread(device); });
    torch::autograd::grad({view}, {leaf}, {at::empty({1}, options)});
    *ready = ready_there ? 1 : 0;
  });
}

// Grows the autograd ready queue that runs backward work on a device to
// hold `tasks` at once: autograd's worker thread's queue for CUDA device
// `device`, the calling thread's own for the CPU (`device` below 0). The
// queue is a heap in a std::vector that never shrinks: it grows the first
// time more tasks wait in it than ever before, a one-off of libtorch's host
// objects (8 to 16 tasks: 1.1 KiB on libtorch 2.11) at whichever
// backward() the scheduling gives it. On a GPU that came during
// attribution, and its survivor lifted attribution's trough: a false leak
// (benches/RESULTS.md, "A fifth H100 lease"). Here, before anything is
// measured, a backward whose first node makes `tasks` leaves' gradients
// ready at once puts that many tasks in the queue.
char* glt_grow_autograd_ready_queue(int32_t device, int32_t tasks) {
  return guarded([&] {
    c10::Device on = device < 0 ? c10::Device(c10::DeviceType::CPU)
                                : c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device));
    c10::DeviceGuard guard(on);
    at::AutoGradMode grad_mode(true);
    auto options = at::TensorOptions().dtype(at::kFloat).device(on);
    // Leaves of no elements: no device memory, no kernel (each allocation
    // would be a cudaMalloc under PYTORCH_NO_CUDA_MEMORY_CACHING=1), and
    // their gradients are only captured, never accumulated.
    std::vector<at::Tensor> leaves;
    leaves.reserve(static_cast<size_t>(tasks));
    for (int32_t i = 0; i < tasks; ++i) {
      leaves.push_back(at::empty({0}, options).requires_grad_(true));
    }
    torch::autograd::grad({at::stack(leaves)}, leaves, {at::empty({tasks, 0}, options)});
  });
}

// Pops what autograd's device workers left in the calling thread's own
// ready queue. A worker that finishes a backward() pushes a wake-up task
// (no node, a weak pointer to the backward's GraphTask) into the queue of
// the thread that called it, which pops it only if it has not yet seen the
// backward finish. Where the worker finished first (a short backward, the
// caller descheduled between queueing the root and entering its loop), the
// wake-up stays, and its weak pointer keeps the GraphTask's make_shared
// block (about 1 KiB on libtorch 2.11) allocated. They pile up until a
// backward of this thread enters its loop in time, whose first pops free
// them all: a sawtooth of libtorch's host objects that looks like kept
// blocks (benches/RESULTS.md, "A sixth H100 lease"). A backward on the CPU
// always enters the loop, since its root waits in this very queue, and the
// heap pops wake-ups (tasks without a node) first.
char* glt_drain_autograd_ready_queue() {
  return glt_grow_autograd_ready_queue(-1, 1);
}

// *name is the CUDA allocator backend's own name ("native",
// "cudaMallocAsync"), or null where this build has no CUDA headers.
char* glt_cuda_allocator_backend(char** name) {
  return guarded([&] {
    *name = nullptr;
#ifdef GLT_CUDA_TRACE
    auto* allocator =
        static_cast<c10::cuda::CUDACachingAllocator::CUDAAllocator*>(cuda_allocator());
    *name = copy_string(allocator->name());
#endif
  });
}

// Pinned host memory: the bytes libtorch's CUDA caching host allocator holds
// (handed out or cached for reuse) now and at its peak, for the whole
// process. Its "active" figures are not used: in 2.11 a block freed without
// recorded stream events goes back to the free list without lowering them.
// *available is 0 where libtorch_cuda is not loaded.
char* glt_cuda_pinned_held_bytes(int64_t* current, int64_t* peak, int* available) {
  return guarded([&] {
    *current = 0;
    *peak = 0;
    *available = 0;
    if (torch_cuda_handle == nullptr) {
      return;
    }
    auto stats = at::getHostAllocator(c10::DeviceType::CUDA)->get_stats();
    *current = stats.allocated_bytes.current;
    *peak = stats.allocated_bytes.peak;
    *available = 1;
  });
}

// Starts a new peak window in the pinned host allocator's statistics, as
// the CUDA allocator's resetPeakStats does for device memory.
char* glt_cuda_pinned_reset_peak() {
  return guarded([&] {
    if (torch_cuda_handle != nullptr) {
      at::getHostAllocator(c10::DeviceType::CUDA)->reset_peak_stats();
    }
  });
}

// The libtorch version the shim was compiled against ("2.11.0"): a memory
// baseline is kept per version, since workspaces and kernels change sizes.
const char* glt_libtorch_version() {
  return TORCH_VERSION;
}

// The folder the process loaded libc10.so from (with a trailing slash), or
// "" where the loader cannot say: the Rust side reads the version of the
// libtorch actually loaded beside it, which must be the one compiled
// against (the shim's view of libtorch's classes is that version's).
char* glt_loaded_libtorch_folder(char** folder) {
  return guarded([&] { *folder = copy_string(directory_of_loaded_c10()); });
}

// The model and compute capability of a CUDA device, from the driver API
// (libcuda.so.1, loaded once CUDA is): what a memory baseline is keyed by.
// *available is 0, and *name says why, where the driver cannot tell.
char* glt_cuda_device_kind(int32_t device, char** name, int* major, int* minor, int* available) {
  return guarded([&] {
    *name = nullptr;
    *available = 0;
    using device_get_fn = int (*)(int*, int);
    using get_name_fn = int (*)(char*, int, int);
    using attribute_fn = int (*)(int*, int, int);
    void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    auto device_get = driver != nullptr ? reinterpret_cast<device_get_fn>(dlsym(driver, "cuDeviceGet")) : nullptr;
    auto get_name = driver != nullptr ? reinterpret_cast<get_name_fn>(dlsym(driver, "cuDeviceGetName")) : nullptr;
    auto attribute = driver != nullptr ? reinterpret_cast<attribute_fn>(dlsym(driver, "cuDeviceGetAttribute")) : nullptr;
    if (device_get == nullptr || get_name == nullptr || attribute == nullptr) {
      *name = copy_string("the CUDA driver (libcuda.so.1) is not loaded in this process");
      return;
    }
    // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR and _MINOR.
    constexpr int kMajor = 75;
    constexpr int kMinor = 76;
    int cu_device = 0;
    char text[256] = {};
    if (device_get(&cu_device, device) != 0 || get_name(text, sizeof text - 1, cu_device) != 0 ||
        attribute(major, kMajor, cu_device) != 0 || attribute(minor, kMinor, cu_device) != 0) {
      *name = copy_string("the CUDA driver does not know cuda:" + std::to_string(device));
      return;
    }
    *name = copy_string(text);
    *available = 1;
  });
}

// Returns the pinned blocks no tensor uses to the system
// (torch._C._host_emptyCache).
char* glt_cuda_pinned_empty_cache() {
  return guarded([&] {
    if (torch_cuda_handle != nullptr) {
      at::getHostAllocator(c10::DeviceType::CUDA)->empty_cache();
    }
  });
}

// The pinned canary: takes `bytes` from libtorch's caching host allocator
// and returns them, its cache emptied around, reading the bytes it holds
// before, while the block is held, and after. Straight from the allocator:
// tch's pin_memory passes a device, which libtorch 2.11 warns about once
// per process, in every test's output.
char* glt_cuda_pinned_canary(int64_t bytes, int64_t* before, int64_t* with, int64_t* after) {
  return guarded([&] {
    *before = *with = *after = 0;
    if (torch_cuda_handle == nullptr) {
      return;
    }
    at::HostAllocator* host = at::getHostAllocator(c10::DeviceType::CUDA);
    host->empty_cache();
    *before = host->get_stats().allocated_bytes.current;
    {
      c10::DataPtr block = host->allocate(static_cast<size_t>(bytes));
      *with = host->get_stats().allocated_bytes.current;
    }
    host->empty_cache();
    *after = host->get_stats().allocated_bytes.current;
  });
}

// ---- The per-thread allocation hook -------------------------------------

// Called for every allocation (size > 0) and free (size < 0) reported to the
// thread's memory-reporting debug info. device_type is c10::DeviceType as an
// integer (0 = CPU, 1 = CUDA); device_index is -1 where libtorch gives none.
// It must not unwind.
typedef void (*glt_event_fn)(void* context, void* ptr, int64_t size, int32_t device_type,
                             int32_t device_index);
// Called for every out-of-memory report, with the size that failed.
typedef void (*glt_oom_fn)(void* context, int64_t size, int32_t device_type, int32_t device_index);
// Called once when libtorch drops its last reference to the hook, which can
// be after glt_hook_pop: autograd threads copy the thread's debug info.
typedef void (*glt_release_fn)(void* context);

namespace {
struct RustHook;

// Every hook alive, so that a C++ heap free reaches each one wherever it
// happens: a block a hooked thread made is often freed by another (an
// autograd device thread's, a pool's), and a free only the freeing thread's
// hook saw would leave a phantom block in the tracker that counted it. A
// fixed table: registering must not allocate, since operator new reports
// here. Hooks beyond it see only their own threads' frees.
constexpr int kMaxLiveHooks = 256;
std::mutex live_hooks_mutex;
RustHook* live_hooks[kMaxLiveHooks] = {};
// Slots in use are all below this: a free looks at no more.
int live_hooks_end = 0;

void register_hook(RustHook* hook, bool alive) {
  std::lock_guard<std::mutex> guard(live_hooks_mutex);
  for (int i = 0; i < kMaxLiveHooks; ++i) {
    if (alive && live_hooks[i] == nullptr) {
      live_hooks[i] = hook;
      live_hooks_end = i + 1 > live_hooks_end ? i + 1 : live_hooks_end;
      return;
    }
    if (!alive && live_hooks[i] == hook) {
      live_hooks[i] = nullptr;
      while (live_hooks_end > 0 && live_hooks[live_hooks_end - 1] == nullptr) {
        --live_hooks_end;
      }
      return;
    }
  }
}

struct RustHook final : c10::MemoryReportingInfoBase {
  RustHook(glt_event_fn on_event, glt_oom_fn on_oom, glt_release_fn on_release, void* context, uint8_t tag)
      : on_event(on_event), on_oom(on_oom), on_release(on_release), context(context), tag(tag) {
    register_hook(this, true);
    if (tag == 0) {
      glt::count_untagged_hooks(1);
    }
  }
  ~RustHook() override {
    if (tag == 0) {
      glt::count_untagged_hooks(-1);
    }
    register_hook(this, false);
    on_release(context);
  }

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t, size_t, c10::Device device) override {
    on_event(context, ptr, alloc_size, static_cast<int32_t>(device.type()), device.index());
  }
  void reportOutOfMemory(int64_t alloc_size, size_t, size_t, c10::Device device) override {
    on_oom(context, alloc_size, static_cast<int32_t>(device.type()), device.index());
  }
  bool memoryProfilingEnabled() const override { return true; }

  glt_event_fn on_event;
  glt_oom_fn on_oom;
  glt_release_fn on_release;
  void* context;
  // The tracker's tag for its C++ heap blocks (host_objects.cpp), or 0
  // where none was free: then each block reaches the tracker itself.
  uint8_t tag;
};
}  // namespace
}  // extern "C"

namespace {
// The hook this thread pushed last, while it is pushed: the C++ heap's
// events on the test's own thread skip the debug-info lookup below.
thread_local RustHook* own_hook = nullptr;

RustHook* innermost_hook() {
  return dynamic_cast<RustHook*>(c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE));
}
}  // namespace

namespace glt {
uint8_t current_hook_tag(bool* hooked) {
  RustHook* hook = own_hook != nullptr ? own_hook : innermost_hook();
  *hooked = hook != nullptr;
  return hook != nullptr ? hook->tag : 0;
}

void report_to_hook(void* ptr, int64_t size, int32_t device_type, int32_t index) {
  if (size < 0) {
    // A free, to every hook: each tracker forgets the block if it had it.
    std::lock_guard<std::mutex> guard(live_hooks_mutex);
    for (int i = 0; i < live_hooks_end; ++i) {
      if (RustHook* hook = live_hooks[i]) {
        hook->on_event(hook->context, ptr, size, device_type, index);
      }
    }
    return;
  }
  // libtorch copies this thread's debug info to the autograd threads that
  // run its backward(), so they count allocations too, as they do tensors.
  RustHook* hook = own_hook != nullptr ? own_hook : innermost_hook();
  if (hook != nullptr) {
    hook->on_event(hook->context, ptr, size, device_type, index);
  }
}
}  // namespace glt

extern "C" {

// Pushes a hook onto this thread's debug-info stack. The hook owns `context`
// from here on and calls on_release exactly once, also when pushing fails.
// `tag` is the tracker's from glt_host_objects_acquire_tag, or 0.
char* glt_hook_push(glt_event_fn on_event, glt_oom_fn on_oom, glt_release_fn on_release,
                    void* context, int tag) {
  return guarded([&] {
    auto hook = std::make_shared<RustHook>(on_event, on_oom, on_release, context, static_cast<uint8_t>(tag));
    RustHook* pushed = hook.get();
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, std::move(hook));
    own_hook = pushed;
    glt::count_pushed_hooks(1);
  });
}

// Pops the hook this thread pushed last. Fails if something else was pushed
// on top of it (hooks must be removed in reverse order).
char* glt_hook_pop() {
  return guarded([&] {
    auto popped = c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    if (dynamic_cast<RustHook*>(popped.get()) == nullptr) {
      // Someone else's profiler state: put it back and say so.
      c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, std::move(popped));
      throw std::runtime_error(
          "the innermost profiler state on this thread is not a gpu-leak-test hook");
    }
    glt::count_pushed_hooks(-1);
    own_hook = innermost_hook();
  });
}

namespace {
// A profiler state that asks for memory profiling and hears nothing: what
// glt_grow_cpu_size_table runs under. Not a RustHook, so no tracker counts
// what this thread allocates meanwhile.
struct SilentProfiling final : c10::MemoryReportingInfoBase {
  void reportMemoryUsage(void*, int64_t, size_t, size_t, c10::Device) override {}
  bool memoryProfilingEnabled() const override { return true; }
};
}  // namespace

// Grows libtorch's table of profiled CPU blocks to hold `blocks` at once.
// A thread whose profiler state asks for memory profiling (the hook, in
// thread scope) has each CPU block it allocates recorded in one
// process-wide std::unordered_map (c10::ProfiledCPUMemoryReporter), whose
// bucket array never shrinks. The insert that first finds it full pays for
// a bigger one, on whichever hooked thread makes it, however many of the
// blocks are other tests': a one-off of libtorch's host objects (541
// buckets, 4,344 B, where 257 were before) that can land in a leak test's
// measured window. Here, before anything is measured, `blocks` records of
// addresses this function owns go in and out. No allocator call: only the
// table's own nodes and buckets are allocated.
char* glt_grow_cpu_size_table(int64_t blocks) {
  return guarded([&] {
    c10::DebugInfoGuard silent(c10::DebugInfoKind::PROFILER_STATE, std::make_shared<SilentProfiling>());
    // A hook pushed beneath it counts nothing of this either.
    struct Hidden {
      RustHook* beneath = own_hook;
      Hidden() { own_hook = nullptr; }
      ~Hidden() { own_hook = beneath; }
    } hidden;
    // Addresses no other block can have while this lives.
    std::vector<char> owned(static_cast<size_t>(blocks));
    auto& table = c10::profiledCPUMemoryReporter();
    for (char& address : owned) {
      table.New(&address, 1);
    }
    for (char& address : owned) {
      table.Delete(&address);
    }
  });
}

// ---- Process-wide sources ------------------------------------------------
//
// The per-thread hook sees only threads it was pushed on. These two sources
// see every thread of the process: a counting wrapper around the CPU
// allocator, and the CUDA caching allocator's trace tracker. Both report to
// one sink, set while a process-scope observer is active.

// Called for every allocation (size > 0) and free (size < 0; the size may be
// -1 where the source does not know it) on any thread. It must not unwind.
// The CUDA tracker calls it with the per-device allocator lock held.
typedef void (*glt_process_event_fn)(void* ptr, int64_t size, int32_t device_type, int32_t device_index);

namespace {
std::atomic<glt_process_event_fn> process_sink{nullptr};
}  // namespace
}  // extern "C"

namespace glt {
void report_process_event(void* ptr, int64_t size, int32_t device_type, int32_t index) {
  glt_process_event_fn sink = process_sink.load(std::memory_order_acquire);
  if (sink != nullptr) {
    sink(ptr, size, device_type, index);
  }
}
}  // namespace glt

extern "C" {

namespace {
void report_process_event(void* ptr, int64_t size, c10::DeviceType type, int32_t index) {
  glt::report_process_event(ptr, size, static_cast<int32_t>(type), index);
}

// Wraps the CPU allocator that was current when it was installed. Blocks
// keep the wrapped allocator's deleter: a raw block (context == data, as
// DefaultCPUAllocator makes them) gets a counting raw deleter that calls the
// original, so raw_allocate/raw_deallocate keep working; any other block gets
// a small context that remembers the original context and deleter.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  explicit CountingCpuAllocator(c10::Allocator* inner) : inner_(inner) {
    inner_raw_deleter_ = inner->raw_deleter();
  }

  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr block = inner_->allocate(bytes);
    void* data = block.get();
    if (data == nullptr) {
      return block;
    }
    c10::Device device = block.device();
    report_process_event(data, static_cast<int64_t>(bytes), c10::DeviceType::CPU, -1);
    if (inner_raw_deleter_ != nullptr && block.get_context() == data &&
        block.get_deleter() == inner_raw_deleter_) {
      block.release_context();
      return {data, data, &delete_raw, device};
    }
    auto* wrapped = new Wrapped{data, block.get_context(), block.get_deleter()};
    block.release_context();
    return {data, wrapped, &delete_wrapped, device};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return inner_raw_deleter_ != nullptr ? &delete_raw : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    inner_->copy_data(dest, src, count);
  }

 private:
  struct Wrapped {
    void* data;
    void* context;
    c10::DeleterFnPtr deleter;
  };

  static void delete_raw(void* data) {
    report_process_event(data, -1, c10::DeviceType::CPU, -1);
    raw_deleter_of_installed()(data);
  }

  static void delete_wrapped(void* context) {
    auto* wrapped = static_cast<Wrapped*>(context);
    report_process_event(wrapped->data, -1, c10::DeviceType::CPU, -1);
    if (wrapped->deleter != nullptr) {
      wrapped->deleter(wrapped->context);
    }
    delete wrapped;
  }

  static c10::DeleterFnPtr raw_deleter_of_installed();

  c10::Allocator* inner_;
  c10::DeleterFnPtr inner_raw_deleter_ = nullptr;
};

// Installed once and never freed: blocks it handed out call its deleters for
// as long as the process lives.
std::atomic<CountingCpuAllocator*> counting_cpu_allocator{nullptr};
std::atomic<c10::DeleterFnPtr> installed_inner_raw_deleter{nullptr};

c10::DeleterFnPtr CountingCpuAllocator::raw_deleter_of_installed() {
  return installed_inner_raw_deleter.load(std::memory_order_acquire);
}

#ifdef GLT_CUDA_TRACE
// The trace gives the size asked for; the per-thread hook and the
// allocator's allocated-bytes count give the block's, rounded up to the
// caching allocator's 512-byte granule. Round the same way so both scopes
// count alike (blocks over 1 MiB can keep an unsplit remainder of up to
// 1 MiB that only the block size shows).
int64_t block_size(size_t requested) {
  constexpr size_t kMinBlockSize = 512;
  return static_cast<int64_t>(requested < kMinBlockSize ? kMinBlockSize
                                                        : (requested + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize);
}

void on_cuda_trace(const c10::CachingDeviceAllocator::TraceEntry& entry) {
  using Action = c10::CachingDeviceAllocator::TraceEntry::Action;
  void* ptr = reinterpret_cast<void*>(entry.addr_);
  if (entry.action_ == Action::ALLOC) {
    report_process_event(ptr, block_size(entry.size_), c10::DeviceType::CUDA, entry.device_);
  } else if (entry.action_ == Action::FREE_COMPLETED) {
    report_process_event(ptr, -static_cast<int64_t>(entry.size_), c10::DeviceType::CUDA, entry.device_);
  }
}
#endif
}  // namespace

// Sets (or, with nullptr, clears) the sink the process-wide sources report to.
void glt_process_set_sink(glt_process_event_fn sink) { process_sink.store(sink, std::memory_order_release); }

// Installs the counting CPU allocator once; later calls do nothing. *installed
// is 1 when the CPU allocator in force is the counting one.
char* glt_process_install_cpu(int* installed) {
  return guarded([&] {
    *installed = 0;
    if (counting_cpu_allocator.load() == nullptr) {
      c10::Allocator* inner = c10::GetCPUAllocator();
      auto* counting = new CountingCpuAllocator(inner);
      installed_inner_raw_deleter.store(inner->raw_deleter(), std::memory_order_release);
      counting_cpu_allocator.store(counting, std::memory_order_release);
      // SetCPUAllocator ignores an allocator of lower priority than the one
      // in force, and the priority in force cannot be read: try the default
      // first, then the highest.
      c10::SetCPUAllocator(counting, 0);
      if (c10::GetCPUAllocator() != counting) {
        c10::SetCPUAllocator(counting, 255);
      }
    }
    *installed = c10::GetCPUAllocator() == counting_cpu_allocator.load() ? 1 : 0;
  });
}

// Attaches the trace tracker to the CUDA caching allocator, once per
// process: from then on the allocator calls it for every allocation and free
// of every thread (a no-op while no sink is set). libtorch 2.11 calls trace
// trackers whether or not it records history (record_trace returns early
// only when it does neither; on an H200 the tracker alone saw all 3,789
// events of an LSTM training step), so history recording, which copies every event
// into a ring buffer under a lock, stays as the user left it: a user's own
// torch.cuda.memory._record_memory_history is neither switched on nor off.
//
// The tracker reaches only the per-device allocators that exist, so they are
// created first (the allocator's init(device_count), which lazy CUDA
// initialisation calls later and which then does nothing); this creates no
// CUDA context. *available is 0 where this build has no CUDA headers or
// libtorch_cuda is not loaded; an allocator without trace support
// (cudaMallocAsync) throws, and the message comes back.
char* glt_process_attach_cuda_trace(int* available) {
  return guarded([&] {
    *available = 0;
#ifdef GLT_CUDA_TRACE
    if (torch_cuda_handle == nullptr) {
      return;
    }
    static std::atomic<bool> attached{false};
    if (!attached.load(std::memory_order_acquire)) {
      // The device-generic allocator registered for CUDA is the CUDA caching
      // allocator; static_cast needs no CUDA library symbol at link time.
      auto* allocator =
          static_cast<c10::cuda::CUDACachingAllocator::CUDAAllocator*>(cuda_allocator());
      allocator->init(static_cast<int>(cuda_guard()->deviceCount()));
      allocator->attachAllocatorTraceTracker(&on_cuda_trace);
      attached.store(true, std::memory_order_release);
    }
    *available = 1;
#endif
  });
}

}  // extern "C"
