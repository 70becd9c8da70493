// The numbers the shim's C++ and the Rust side share: the device type each
// reported allocation event carries. c10's own device types (CPU 0, CUDA 1)
// are all >= 0; the shim's kinds are below 0. This file is the one
// definition: build.rs writes it into the shim's header (glt_event_kinds.h),
// and src/probe/hook.rs includes it.

/// c10::DeviceType::CPU: tensor storage through libtorch's CPU allocator.
pub const DEVICE_TYPE_CPU: i32 = 0;
/// c10::DeviceType::CUDA: tensor storage through libtorch's CUDA allocator.
pub const DEVICE_TYPE_CUDA: i32 = 1;
/// libtorch's host objects: the C++ heap, counted through the replaceable
/// operator new (host_objects.cpp).
pub const DEVICE_TYPE_HOST_OBJECTS: i32 = -2;
/// Memory allocated through the CUDA driver outside libtorch's allocators
/// (driver_calls.cpp); the index is the CUDA device, or -1 for pinned host
/// memory.
pub const DEVICE_TYPE_OUTSIDE_LIBTORCH: i32 = -3;
/// What libtorch's CUDA allocator itself asks the driver for (its segments;
/// with caching off or the cudaMallocAsync backend, each tensor).
pub const DEVICE_TYPE_CUDA_ALLOCATOR_CALLS: i32 = -4;
/// Pinned host memory libtorch's caching host allocator asks the driver for
/// (pin_memory()): CPU tensors.
pub const DEVICE_TYPE_PINNED_BY_LIBTORCH: i32 = -5;
/// The Rust heap: what Rust code allocates through the counting global
/// allocator (src/layer/rust_heap.rs). Rust's own kind: the shim never
/// reports it.
pub const DEVICE_TYPE_RUST_HEAP: i32 = -6;

/// The shim's kinds as C++ names them in glt_event_kinds.h.
#[allow(dead_code)] // read by build.rs only
pub const SHIM_EVENT_KINDS: [(&str, i32); 4] = [
    ("kHostObjectsDeviceType", DEVICE_TYPE_HOST_OBJECTS),
    ("kOutsideLibtorchDeviceType", DEVICE_TYPE_OUTSIDE_LIBTORCH),
    ("kCudaAllocatorCallsDeviceType", DEVICE_TYPE_CUDA_ALLOCATOR_CALLS),
    ("kPinnedByLibtorchDeviceType", DEVICE_TYPE_PINNED_BY_LIBTORCH),
];
