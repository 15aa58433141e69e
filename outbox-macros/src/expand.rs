//! Writes the `Task` impl and the inventory registration.

use proc_macro2::TokenStream;
use quote::quote;

use crate::parse::TaskDecl;

pub(crate) fn expand(task: &TaskDecl, item: &TokenStream) -> TokenStream {
    let ident = &task.ident;
    let task_type = &task.task_type;
    let queue = task
        .queue
        .as_ref()
        .map(|q| quote!(const QUEUE: &'static str = #q;));
    let priority = task.priority.map(|p| quote!(const PRIORITY: i16 = #p;));
    let delays = match (&task.retry_delays_ms, task.max_attempts) {
        (Some(ms), None) => Some(quote! {
            const RETRY_DELAYS: &'static [::outbox::__private::Duration] =
                &[#(::outbox::__private::Duration::from_millis(#ms)),*];
        }),
        // The table (given, or the default) cut at max_attempts, or its
        // last delay repeated up to it: its length is the number of attempts.
        (given, Some(n)) => {
            let n = n as usize;
            let source = match given {
                Some(ms) => quote!(&[#(::outbox::__private::Duration::from_millis(#ms)),*]),
                None => quote!(::outbox::__private::DEFAULT_RETRY_DELAYS),
            };
            Some(quote! {
                const RETRY_DELAYS: &'static [::outbox::__private::Duration] =
                    &::outbox::__private::retry_table::<#n>(#source);
            })
        }
        (None, None) => None,
    };
    let timeout = task.timeout_ms.map(|ms| {
        quote! {
            const TIMEOUT: ::core::option::Option<::outbox::__private::Duration> =
                ::core::option::Option::Some(::outbox::__private::Duration::from_millis(#ms));
        }
    });
    let unique = task.unique.as_ref().map(|u| {
        let fields = &u.fields;
        let period = match u.period_ms {
            Some(ms) => quote!(::core::option::Option::Some(#ms)),
            None => quote!(::core::option::Option::None),
        };
        let states = u.extra_states;
        quote! {
            fn unique(&self) -> ::core::result::Result<::core::option::Option<::outbox::Unique>, ::std::string::String> {
                ::outbox::__private::unique_from_fields(&(#(&self.#fields,)*), #period, #states)
                    .map(::core::option::Option::Some)
            }
        }
    });
    let ordering = task.ordering_key.as_ref().map(|field| {
        quote! {
            fn ordering_key(&self) -> ::core::option::Option<::std::string::String> {
                ::core::option::Option::Some(::std::string::ToString::to_string(&self.#field))
            }
        }
    });
    let skips = task.dead_skips_key.then(|| {
        quote!(
            const DEAD_SKIPS_KEY: bool = true;
        )
    });
    let ordering_of = if task.ordering_key.is_some() {
        quote!(::outbox::__private::ordering_of::<#ident>)
    } else {
        quote!(::outbox::__private::no_ordering)
    };
    let unique_of = if task.unique.is_some() {
        quote!(::outbox::__private::unique_of::<#ident>)
    } else {
        quote!(::outbox::__private::no_unique)
    };
    // What outbox_submit (SQL) needs to derive the same keys from a JSON
    // payload: the fields by their JSON names.
    let json_name = |f: &syn::Ident| {
        let name = f.to_string();
        name.strip_prefix("r#").unwrap_or(&name).to_owned()
    };
    let unique_decl = match &task.unique {
        Some(u) => {
            let names = u.fields.iter().map(json_name);
            let period = match u.period_ms {
                Some(ms) => quote!(::core::option::Option::Some(#ms)),
                None => quote!(::core::option::Option::None),
            };
            let states = u.extra_states;
            quote!(::core::option::Option::Some(::outbox::RegisteredUnique {
                fields: &[#(#names),*],
                period_ms: #period,
                extra_states: #states,
            }))
        }
        None => quote!(::core::option::Option::None),
    };
    let ordering_field = match &task.ordering_key {
        Some(f) => {
            let name = json_name(f);
            quote!(::core::option::Option::Some(#name))
        }
        None => quote!(::core::option::Option::None),
    };
    let keys_from_payload = task.keys_from_payload;
    let diagnostic = task.diagnostic;
    quote! {
        #item

        impl ::outbox::Task for #ident {
            const TASK_TYPE: &'static str = #task_type;
            #queue
            #priority
            #delays
            #timeout
            #unique
            #ordering
            #skips
        }

        ::outbox::__private::inventory::submit! {
            ::outbox::RegisteredTask {
                task_type: <#ident as ::outbox::Task>::TASK_TYPE,
                queue: <#ident as ::outbox::Task>::QUEUE,
                priority: <#ident as ::outbox::Task>::PRIORITY,
                retry_delays: <#ident as ::outbox::Task>::RETRY_DELAYS,
                rust_type: ::core::concat!(::core::module_path!(), "::", ::core::stringify!(#ident)),
                check_payload: ::outbox::__private::check_payload::<#ident>,
                unique_of: #unique_of,
                ordering_of: #ordering_of,
                dead_skips_key: <#ident as ::outbox::Task>::DEAD_SKIPS_KEY,
                unique_decl: #unique_decl,
                ordering_field: #ordering_field,
                keys_from_payload: #keys_from_payload,
                diagnostic: #diagnostic,
            }
        }
    }
}
