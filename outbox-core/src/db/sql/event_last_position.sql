-- The last position drawn (0 before the first): a relay's read cuts at or
-- below it (event_read.sql). With the sequence's cache and increment,
-- which the read checks first (see `head_problem` in event_log.rs).
--
-- Read through pg_sequence_last_value, which holds the sequence's buffer
-- lock, never by selecting from the sequence: that reads the row without
-- the lock, and nextval, when it writes WAL (every 32nd value), puts the
-- value 32 ahead into the row for the length of the WAL insert before it
-- puts the real one back. A select in that window cuts past positions not
-- drawn yet; their events come after the read's snapshot, so the read
-- takes them for rolled back and the relay passes over them (seen: 31
-- committed events never published in a minute of the relay bench).
SELECT coalesce(pg_sequence_last_value(s.seqrelid), 0) AS last,
       s.seqcache AS cache, s.seqincrement AS increment
FROM pg_sequence AS s
WHERE s.seqrelid = 'outbox_event_position_seq'::regclass
