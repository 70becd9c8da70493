// #[gpu_leak_test(iterations = 8, scope = "process")]
// fn training(device: Device, steps: usize) -> impl FnMut() { move || { let _ = (device, steps); } }
#[::core::prelude::v1::test]
fn training(steps: usize) {
    #[allow(clippy::needless_pass_by_value, unused_mut, non_snake_case)]
    fn __gpu_leak_test_training(device: Device, steps: usize) -> impl FnMut() {
        move || {
            let _ = (device, steps);
        }
    }
    ::gpu_leak_test::LeakTest::for_test_function(
            ::core::stringify!(training),
            ::core::module_path!(),
        )
        .location(
            ::core::concat!(::core::file!(), ":", ::core::line!()),
            ::core::env!("CARGO_MANIFEST_DIR"),
        )
        .options(::gpu_leak_test::Options {
            iterations: ::core::option::Option::Some(8u32),
            scope: ::core::option::Option::Some(
                ::gpu_leak_test::__private::checked_text("process"),
            ),
            ..::core::default::Default::default()
        })
        .check_with_setup(move |__gpu_leak_test_device| __gpu_leak_test_training(
            __gpu_leak_test_device,
            steps,
        ))
}
