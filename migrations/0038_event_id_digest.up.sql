-- What an event recorded by emit_once was (a digest of its aggregate,
-- type and payload), so that a retry with its id can tell the same event
-- (nothing written, as before) from a different one given the id by
-- mistake (refused: the second event would otherwise be lost without a
-- word). Null for ids recorded before this migration and by the SQL
-- function's `once`: those are not compared.
ALTER TABLE outbox_event_ids ADD COLUMN digest text;
