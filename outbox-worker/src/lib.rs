//! The outbox worker: the stock `outbox-worker` binary's commands as a
//! library, the built-in diagnostic task types, and a private PostgreSQL
//! for demos, benchmarks and tests.

pub mod builtin;
pub mod cli;
pub mod demo;
pub mod local_postgres;

pub use cli::{main, main_with};
