-- Sends signal $2 with value $3 (JSON text) to task $1, in the caller's
-- transaction, through outbox_signal (migration 49, which says what it
-- does); returns whether it was recorded.
SELECT outbox_signal($1, $2, $3::jsonb)
