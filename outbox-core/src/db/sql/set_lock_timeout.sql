-- The longest any later statement of this transaction waits for a lock.
SELECT set_config('lock_timeout', $1, true)
