//! The `#[gpu_leak_test]` attribute. It stays thin: it parses its options,
//! keeps the test function's body in an inner function, and expands into one
//! call of `gpu_leak_test::__private`. Everything else is runtime code.
extern crate proc_macro;

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, FnArg, ItemFn, Lit, Pat, ReturnType, Type};

const OPTIONS: &str = "threshold_mb, iterations, warmup, device, scope, peak_mb, attribution_iterations, crate";

/// Turns a test function into a leak test. See the `gpu-leak-test` crate docs
/// for the options and the forms the function can take.
#[proc_macro_attribute]
pub fn gpu_leak_test(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_tokens = TokenStream2::from(item.clone());
    let options = match parse_options(attr.into()) {
        Ok(options) => options,
        Err(error) => return with_error(error, item_tokens),
    };
    let function = match syn::parse::<ItemFn>(item) {
        Ok(function) => function,
        Err(error) => return with_error(error, item_tokens),
    };
    match expand(options, function) {
        Ok(tokens) => tokens.into(),
        Err(error) => with_error(error, item_tokens),
    }
}

/// On an error, the function is still emitted beside the `compile_error!`,
/// so the rest of the crate keeps compiling and only the real error shows.
fn with_error(error: syn::Error, item: TokenStream2) -> TokenStream {
    let error = error.to_compile_error();
    quote!(#error #item).into()
}

#[derive(Default)]
struct Options {
    threshold_mb: Option<(f64, Span)>,
    iterations: Option<(u32, Span)>,
    warmup: Option<(u32, Span)>,
    device: Option<(String, Span)>,
    scope: Option<(String, Span)>,
    peak_mb: Option<(f64, Span)>,
    attribution_iterations: Option<(u32, Span)>,
    krate: Option<syn::Path>,
}

fn set_once<T>(slot: &mut Option<T>, value: T, key: &str, span: Span) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(span, format!("duplicate option `{key}`: give it once")));
    }
    *slot = Some(value);
    Ok(())
}

fn literal(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        Expr::Group(group) => literal(&group.expr),
        _ => None,
    }
}

fn mib(expr: &Expr, key: &str) -> syn::Result<f64> {
    let value = match literal(expr) {
        Some(Lit::Float(f)) => f.base10_parse::<f64>()?,
        Some(Lit::Int(i)) => i.base10_parse::<f64>()?,
        _ => {
            return Err(syn::Error::new(
                expr.span(),
                format!("`{key}` expects a number of MiB, like `{key} = 1.0`"),
            ))
        }
    };
    Ok(value)
}

fn whole(expr: &Expr, key: &str) -> syn::Result<u32> {
    match literal(expr) {
        Some(Lit::Int(i)) => i.base10_parse::<u32>(),
        _ => Err(syn::Error::new(expr.span(), format!("`{key}` expects a whole number, like `{key} = 5`"))),
    }
}

fn is_valid_device(text: &str) -> bool {
    matches!(text, "auto" | "cpu" | "cuda")
        || text.strip_prefix("cuda:").is_some_and(|n| !n.is_empty() && n.parse::<usize>().is_ok())
}

fn parse_options(attr: TokenStream2) -> syn::Result<Options> {
    let mut options = Options::default();
    let parser = syn::meta::parser(|meta| {
        let span = meta.path.span();
        let key = meta.path.get_ident().map(|i| i.to_string()).unwrap_or_else(|| meta.path.to_token_stream().to_string());
        match key.as_str() {
            "threshold_mb" => {
                let value = mib(&meta.value()?.parse()?, &key)?;
                set_once(&mut options.threshold_mb, (value, span), &key, span)
            }
            "peak_mb" => {
                let value = mib(&meta.value()?.parse()?, &key)?;
                set_once(&mut options.peak_mb, (value, span), &key, span)
            }
            "iterations" => {
                let value = whole(&meta.value()?.parse()?, &key)?;
                if value == 0 {
                    return Err(meta.error("`iterations` must be at least 1"));
                }
                set_once(&mut options.iterations, (value, span), &key, span)
            }
            "warmup" => {
                let value = whole(&meta.value()?.parse()?, &key)?;
                set_once(&mut options.warmup, (value, span), &key, span)
            }
            "attribution_iterations" => {
                let value = whole(&meta.value()?.parse()?, &key)?;
                set_once(&mut options.attribution_iterations, (value, span), &key, span)
            }
            "device" => {
                let expr: Expr = meta.value()?.parse()?;
                let text = match literal(&expr) {
                    Some(Lit::Str(s)) => s.value(),
                    _ => {
                        return Err(syn::Error::new(
                            expr.span(),
                            "`device` expects a string: \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"",
                        ))
                    }
                };
                if !is_valid_device(&text) {
                    return Err(syn::Error::new(
                        expr.span(),
                        format!("unknown device {text:?}: use \"auto\", \"cpu\", \"cuda\" or \"cuda:N\""),
                    ));
                }
                set_once(&mut options.device, (text, span), &key, span)
            }
            "scope" => {
                let expr: Expr = meta.value()?.parse()?;
                let text = match literal(&expr) {
                    Some(Lit::Str(s)) if ["auto", "thread", "process"].contains(&s.value().as_str()) => s.value(),
                    _ => {
                        return Err(syn::Error::new(
                            expr.span(),
                            "`scope` expects \"auto\", \"thread\" or \"process\"",
                        ))
                    }
                };
                set_once(&mut options.scope, (text, span), &key, span)
            }
            "crate" => {
                let path: syn::Path = meta.value()?.parse()?;
                set_once(&mut options.krate, path, &key, span)
            }
            _ => Err(meta.error(format!("unknown option `{key}`; valid options are: {OPTIONS}"))),
        }
    });
    parser.parse2(attr)?;
    Ok(options)
}

