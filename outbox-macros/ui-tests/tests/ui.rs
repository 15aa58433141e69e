//! Compile-fail tests: the messages users see for a wrong #[outbox_task].
//! Each file under tests/ui is compiled and its errors compared with the
//! `.stderr` file beside it (`TRYBUILD=overwrite` rewrites them).

#[test]
fn ui() {
    trybuild::TestCases::new().compile_fail("tests/ui/fail_*.rs");
}
