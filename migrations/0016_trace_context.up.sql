-- The W3C trace context (a traceparent) of the transaction that submitted
-- each task, so that the worker's span for it continues the submitter's
-- trace. It is taken from the transaction-local setting
-- outbox.traceparent, which the Rust submit functions set when the `otel`
-- feature finds a span to continue, and which any other submitter (psql,
-- a trigger, a service in another language calling outbox_submit) can set
-- itself: SET LOCAL outbox.traceparent = '00-<trace id>-<span id>-01'.
-- Unset (or empty) leaves it NULL, which costs nothing. Evaluated once now
-- for the rows already there (no rewrite): they stay NULL.
ALTER TABLE outbox_tasks
    ADD COLUMN trace_context text
    DEFAULT nullif(current_setting('outbox.traceparent', true), '');
