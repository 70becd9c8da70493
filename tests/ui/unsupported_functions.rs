use gpu_leak_test::gpu_leak_test;

#[gpu_leak_test]
async fn asynchronous() {}

#[gpu_leak_test]
fn generic<T>() {}

#[gpu_leak_test]
fn two_devices(_a: tch::Device, _b: tch::Device) {}

fn main() {}

#[gpu_leak_test]
unsafe fn unsafe_test() {}

#[gpu_leak_test]
extern "C" fn extern_test() {}
