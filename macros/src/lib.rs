//! The `#[gpu_leak_test]` attribute and `#[derive(TensorRefs)]`. They stay
//! thin: `parse` reads the attribute's syntax, `validate` checks values
//! and the function (with the rules the runtime uses, from the one table of
//! options in `gpu_leak_test_options`), and
//! `expand` writes the builder calls a hand-written test would make.
extern crate proc_macro;

mod expand;
mod parse;
mod refs;
mod validate;

use proc_macro::TokenStream;
use proc_macro2::TokenStream as TokenStream2;
use quote::quote;

/// Turns a test function into a leak test.
///
/// ```ignore
/// #[gpu_leak_test(threshold_mb = 1.0, iterations = 8, device = "cuda", scope = "process")]
/// fn keeps_nothing(device: tch::Device) -> impl FnMut() {
///     let model = build(device);      // setup: runs once
///     move || model.step()            // one iteration
/// }
/// ```
///
/// is the same as writing, by hand:
///
/// ```ignore
/// #[test]
/// fn keeps_nothing() {
///     gpu_leak_test::LeakTest::for_test_function("keeps_nothing", module_path!())
///         .location(concat!(file!(), ":", line!()), env!("CARGO_MANIFEST_DIR"))
///         .options(gpu_leak_test::Options {
///             threshold_mb: Some(1.0),                 // threshold_mb = 1.0
///             iterations: Some(8),                     // iterations = 8
///             device: Some(gpu_leak_test::settings::DeviceChoice::Cuda(0)), // device = "cuda"
///             scope: Some(gpu_leak_test::settings::Scope::Process),          // scope = "process"
///             ..Default::default()
///         })
///         .check_with_setup(|device| { let model = build(device); move || model.step() })
/// }
/// ```
///
/// Each option maps to the field of `gpu_leak_test::Options` of the same
/// name (`warmup`, `peak_mb` and `attribution_iterations` too; the one
/// table of options in `gpu_leak_test_options` lists them, and text values
/// are checked here with the runtime's rules and arrive typed); `crate =
/// path` names this crate where it was renamed. A body returning `()` becomes
/// `.check(|device| ...)`, one returning `Result<(), E>` becomes
/// `.try_check(|device| ...)`. Other parameters (rstest's cases and
/// fixtures, with `#[rstest]` written below this attribute) are passed
/// through, cloned for each iteration of the body form.
///
/// On an error the function is still emitted beside the error, so the rest of
/// the crate keeps compiling.
///
/// The function is a `#[test]`: in a doctest, which runs only its `main`,
/// nothing calls it, so a leaking doctest still passes. Write leak tests in
/// `tests/` or a `#[cfg(test)]` module, or call `LeakTest` by hand in a
/// doctest's code.
#[proc_macro_attribute]
pub fn gpu_leak_test(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_tokens = TokenStream2::from(item.clone());
    let checked = parse::options(attr.into())
        .and_then(|raw| validate::options(&raw))
        .and_then(|options| Ok((options, validate::function(syn::parse(item)?)?)));
    match checked {
        Ok((options, function)) => expand::test(&options, function).into(),
        Err(error) => with_error(error, item_tokens),
    }
}

/// The function next to the `compile_error!`, so only the real error shows.
fn with_error(error: syn::Error, item: TokenStream2) -> TokenStream {
    let error = error.to_compile_error();
    quote!(#error #item).into()
}

/// `#[derive(TensorRefs)]`: enumerates the tensors a struct holds, field by
/// field (`state.cache[3]`). Fields that hold no tensors and do not
/// implement `TensorRefs` are skipped with `#[tensor_refs(skip)]`; a renamed
/// dependency is named with `#[tensor_refs(crate = path)]` on the struct.
#[proc_macro_derive(TensorRefs, attributes(tensor_refs))]
pub fn derive_tensor_refs(item: TokenStream) -> TokenStream {
    match syn::parse::<syn::DeriveInput>(item).and_then(refs::derive) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}
