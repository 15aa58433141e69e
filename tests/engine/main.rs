//! End-to-end tests of the core engine against a real PostgreSQL.

mod dispatch;
mod failures;
mod migrations;
mod poison;
mod startup;
mod submit;
