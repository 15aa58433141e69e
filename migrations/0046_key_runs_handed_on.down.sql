-- Back to migration 45: a key handed on goes on one task at a time (the
-- outcome statements of the version before never call this function).
DROP FUNCTION outbox_hold_runs(bigint[], text, integer, timestamptz);
