//! Syntax only: the attribute's `key = value` pairs as written, each once.
use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::Expr;

/// The option names the attribute accepts: the runtime's `Options` fields,
/// plus `crate`.
pub(crate) const NAMES: &[&str] =
    &["threshold_mb", "iterations", "warmup", "device", "scope", "peak_mb", "attribution_iterations", "crate"];

/// One `key = value` as written.
pub(crate) struct RawOption {
    pub(crate) key: String,
    pub(crate) key_span: Span,
    pub(crate) value: Expr,
}

pub(crate) fn options(attr: TokenStream) -> syn::Result<Vec<RawOption>> {
    let mut options: Vec<RawOption> = Vec::new();
    let parser = syn::meta::parser(|meta| {
        let key_span = meta.path.span();
        let key = meta.path.get_ident().map(|i| i.to_string()).unwrap_or_else(|| meta.path.to_token_stream().to_string());
        let key = if key == "r#crate" { "crate".to_string() } else { key };
        if !NAMES.contains(&key.as_str()) {
            return Err(meta.error(format!("unknown option `{key}`; valid options are: {}", NAMES.join(", "))));
        }
        if options.iter().any(|o| o.key == key) {
            return Err(syn::Error::new(key_span, format!("duplicate option `{key}`: give it once")));
        }
        let value: Expr = meta.value()?.parse()?;
        options.push(RawOption { key, key_span, value });
        Ok(())
    });
    parser.parse2(attr)?;
    Ok(options)
}
