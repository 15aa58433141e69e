//! docs/guide.md, section 8: the test helpers, compiled.

#![allow(
    dead_code,
    reason = "the snippet is compiled to keep the guide true, not run"
)]

// Not formatted: the snippet keeps the layout the guide shows.
#[rustfmt::skip]
#[path = "testing/snippet.rs"]
mod snippet;