/// The three forms a test function can take, told apart by its return type.
enum Form {
    /// Returns `()`: the body is one iteration.
    Body,
    /// Returns `impl FnMut()`: the body is setup, the closure one iteration.
    Setup,
    /// Returns something else (a `Result`): the body is one iteration and an
    /// `Err` ends the test.
    Fallible,
}

fn form_of(output: &ReturnType) -> Form {
    match output {
        ReturnType::Default => Form::Body,
        ReturnType::Type(_, ty) => match &**ty {
            Type::Tuple(tuple) if tuple.elems.is_empty() => Form::Body,
            Type::ImplTrait(bounds) if bounds.to_token_stream().to_string().contains("FnMut") => Form::Setup,
            _ => Form::Fallible,
        },
    }
}

fn is_device_type(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path.path.segments.last().is_some_and(|s| s.ident == "Device"),
        _ => false,
    }
}

fn option_tokens<T: ToTokens>(value: Option<T>) -> TokenStream2 {
    match value {
        Some(v) => quote!(::core::option::Option::Some(#v)),
        None => quote!(::core::option::Option::None),
    }
}

fn expand(options: Options, function: ItemFn) -> syn::Result<TokenStream2> {
    let ItemFn { attrs, vis, sig, block } = function;
    if let Some(asyncness) = &sig.asyncness {
        return Err(syn::Error::new(asyncness.span(), "#[gpu_leak_test] does not support async functions"));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(sig.generics.span(), "#[gpu_leak_test] does not support generic functions"));
    }
    let krate = options.krate.clone().unwrap_or_else(|| syn::parse_quote!(::gpu_leak_test));
    let form = form_of(&sig.output);

    // The device parameter is filled in by the harness; every other
    // parameter stays on the outer function (rstest's cases and fixtures).
    let mut device_param = None;
    let mut outer_params = Vec::new();
    let mut inner_params = Vec::new();
    let mut forwarded = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(typed) = input else {
            return Err(syn::Error::new(input.span(), "#[gpu_leak_test] functions cannot take `self`"));
        };
        if is_device_type(&typed.ty) {
            if device_param.is_some() {
                return Err(syn::Error::new(typed.span(), "only one `Device` parameter is allowed"));
            }
            device_param = Some((typed.pat.clone(), typed.ty.clone()));
            continue;
        }
        let Pat::Ident(ident) = &*typed.pat else {
            return Err(syn::Error::new(typed.pat.span(), "use a plain name for this parameter"));
        };
        let name = &ident.ident;
        let ty = &typed.ty;
        outer_params.push(input.clone());
        inner_params.push(quote!(#name: #ty));
        forwarded.push(name.clone());
    }
    let (device_pat, device_ty) = match device_param {
        Some((pat, ty)) => (quote!(#pat), quote!(#ty)),
        None => (quote!(_), quote!(#krate::__private::Device)),
    };

    let name = &sig.ident;
    let output = &sig.output;
    let inner = format_ident!("__gpu_leak_test_{}", name);
    let line = quote_spanned!(name.span()=> ::core::line!());
    let f64_opt = |o: &Option<(f64, Span)>| option_tokens(o.as_ref().map(|(v, _)| *v));
    let u32_opt = |o: &Option<(u32, Span)>| option_tokens(o.as_ref().map(|(v, _)| *v));
    let threshold_mb = f64_opt(&options.threshold_mb);
    let peak_mb = f64_opt(&options.peak_mb);
    let iterations = u32_opt(&options.iterations);
    let warmup = u32_opt(&options.warmup);
    let attribution_iterations = u32_opt(&options.attribution_iterations);
    let device = option_tokens(options.device.as_ref().map(|(d, _)| quote!(::std::string::String::from(#d))));
    let scope = option_tokens(options.scope.as_ref().map(|(d, _)| quote!(::std::string::String::from(#d))));

    let (runner, args) = match form {
        Form::Body => (quote!(run_body), quote!(#(::core::clone::Clone::clone(&#forwarded)),*)),
        Form::Fallible => (quote!(run_fallible), quote!(#(::core::clone::Clone::clone(&#forwarded)),*)),
        Form::Setup => (quote!(run_setup), quote!(#(#forwarded),*)),
    };
    let outer_output = match form {
        Form::Setup => quote!(),
        _ => quote!(#output),
    };
    let closure_move = match form {
        Form::Setup => quote!(move),
        _ => quote!(),
    };
    let has_test_attribute = attrs.iter().any(|a| {
        a.path().segments.last().is_some_and(|s| s.ident == "test" || s.ident == "rstest")
    });
    let test_attribute = if has_test_attribute { quote!() } else { quote!(#[::core::prelude::v1::test]) };

    Ok(quote! {
        #test_attribute
        #(#attrs)*
        #vis fn #name(#(#outer_params),*) #outer_output {
            #[allow(clippy::needless_pass_by_value, unused_mut)]
            fn #inner(#device_pat: #device_ty, #(#inner_params),*) #output #block
            #krate::__private::#runner(
                #krate::__private::TestInfo {
                    name: ::core::stringify!(#name),
                    module: ::core::module_path!(),
                    file: ::core::file!(),
                    line: #line,
                    manifest_dir: ::core::env!("CARGO_MANIFEST_DIR"),
                },
                #krate::__private::Overrides {
                    threshold_mb: #threshold_mb,
                    iterations: #iterations,
                    warmup: #warmup,
                    device: #device,
                    peak_mb: #peak_mb,
                    attribution_iterations: #attribution_iterations,
                    scope: #scope,
                },
                #closure_move |__gpu_leak_test_device| #inner(__gpu_leak_test_device, #args),
            )
        }
    })
}

/// `#[derive(TensorRefs)]`: enumerates the tensors a struct holds, field by
/// field (`state.cache[3]`). Fields that hold no tensors and do not
/// implement `TensorRefs` can be skipped with `#[tensor_refs(skip)]`.
#[proc_macro_derive(TensorRefs, attributes(tensor_refs))]
pub fn derive_tensor_refs(item: TokenStream) -> TokenStream {
    let input = match syn::parse::<syn::DeriveInput>(item) {
        Ok(input) => input,
        Err(error) => return error.to_compile_error().into(),
    };
    match derive_tensor_refs_impl(input) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

fn is_skipped(field: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("tensor_refs")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("unknown tensor_refs option; the only one is `skip`"))
            }
        })?;
    }
    Ok(skip)
}

fn derive_tensor_refs_impl(input: syn::DeriveInput) -> syn::Result<TokenStream2> {
    let krate: syn::Path = syn::parse_quote!(::gpu_leak_test);
    let syn::Data::Struct(data) = &input.data else {
        return Err(syn::Error::new(input.ident.span(), "#[derive(TensorRefs)] supports structs; implement TensorRefs by hand for enums"));
    };
    let mut visits = Vec::new();
    for (index, field) in data.fields.iter().enumerate() {
        if is_skipped(field)? {
            continue;
        }
        let (member, label) = match &field.ident {
            Some(ident) => (quote!(#ident), ident.to_string()),
            None => {
                let index = syn::Index::from(index);
                (quote!(#index), index.index.to_string())
            }
        };
        let suffix = format!(".{label}");
        visits.push(quote! {
            #krate::refs::with_suffix(path, ::core::format_args!(#suffix), |path| {
                #krate::TensorRefs::for_each_tensor(&self.#member, path, visit)
            });
        });
    }
    let name = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics #krate::TensorRefs for #name #type_generics #where_clause {
            fn for_each_tensor(&self, path: &mut ::std::string::String, visit: &mut dyn ::core::ops::FnMut(&str, &#krate::tch::Tensor)) {
                #(#visits)*
            }
        }
    })
}
