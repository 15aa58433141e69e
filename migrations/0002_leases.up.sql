-- Roles a worker holds for the cluster (the maintenance leader), as leases
-- that run out unless renewed. A session-level advisory lock is held for as
-- long as the server keeps the session, which for a half-open connection
-- (the client gone silent, the socket still open) can be hours; a lease
-- runs out on the database's clock whatever happens to the holder.
CREATE TABLE outbox_leases (
    name        text PRIMARY KEY,
    holder      text NOT NULL,
    -- Bumped whenever the holder changes.
    term        bigint NOT NULL DEFAULT 1,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
