//! Run with: cargo test -p guide-snippets
//!
//! The Rust snippets of `docs/guide.md` and `README.md`, compiled. Each
//! snippet appears here line by line and in order, with the definitions it
//! needs around it; `tests/snippets.rs` fails when a snippet no longer
//! does, so the documents cannot drift into code that does not compile.
//! Nothing here is meant to be run.

#![allow(
    dead_code,
    reason = "the snippets define types and functions to show them, not to use them"
)]

// Not formatted: the snippets keep the layout the documents show.
#[rustfmt::skip]
pub mod events;
#[rustfmt::skip]
pub mod guide;
#[rustfmt::skip]
pub mod pooler;
#[rustfmt::skip]
pub mod readme;
#[rustfmt::skip]
pub mod workflows;
