// #[gpu_leak_test()]
// fn fallible() -> Result<(), String> { Ok(()) }
#[::core::prelude::v1::test]
fn fallible() -> Result<(), String> {
    #[allow(clippy::needless_pass_by_value, unused_mut, non_snake_case)]
    fn __gpu_leak_test_fallible(_: ::gpu_leak_test::tch::Device) -> Result<(), String> {
        Ok(())
    }
    ::gpu_leak_test::LeakTest::for_test_function(
            ::core::stringify!(fallible),
            ::core::module_path!(),
        )
        .location(
            ::core::concat!(::core::file!(), ":", ::core::line!()),
            ::core::env!("CARGO_MANIFEST_DIR"),
        )
        .try_check(|__gpu_leak_test_device| __gpu_leak_test_fallible(
            __gpu_leak_test_device,
        ))
}
