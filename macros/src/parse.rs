//! Syntax only: the attribute's `key = value` pairs as written, each once.
use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::Expr;

use gpu_leak_test_options::{AttributeValue, OPTIONS};

/// The names the attribute accepts: the options of the one table that a
/// test can set, plus `crate`.
fn names() -> impl Iterator<Item = &'static str> {
    OPTIONS.iter().filter(|o| !matches!(o.value, AttributeValue::SuiteOnly)).map(|o| o.name).chain(["crate"])
}

/// One `key = value` as written.
pub(crate) struct RawOption {
    pub(crate) key: String,
    pub(crate) value: Expr,
}

pub(crate) fn options(attr: TokenStream) -> syn::Result<Vec<RawOption>> {
    let mut options: Vec<RawOption> = Vec::new();
    let parser = syn::meta::parser(|meta| {
        let key_span = meta.path.span();
        let key = meta.path.get_ident().map(|i| i.to_string()).unwrap_or_else(|| meta.path.to_token_stream().to_string());
        let key = if key == "r#crate" { "crate".to_string() } else { key };
        if !names().any(|name| name == key) {
            let valid: Vec<&str> = names().collect();
            let why = match gpu_leak_test_options::option(&key) {
                Some(_) => format!(
                    "`{key}` is a setting of the whole suite (gpu-leak-test.yaml or its environment variable), not of one test"
                ),
                None => format!("unknown option `{key}`"),
            };
            return Err(meta.error(format!("{why}; valid options are: {}", valid.join(", "))));
        }
        if options.iter().any(|o| o.key == key) {
            return Err(syn::Error::new(key_span, format!("duplicate option `{key}`: give it once")));
        }
        let value: Expr = meta.value()?.parse()?;
        options.push(RawOption { key, value });
        Ok(())
    });
    parser.parse2(attr)?;
    Ok(options)
}
