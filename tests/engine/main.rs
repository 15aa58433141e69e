//! End-to-end tests of the core engine against a real PostgreSQL.

mod cancel;
mod claim_floor;
mod crash_safety;
mod dispatch;
mod durable;
mod events;
mod explain;
mod failures;
mod hand_on;
mod history;
mod migrations;
mod ordering;
mod outcome_lanes;
mod outcome_plans;
mod periodic;
mod poison;
mod results;
mod sql_api;
mod startup;
mod submit;
mod testing_helpers;
mod timeouts;
mod txcomplete;
mod unique;
mod vacuum;
mod workflows;
