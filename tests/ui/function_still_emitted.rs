// On a macro error the function is still emitted, so code that calls it
// compiles and only the macro's own error is shown.
use gpu_leak_test::gpu_leak_test;

#[gpu_leak_test(nonsense = 1)]
fn helper_used_elsewhere() -> u32 {
    7
}

fn main() {
    let _: u32 = helper_used_elsewhere();
}
