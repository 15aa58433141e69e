-- The last position drawn (0 before the first): a relay's read cuts at or
-- below it (event_read.sql).
SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM outbox_event_position_seq
