-- Session-level: held until unlocked or the connection ends, so a leader
-- that dies hands the role over as soon as the server notices.
SELECT pg_try_advisory_lock($1)
