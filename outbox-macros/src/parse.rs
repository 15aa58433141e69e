//! Parses and checks `#[outbox_task(...)]`'s options and the item it is on.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprArray, ExprLit, Ident, Item, Lit, LitStr, Meta, Token};

use crate::duration::parse_millis;

const OPTIONS: &str = "task_type, queue, priority, retry_delays";

/// A checked task declaration.
pub(crate) struct TaskDecl {
    pub(crate) ident: Ident,
    pub(crate) task_type: String,
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<i16>,
    pub(crate) retry_delays_ms: Option<Vec<u64>>,
}

pub(crate) fn parse(args: TokenStream, item: TokenStream) -> syn::Result<TaskDecl> {
    let ident = struct_ident(item)?;
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(args)?;
    let mut task_type = None;
    let mut queue = None;
    let mut priority = None;
    let mut retry_delays_ms = None;
    for meta in metas {
        let Meta::NameValue(nv) = &meta else {
            return Err(syn::Error::new(
                meta.span(),
                format!("expected `name = value`; options are: {OPTIONS}"),
            ));
        };
        let name = nv
            .path
            .get_ident()
            .map(Ident::to_string)
            .unwrap_or_default();
        match name.as_str() {
            "task_type" => {
                let lit = string(&nv.value, "task_type")?;
                check_name(&lit, "task_type")?;
                set_once(&mut task_type, lit.value(), &meta)?;
            }
            "queue" => {
                let lit = string(&nv.value, "queue")?;
                check_name(&lit, "queue")?;
                set_once(&mut queue, lit.value(), &meta)?;
            }
            "priority" => set_once(&mut priority, priority_value(&nv.value)?, &meta)?,
            "retry_delays" => set_once(&mut retry_delays_ms, delays(&nv.value)?, &meta)?,
            _ => {
                return Err(syn::Error::new(
                    nv.path.span(),
                    format!(
                        "unknown option `{}`; options are: {OPTIONS}",
                        nv.path.to_token_stream().to_string().replace(' ', "")
                    ),
                ));
            }
        }
    }
    let task_type = task_type.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            "missing `task_type`: write #[outbox_task(task_type = \"area.action\")]",
        )
    })?;
    Ok(TaskDecl {
        ident,
        task_type,
        queue,
        priority,
        retry_delays_ms,
    })
}

fn struct_ident(item: TokenStream) -> syn::Result<Ident> {
    match syn::parse2::<Item>(item)? {
        Item::Struct(s) => {
            if !s.generics.params.is_empty() {
                return Err(syn::Error::new(
                    s.generics.span(),
                    "#[outbox_task] payload structs cannot be generic: a task type names one concrete payload",
                ));
            }
            Ok(s.ident)
        }
        Item::Enum(e) => Err(not_a_struct(e.enum_token.span(), "an enum")),
        Item::Fn(f) => Err(not_a_struct(f.sig.fn_token.span(), "a function")),
        Item::Union(u) => Err(not_a_struct(u.union_token.span(), "a union")),
        other => Err(not_a_struct(other.span(), "this item")),
    }
}

fn not_a_struct(span: Span, what: &str) -> syn::Error {
    syn::Error::new(
        span,
        format!("#[outbox_task] goes on a payload struct, not on {what}; wrap it in a struct"),
    )
}

fn set_once<T>(slot: &mut Option<T>, value: T, meta: &Meta) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(meta.span(), "this option is given twice"));
    }
    *slot = Some(value);
    Ok(())
}

fn string(expr: &Expr, option: &str) -> syn::Result<LitStr> {
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.clone()),
        other => Err(syn::Error::new(
            other.span(),
            format!("`{option}` takes a string literal, like {option} = \"reports\""),
        )),
    }
}

/// Task types and queues: 1 to 128 ASCII letters, digits or `_-.:`.
fn check_name(lit: &LitStr, option: &str) -> syn::Result<()> {
    let value = lit.value();
    let ok = !value.is_empty()
        && value.len() <= 128
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if ok {
        Ok(())
    } else {
        Err(syn::Error::new(
            lit.span(),
            format!("`{option}` must be 1 to 128 ASCII letters, digits or _-.: (got {value:?})"),
        ))
    }
}

fn priority_value(expr: &Expr) -> syn::Result<i16> {
    let message = "`priority` takes an integer from 0 (runs first) to 9 (runs last)";
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => match i.base10_parse::<i16>() {
            Ok(p) if (0..=9).contains(&p) => Ok(p),
            _ => Err(syn::Error::new(i.span(), message)),
        },
        other => Err(syn::Error::new(other.span(), message)),
    }
}

fn delays(expr: &Expr) -> syn::Result<Vec<u64>> {
    let Expr::Array(ExprArray { elems, .. }) = expr else {
        return Err(syn::Error::new(
            expr.span(),
            "`retry_delays` takes a list of durations, like retry_delays = [\"30s\", \"5m\", \"1h\"]",
        ));
    };
    if elems.is_empty() {
        return Err(syn::Error::new(
            expr.span(),
            "`retry_delays` cannot be empty: its length is the number of attempts (at least one)",
        ));
    }
    elems
        .iter()
        .map(|e| {
            let lit = string(e, "retry_delays")?;
            parse_millis(&lit.value()).map_err(|m| {
                syn::Error::new(
                    lit.span(),
                    format!("bad retry delay {:?}: {m}", lit.value()),
                )
            })
        })
        .collect()
}
