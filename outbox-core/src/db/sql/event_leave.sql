-- Member $2 of subscription $1 stops: its word ends now rather than when
-- it runs out, so the others take its partitions' share at once.
DELETE FROM outbox_event_members WHERE subscription = $1 AND member = $2
