use gpu_leak_test::gpu_leak_test;

#[gpu_leak_test(warmup = 1, warmup = 2)]
fn twice() {}

fn main() {}
