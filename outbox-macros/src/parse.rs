//! Parses and checks `#[outbox_task(...)]`'s options and the item it is on.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprArray, ExprLit, Ident, Item, Lit, LitStr, Meta, Token};

use crate::duration::parse_millis;

const OPTIONS: &str = "task_type, queue, priority, retry_delays, max_attempts, timeout, unique_by, \
                       unique_period, unique_states, ordering_key, on_dead";

/// The most attempts a type may declare (`outbox::MAX_ATTEMPTS_LIMIT`).
const MAX_ATTEMPTS_LIMIT: u32 = 10_000;

/// A checked task declaration.
pub(crate) struct TaskDecl {
    pub(crate) ident: Ident,
    pub(crate) task_type: String,
    pub(crate) queue: Option<String>,
    pub(crate) priority: Option<i16>,
    pub(crate) retry_delays_ms: Option<Vec<u64>>,
    /// Attempts, when not the retry table's length: the table is cut there
    /// or its last delay repeated up to it.
    pub(crate) max_attempts: Option<u32>,
    pub(crate) timeout_ms: Option<u64>,
    /// Set when the type is unique.
    pub(crate) unique: Option<UniqueDecl>,
    /// The payload field whose value is the ordering key.
    pub(crate) ordering_key: Option<Ident>,
    /// Whether SQL can derive the unique and ordering keys from a JSON
    /// payload exactly as Rust does (see `plain_key_field`).
    pub(crate) keys_from_payload: bool,
    /// `on_dead = "skip"`: a dead task lets its key go on.
    pub(crate) dead_skips_key: bool,
    /// `diagnostic = true` (not listed among the options: for the stock
    /// binary's own types): a worker serving its queue without its handler
    /// is not refused.
    pub(crate) diagnostic: bool,
}

/// `unique_by`, `unique_period` and `unique_states`.
pub(crate) struct UniqueDecl {
    /// Payload fields whose values make the key (empty: one per type).
    pub(crate) fields: Vec<Ident>,
    pub(crate) period_ms: Option<u64>,
    /// State bits beyond the always-covered ones (8 completed, 16 dead).
    pub(crate) extra_states: i16,
}

