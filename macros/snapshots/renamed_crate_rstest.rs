// #[gpu_leak_test(crate = leak)]
// #[rstest] #[case(1)] fn cases(#[case] n: u32) { let _ = n; }
#[rstest]
#[case(1)]
fn cases(#[case] n: u32) {
    #[allow(clippy::needless_pass_by_value, unused_mut, non_snake_case)]
    fn __gpu_leak_test_cases(_: leak::tch::Device, n: u32) {
        let _ = n;
    }
    leak::LeakTest::for_test_function(::core::stringify!(cases), ::core::module_path!())
        .location(
            ::core::concat!(::core::file!(), ":", ::core::line!()),
            ::core::env!("CARGO_MANIFEST_DIR"),
        )
        .check(|__gpu_leak_test_device| __gpu_leak_test_cases(
            __gpu_leak_test_device,
            ::core::clone::Clone::clone(&n),
        ))
}
