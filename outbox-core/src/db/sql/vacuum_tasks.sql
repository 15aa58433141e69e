-- Vacuums the task table, index entries included: INDEX_CLEANUP AUTO (the
-- default since PostgreSQL 14) skips the indexes when the dead rows sit in
-- few heap pages, which is just how claims leave them, and it is the claim
-- index's entries that must go. SKIP_LOCKED: if autovacuum is at it
-- already, leave it be.
VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) outbox_tasks
