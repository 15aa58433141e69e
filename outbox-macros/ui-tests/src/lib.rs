//! Nothing: this package holds the compile-fail tests of `#[outbox_task]`
//! (tests/ui.rs).
//!
//! trybuild builds each test's dependencies afresh, in a target directory of
//! its own and with flags of its own. Against the real `outbox` crate that
//! meant building sqlx, tokio and the rest a second time, nearly two
//! minutes of every CI run, for errors that come from the macro alone: on a
//! mistake it emits the error and the user's item unchanged, with no
//! reference to the engine. So the tests see the macro's crate under the
//! name `outbox` (see Cargo.toml). Code that compiles is checked against
//! the real crate, in outbox-core/tests/task_attribute.rs.
