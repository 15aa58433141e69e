-- Back to every held-back event carrying a time: the relay of migration
-- 36 reads the first event's, so those behind it get the time they were
-- parked.
DROP INDEX outbox_event_parked_due_idx;

UPDATE outbox_event_parked SET retry_at = parked_at
WHERE retry_at IS NULL AND error IS NULL;