pub(crate) fn parse(args: TokenStream, item: TokenStream) -> syn::Result<TaskDecl> {
    let PayloadStruct {
        ident,
        fields,
        plain,
    } = struct_ident(item)?;
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(args)?;
    let mut task_type = None;
    let mut queue = None;
    let mut priority = None;
    let mut retry_delays_ms = None;
    let mut max_attempts = None;
    let mut timeout_ms = None;
    let mut unique_by: Option<Vec<Ident>> = None;
    let mut unique_period = None;
    let mut unique_states = None;
    let mut ordering_key = None;
    let mut on_dead = None;
    let mut diagnostic = None;
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
            "max_attempts" => set_once(&mut max_attempts, attempts(&nv.value)?, &meta)?,
            "timeout" => {
                let lit = string(&nv.value, "timeout")?;
                let ms = parse_millis(&lit.value()).map_err(|m| {
                    syn::Error::new(lit.span(), format!("bad timeout {:?}: {m}", lit.value()))
                })?;
                if ms == 0 {
                    return Err(syn::Error::new(lit.span(), "`timeout` must be above zero"));
                }
                set_once(&mut timeout_ms, ms, &meta)?;
            }
            "unique_by" => set_once(&mut unique_by, unique_fields(&nv.value, &fields)?, &meta)?,
            "unique_period" => {
                let lit = string(&nv.value, "unique_period")?;
                let ms = parse_millis(&lit.value()).map_err(|m| {
                    syn::Error::new(
                        lit.span(),
                        format!("bad unique_period {:?}: {m}", lit.value()),
                    )
                })?;
                if ms < 1000 {
                    return Err(syn::Error::new(
                        lit.span(),
                        "`unique_period` must be at least 1s",
                    ));
                }
                set_once(&mut unique_period, ms, &meta)?;
            }
            "unique_states" => set_once(&mut unique_states, states(&nv.value)?, &meta)?,
            "ordering_key" => {
                let lit = string(&nv.value, "ordering_key")?;
                let field = field_named(&lit, &fields, "ordering_key")?;
                set_once(&mut ordering_key, field, &meta)?;
            }
            "on_dead" => {
                let lit = string(&nv.value, "on_dead")?;
                let skip = match lit.value().as_str() {
                    "skip" => true,
                    "block" => false,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "bad on_dead {other:?}: use \"block\" (the default: a dead task holds its ordering key until an operator acts) or \"skip\""
                            ),
                        ));
                    }
                };
                set_once(&mut on_dead, skip, &meta)?;
            }
            "diagnostic" => {
                let Expr::Lit(ExprLit {
                    lit: Lit::Bool(b), ..
                }) = &nv.value
                else {
                    return Err(syn::Error::new(
                        nv.value.span(),
                        "`diagnostic` is true or false",
                    ));
                };
                set_once(&mut diagnostic, b.value, &meta)?;
            }
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
    let unique =
        (unique_by.is_some() || unique_period.is_some() || unique_states.is_some()).then(|| {
            UniqueDecl {
                fields: unique_by.unwrap_or_default(),
                period_ms: unique_period,
                extra_states: unique_states.unwrap_or(0),
            }
        });
    if on_dead.is_some() && ordering_key.is_none() {
        return Err(syn::Error::new(
            Span::call_site(),
            "`on_dead` applies to tasks with an `ordering_key`; add one or remove `on_dead`",
        ));
    }
    let keys_from_payload = unique
        .iter()
        .flat_map(|u| u.fields.iter())
        .chain(ordering_key.iter())
        .all(|f| plain.contains(f));
    Ok(TaskDecl {
        ident,
        keys_from_payload,
        task_type,
        queue,
        priority,
        retry_delays_ms,
        max_attempts,
        timeout_ms,
        unique,
        ordering_key,
        dead_skips_key: on_dead.unwrap_or(false),
        diagnostic: diagnostic.unwrap_or(false),
    })
}

/// The struct's name and its named fields.
/// A payload struct: its name, its named fields, and those whose JSON form
/// is their Rust key form (see [`plain_key_field`]).
struct PayloadStruct {
    ident: Ident,
    fields: Vec<Ident>,
    plain: Vec<Ident>,
}

fn struct_ident(item: TokenStream) -> syn::Result<PayloadStruct> {
    match syn::parse2::<Item>(item)? {
        Item::Struct(s) => {
            if !s.generics.params.is_empty() {
                return Err(syn::Error::new(
                    s.generics.span(),
                    "#[outbox_task] payload structs cannot be generic: a task type names one concrete payload",
                ));
            }
            let fields = s.fields.iter().filter_map(|f| f.ident.clone()).collect();
            // A struct-level rename changes every field's JSON name.
            let renamed = s.attrs.iter().any(|a| serde_mentions(a, &["rename_all"]));
            let plain = s
                .fields
                .iter()
                .filter(|f| !renamed && plain_key_field(f))
                .filter_map(|f| f.ident.clone())
                .collect();
            Ok(PayloadStruct {
                ident: s.ident,
                fields,
                plain,
            })
        }
        Item::Enum(e) => Err(not_a_struct(e.enum_token.span(), "an enum")),
        Item::Fn(f) => Err(not_a_struct(f.sig.fn_token.span(), "a function")),
        Item::Union(u) => Err(not_a_struct(u.union_token.span(), "a union")),
        other => Err(not_a_struct(other.span(), "this item")),
    }
}

/// Whether `attr` is a `#[serde(..)]` naming one of `words`.
fn serde_mentions(attr: &syn::Attribute, words: &[&str]) -> bool {
    if !attr.path().is_ident("serde") {
        return false;
    }
    let text = attr.meta.to_token_stream().to_string();
    words.iter().any(|w| text.contains(w))
}

