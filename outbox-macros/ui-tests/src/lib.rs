//! A stand-in for the `outbox` crate in the compile-fail tests of
//! `#[outbox_task]` (tests/ui.rs): the same attribute, re-exported under the
//! same path, and nothing else.
//!
//! trybuild builds each test's dependencies afresh, in a target directory of
//! its own and with flags of its own. Against the real crate that meant
//! building sqlx, tokio and the rest a second time, about two minutes of
//! every CI run, for errors that come from the macro alone: on a mistake it
//! emits the error and the user's item unchanged, with no reference to the
//! engine. Code that compiles is checked against the real crate, in
//! outbox-macros/tests/expansion.rs.

pub use outbox_macros::outbox_task;
