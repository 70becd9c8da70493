//! What the attribute's values and the test function must be, checked at
//! compile time with spanned errors. Each key's kind and rule come from the
//! one table of options (`gpu_leak_test_options`), whose rules the runtime
//! checks the environment and the config file with.
use crate::parse::RawOption;
use gpu_leak_test_options::AttributeValue;
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, ExprUnary, FnArg, ItemFn, Lit, Pat, PatType, ReturnType, Type, UnOp};

/// One checked value, typed as the runtime's field takes it.
pub(crate) enum Value {
    Number(f64),
    Flag(bool),
    Whole(u32),
    /// Parsed by the field's type (`FromStr`) in the expansion.
    Text(String),
}

/// The attribute's options, checked, in the order written.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) values: Vec<(String, Value)>,
    pub(crate) krate: Option<syn::Path>,
}

fn literal(expr: &Expr) -> Option<&Lit> {
    match expr {
        Expr::Lit(ExprLit { lit, .. }) => Some(lit),
        Expr::Group(group) => literal(&group.expr),
        _ => None,
    }
}

/// A number: a float or integer literal, possibly negated (so the range
/// check, not the syntax check, answers `-1.0`); `what` names it.
fn number(option: &RawOption, check: fn(&f64) -> Result<(), String>, what: &str) -> syn::Result<f64> {
    let (negative, expr) = match &option.value {
        Expr::Unary(ExprUnary { op: UnOp::Neg(_), expr, .. }) => (true, &**expr),
        other => (false, other),
    };
    let magnitude = match literal(expr) {
        Some(Lit::Float(f)) => f.base10_parse::<f64>()?,
        Some(Lit::Int(i)) => i.base10_parse::<f64>()?,
        _ => {
            let key = &option.key;
            return Err(syn::Error::new(option.value.span(), format!("`{key}` expects {what}, like `{key} = 1.0`")));
        }
    };
    let value = if negative { -magnitude } else { magnitude };
    check(&value).map_err(|why| syn::Error::new(option.value.span(), format!("`{}`: {why}", option.key)))?;
    Ok(value)
}

fn flag(option: &RawOption) -> syn::Result<bool> {
    match literal(&option.value) {
        Some(Lit::Bool(b)) => Ok(b.value),
        _ => {
            let key = &option.key;
            Err(syn::Error::new(option.value.span(), format!("`{key}` expects `true` or `false`, like `{key} = true`")))
        }
    }
}

fn whole(option: &RawOption, check: fn(&u32) -> Result<(), String>) -> syn::Result<u32> {
    let key = &option.key;
    let value = match literal(&option.value) {
        Some(Lit::Int(i)) => i.base10_parse::<u32>().map_err(|_| {
            syn::Error::new(option.value.span(), format!("`{key}` expects a whole number up to {}", u32::MAX))
        })?,
        _ => return Err(syn::Error::new(option.value.span(), format!("`{key}` expects a whole number, like `{key} = 5`"))),
    };
    check(&value).map_err(|why| syn::Error::new(option.value.span(), format!("`{key}` {why}")))?;
    Ok(value)
}

fn text(option: &RawOption, check: fn(&str) -> Result<(), String>, expected: &str) -> syn::Result<String> {
    let Some(Lit::Str(s)) = literal(&option.value) else {
        return Err(syn::Error::new(option.value.span(), format!("`{}` expects a string: {expected}", option.key)));
    };
    check(&s.value()).map_err(|why| syn::Error::new(option.value.span(), why))?;
    Ok(s.value())
}

pub(crate) fn options(raw: &[RawOption]) -> syn::Result<Options> {
    let mut options = Options::default();
    for option in raw {
        if option.key == "crate" {
            let path = syn::parse2::<syn::Path>(option.value.to_token_stream())
                .map_err(|_| syn::Error::new(option.value.span(), "`crate` expects a path, like `crate = my_alias`"))?;
            options.krate = Some(path);
            continue;
        }
        let spec = gpu_leak_test_options::option(&option.key)
            .unwrap_or_else(|| unreachable!("parse::options lets only known names through, not {}", option.key));
        let value = match spec.value {
            AttributeValue::Number(check, what) => Value::Number(number(option, check, what)?),
            AttributeValue::Flag => Value::Flag(flag(option)?),
            AttributeValue::Whole(check) => Value::Whole(whole(option, check)?),
            AttributeValue::Text(check, expected) => Value::Text(text(option, check, expected)?),
            AttributeValue::SuiteOnly => unreachable!("parse::options refuses suite-wide options"),
        };
        options.values.push((option.key.clone(), value));
    }
    Ok(options)
}

