// #[gpu_leak_test(threshold_mb = 1.0, device = "cpu")]
// fn keeps(device: tch::Device) { let _ = device; }
#[::core::prelude::v1::test]
fn keeps() {
    #[allow(clippy::needless_pass_by_value, unused_mut, non_snake_case)]
    fn __gpu_leak_test_keeps(device: tch::Device) {
        let _ = device;
    }
    ::gpu_leak_test::LeakTest::for_test_function(
            ::core::stringify!(keeps),
            ::core::module_path!(),
        )
        .location(
            ::core::concat!(::core::file!(), ":", ::core::line!()),
            ::core::env!("CARGO_MANIFEST_DIR"),
        )
        .options(::gpu_leak_test::Options {
            threshold_mb: ::core::option::Option::Some(1f64),
            device: ::core::option::Option::Some(
                ::gpu_leak_test::__private::checked_text("cpu"),
            ),
            ..::core::default::Default::default()
        })
        .check(|__gpu_leak_test_device| __gpu_leak_test_keeps(__gpu_leak_test_device))
}
