// #[gpu_leak_test()]
// fn bounded(n: u32) where u32: Copy { let _ = n; }
#[::core::prelude::v1::test]
fn bounded(n: u32) {
    #[allow(clippy::needless_pass_by_value, unused_mut, non_snake_case)]
    fn __gpu_leak_test_bounded(_: ::gpu_leak_test::tch::Device, n: u32)
    where
        u32: Copy,
    {
        let _ = n;
    }
    ::gpu_leak_test::LeakTest::for_test_function(
            ::core::stringify!(bounded),
            ::core::module_path!(),
        )
        .location(
            ::core::concat!(::core::file!(), ":", ::core::line!()),
            ::core::env!("CARGO_MANIFEST_DIR"),
        )
        .check(|__gpu_leak_test_device| __gpu_leak_test_bounded(
            __gpu_leak_test_device,
            ::core::clone::Clone::clone(&n),
        ))
}
