//! `#[derive(TensorRefs)]`: enumerates the tensors a struct holds, field by
//! field (`state.cache[3]`).
use proc_macro2::TokenStream;
use quote::quote;

/// The container's `#[tensor_refs(crate = path)]`, for a renamed dependency.
fn crate_path(attrs: &[syn::Attribute]) -> syn::Result<syn::Path> {
    let mut krate: syn::Path = syn::parse_quote!(::gpu_leak_test);
    for attr in attrs.iter().filter(|a| a.path().is_ident("tensor_refs")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("crate") {
                krate = meta.value()?.parse()?;
                Ok(())
            } else {
                Err(meta.error("unknown tensor_refs option on the struct; the only one is `crate = path`"))
            }
        })?;
    }
    Ok(krate)
}

fn is_skipped(field: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("tensor_refs")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("unknown tensor_refs option on a field; the only one is `skip`"))
            }
        })?;
    }
    Ok(skip)
}

pub(crate) fn derive(input: syn::DeriveInput) -> syn::Result<TokenStream> {
    let krate = crate_path(&input.attrs)?;
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
            #krate::__private::with_suffix(path, ::core::format_args!(#suffix), |path| {
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