/// Whether a field, as a key, reads the same from a JSON payload as from
/// the Rust value: an integer, `String` or `bool` under its own name. Its
/// JSON text is then what `serde_json` writes (the unique key) and its
/// text what `to_string` gives (the ordering key), so `outbox_submit` can
/// derive both in SQL. Floats, enums, timestamps, options and renamed
/// fields cannot be matched there.
fn plain_key_field(field: &syn::Field) -> bool {
    const PLAIN: &[&str] = &[
        "i8", "i16", "i32", "i64", "i128", "isize", "u8", "u16", "u32", "u64", "u128", "usize",
        "String", "bool",
    ];
    let renamed = field
        .attrs
        .iter()
        .any(|a| serde_mentions(a, &["rename", "with", "flatten"]));
    let syn::Type::Path(path) = &field.ty else {
        return false;
    };
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    !renamed
        && path.qself.is_none()
        && last.arguments.is_empty()
        && PLAIN.iter().any(|p| last.ident == p)
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
    int_in(
        expr,
        0..=9,
        "`priority` takes an integer from 0 (runs first) to 9 (runs last)",
    )
}

fn attempts(expr: &Expr) -> syn::Result<u32> {
    int_in(
        expr,
        1..=MAX_ATTEMPTS_LIMIT,
        &format!("`max_attempts` takes an integer from 1 (no retry) to {MAX_ATTEMPTS_LIMIT}"),
    )
}

/// An integer literal within `range`; anything else is `message`, at it.
fn int_in<N>(expr: &Expr, range: std::ops::RangeInclusive<N>, message: &str) -> syn::Result<N>
where
    N: std::str::FromStr + PartialOrd,
    N::Err: std::fmt::Display,
{
    match expr {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => match i.base10_parse::<N>() {
            Ok(n) if range.contains(&n) => Ok(n),
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

fn unique_fields(expr: &Expr, fields: &[Ident]) -> syn::Result<Vec<Ident>> {
    let Expr::Array(ExprArray { elems, .. }) = expr else {
        return Err(syn::Error::new(
            expr.span(),
            "`unique_by` takes a list of payload field names, like unique_by = [\"order_id\"]",
        ));
    };
    let mut out: Vec<Ident> = Vec::new();
    for e in elems {
        let lit = string(e, "unique_by")?;
        let name = lit.value();
        let field = field_named(&lit, fields, "unique_by")?;
        if out.contains(&field) {
            return Err(syn::Error::new(
                lit.span(),
                format!("{name:?} is named twice"),
            ));
        }
        out.push(field);
    }
    Ok(out)
}

/// The payload field `lit` names, for `option`.
fn field_named(lit: &LitStr, fields: &[Ident], option: &str) -> syn::Result<Ident> {
    let name = lit.value();
    fields.iter().find(|f| **f == name).cloned().ok_or_else(|| {
        let known: Vec<String> = fields.iter().map(Ident::to_string).collect();
        syn::Error::new(
            lit.span(),
            format!(
                "`{option}` names {name:?}, which is not a field of this struct (its fields: {})",
                known.join(", ")
            ),
        )
    })
}

/// `unique_states`: must list pending, processing and retrying (a task
/// moves between them and back); may add completed and dead.
fn states(expr: &Expr) -> syn::Result<i16> {
    let message = "`unique_states` lists \"pending\", \"processing\" and \"retrying\" (always covered together), and may add \"completed\" and \"dead\"";
    let Expr::Array(ExprArray { elems, .. }) = expr else {
        return Err(syn::Error::new(expr.span(), message));
    };
    let mut bits = 0i16;
    for e in elems {
        let lit = string(e, "unique_states")?;
        bits |= match lit.value().as_str() {
            "pending" => 1,
            "processing" => 2,
            "retrying" => 4,
            "completed" => 8,
            "dead" => 16,
            other => {
                return Err(syn::Error::new(
                    lit.span(),
                    format!("unknown state {other:?}: {message}"),
                ));
            }
        };
    }
    if bits & 7 != 7 {
        return Err(syn::Error::new(expr.span(), message));
    }
    Ok(bits & !7)
}
