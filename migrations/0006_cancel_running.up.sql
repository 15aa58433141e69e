-- outbox: cancelling a running task. An operator's cancel of a PROCESSING
-- task sets this and NOTIFYs the worker holding it (the heartbeat reports
-- it too, as a fallback); whatever the attempt writes afterwards, the task
-- ends dead with the reason "cancelled by an operator".
ALTER TABLE outbox_tasks ADD COLUMN cancel_requested_at timestamptz;