/// The three forms a test function can take, told apart by its return type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// Returns `()`: the body is one iteration.
    Body,
    /// Returns a closure (`impl FnMut()`, `impl Fn()`, `Box<dyn FnMut()>`):
    /// the body is setup, the closure one iteration.
    Setup,
    /// Returns `Result<(), E>`: the body is one iteration and an `Err` ends
    /// the test.
    Fallible,
}

fn is_closure_type(ty: &Type) -> bool {
    let text = ty.to_token_stream().to_string().replace(' ', "");
    let no_arguments = text.contains("FnMut()") || text.contains("Fn()");
    match ty {
        Type::ImplTrait(_) => no_arguments,
        Type::Path(path) => path.path.segments.last().is_some_and(|s| s.ident == "Box") && text.contains("dyn") && no_arguments,
        _ => false,
    }
}

fn form_of(output: &ReturnType) -> syn::Result<Form> {
    let ReturnType::Type(_, ty) = output else { return Ok(Form::Body) };
    match &**ty {
        Type::Tuple(tuple) if tuple.elems.is_empty() => Ok(Form::Body),
        ty if is_closure_type(ty) => Ok(Form::Setup),
        Type::Path(path) if path.path.segments.last().is_some_and(|s| s.ident.to_string().ends_with("Result")) => {
            Ok(Form::Fallible)
        }
        other => Err(syn::Error::new(
            other.span(),
            "a leak test returns `()` (the body is one iteration), a closure such as `impl FnMut()` or \
             `Box<dyn FnMut()>` (the body is setup, the closure one iteration), or `Result<(), E>`",
        )),
    }
}

fn is_device_type(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path.path.segments.last().is_some_and(|s| s.ident == "Device"),
        _ => false,
    }
}

/// A test function, checked and taken apart for the expansion.
pub(crate) struct TestFn {
    pub(crate) function: ItemFn,
    pub(crate) form: Form,
    /// The `Device` parameter, filled in by the harness.
    pub(crate) device: Option<PatType>,
    /// Every other parameter (rstest's cases and fixtures), by name.
    pub(crate) params: Vec<(syn::Ident, PatType)>,
}

pub(crate) fn function(function: ItemFn) -> syn::Result<TestFn> {
    let sig = &function.sig;
    // `#[test]` written above the attribute is invisible here; the runtime
    // catches the double registration (LeakTest::refuse_a_second_registration).
    if let Some(asyncness) = &sig.asyncness {
        return Err(syn::Error::new(asyncness.span(), "#[gpu_leak_test] does not support async functions"));
    }
    if let Some(unsafety) = &sig.unsafety {
        return Err(syn::Error::new(
            unsafety.span(),
            "#[gpu_leak_test] does not support `unsafe fn`: the harness calls the test, and nothing upholds its \
             safety contract; make the function safe and put the unsafe calls in `unsafe` blocks",
        ));
    }
    if let Some(abi) = &sig.abi {
        return Err(syn::Error::new(
            abi.span(),
            "#[gpu_leak_test] does not support `extern` functions: write a plain Rust `fn` and call the extern \
             function from it",
        ));
    }
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new(sig.generics.span(), "#[gpu_leak_test] does not support generic functions"));
    }
    let form = form_of(&sig.output)?;
    let mut device = None;
    let mut params = Vec::new();
    for input in &sig.inputs {
        let FnArg::Typed(typed) = input else {
            return Err(syn::Error::new(
                input.span(),
                "#[gpu_leak_test] functions cannot take `self`: a leak test is a free function, as a `#[test]` is; \
                 move it out of the `impl` into a `#[cfg(test)] mod tests` and build the value inside it",
            ));
        };
        if is_device_type(&typed.ty) {
            if device.is_some() {
                return Err(syn::Error::new(typed.span(), "only one `Device` parameter is allowed"));
            }
            device = Some(typed.clone());
            continue;
        }
        let Pat::Ident(ident) = &*typed.pat else {
            return Err(syn::Error::new(typed.pat.span(), "use a plain name for this parameter"));
        };
        params.push((ident.ident.clone(), typed.clone()));
    }
    Ok(TestFn { function, form, device, params })
}
