-- Serialises concurrent migrate calls; released at the transaction's end.
SELECT pg_advisory_xact_lock($1)
