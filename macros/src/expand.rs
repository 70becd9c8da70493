//! Code generation: the test function becomes an inner function and one
//! chain of public builder calls, the same a hand-written test makes.
use crate::validate::{Form, Options, TestFn, Value};
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned, ToTokens};

/// `.options(Options { key: Some(value), ..Default::default() })` with the
/// keys given; nothing where none is. Text values are parsed by the
/// field's own type, after the same rule accepted them here.
fn options_call(options: &Options, krate: &syn::Path) -> TokenStream {
    let fields = options.values.iter().map(|(key, value)| {
        let key = format_ident!("{key}");
        let value = match value {
            Value::Number(number) => quote!(#number),
            Value::Flag(flag) => quote!(#flag),
            Value::Whole(count) => quote!(#count),
            Value::Text(text) => quote!(#krate::__private::checked_text(#text)),
        };
        quote!(#key: ::core::option::Option::Some(#value),)
    });
    if options.values.is_empty() {
        return quote!();
    }
    quote!(.options(#krate::Options { #(#fields)* ..::core::default::Default::default() }))
}

pub(crate) fn test(options: &Options, test: TestFn) -> TokenStream {
    let TestFn { function, form, device, params } = test;
    let krate = options.krate.clone().unwrap_or_else(|| syn::parse_quote!(::gpu_leak_test));
    let syn::ItemFn { attrs, vis, sig, block } = function;
    let name = &sig.ident;
    // Kept on the body's function, where its bounds apply.
    let where_clause = &sig.generics.where_clause;
    let output = &sig.output;
    let inner = format_ident!("__gpu_leak_test_{}", name);
    let (device_pat, device_ty) = match &device {
        Some(typed) => (typed.pat.to_token_stream(), typed.ty.to_token_stream()),
        None => (quote!(_), quote!(#krate::tch::Device)),
    };
    let outer_params = params.iter().map(|(_, typed)| typed);
    let inner_params = params.iter().map(|(name, typed)| {
        let ty = &typed.ty;
        quote!(#name: #ty)
    });
    let names: Vec<&syn::Ident> = params.iter().map(|(name, _)| name).collect();
    // The body form runs the inner function once per iteration, so every
    // argument is cloned; the setup form runs it once and moves them.
    let (method, args, outer_output, closure_move) = match form {
        Form::Body => (quote!(check), quote!(#(::core::clone::Clone::clone(&#names)),*), quote!(), quote!()),
        Form::Fallible => (quote!(try_check), quote!(#(::core::clone::Clone::clone(&#names)),*), quote!(#output), quote!()),
        Form::Setup => (quote!(check_with_setup), quote!(#(#names),*), quote!(), quote!(move)),
    };
    // rstest (written below this attribute) adds #[test] to each case.
    let has_test_attribute =
        attrs.iter().any(|a| a.path().segments.last().is_some_and(|s| s.ident == "test" || s.ident == "rstest"));
    let test_attribute = if has_test_attribute { quote!() } else { quote!(#[::core::prelude::v1::test]) };
    let line = quote_spanned!(name.span()=> ::core::line!());
    // A failure `#[should_panic]` expects is shown as expected in the index.
    let expect_failure = attrs
        .iter()
        .any(|a| a.path().is_ident("should_panic"))
        .then(|| quote!(.expect_failure(true)));
    let options = options_call(options, &krate);
    quote! {
        #test_attribute
        #(#attrs)*
        #vis fn #name(#(#outer_params),*) #outer_output {
            #[allow(clippy::needless_pass_by_value, unused_mut, non_snake_case)]
            fn #inner(#device_pat: #device_ty, #(#inner_params),*) #output #where_clause #block
            #krate::LeakTest::for_test_function(::core::stringify!(#name), ::core::module_path!())
                .location(::core::concat!(::core::file!(), ":", #line), ::core::env!("CARGO_MANIFEST_DIR"))
                #options
                #expect_failure
                .#method(#closure_move |__gpu_leak_test_device| #inner(__gpu_leak_test_device, #args))
        }
    }
}

#[cfg(test)]
mod snapshots {
    //! The expansion of each form, pretty-printed, against the files in
    //! `macros/snapshots/`. `UPDATE_SNAPSHOTS=1 cargo test -p
    //! gpu-leak-test-macros` rewrites them; review the diff.
    use super::*;
    use crate::{parse, validate};

    fn expand_source(attr: &str, item: &str) -> String {
        let raw = parse::options(attr.parse().unwrap()).unwrap();
        let options = validate::options(&raw).unwrap();
        let function = validate::function(syn::parse_str(item).unwrap()).unwrap();
        let file: syn::File = syn::parse2(test(&options, function)).unwrap();
        prettyplease::unparse(&file)
    }

    fn check(name: &str, attr: &str, item: &str) {
        let actual = format!("// #[gpu_leak_test({attr})]\n// {item}\n{}", expand_source(attr, item));
        // The run-time CARGO_MANIFEST_DIR: cargo sets it, and nextest remaps
        // it where an archive runs from a checkout the build never saw.
        let root = std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo and nextest set CARGO_MANIFEST_DIR");
        let path = std::path::Path::new(&root).join("snapshots").join(format!("{name}.rs"));
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &actual).unwrap();
            return;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; create it with UPDATE_SNAPSHOTS=1 and review it", path.display()));
        assert_eq!(actual, expected, "{} changed; rerun with UPDATE_SNAPSHOTS=1 and review the diff", path.display());
    }

    #[test]
    fn body_form_clones_its_arguments_for_every_iteration() {
        check("body_form", "threshold_mb = 1.0, device = \"cpu\"", "fn keeps(device: tch::Device) { let _ = device; }");
    }

    #[test]
    fn setup_form_moves_its_arguments_once() {
        check(
            "setup_form",
            "iterations = 8, scope = \"process\"",
            "fn training(device: Device, steps: usize) -> impl FnMut() { move || { let _ = (device, steps); } }",
        );
    }

    #[test]
    fn fallible_form_returns_the_first_error() {
        check("fallible_form", "", "fn fallible() -> Result<(), String> { Ok(()) }");
    }

    #[test]
    fn a_where_clause_stays_on_the_body() {
        check("where_clause", "", "fn bounded(n: u32) where u32: Copy { let _ = n; }");
    }

    #[test]
    fn a_renamed_crate_and_rstest_below() {
        check("renamed_crate_rstest", "crate = leak", "#[rstest] #[case(1)] fn cases(#[case] n: u32) { let _ = n; }");
    }
}
