-- Outcomes per minute and queue over the last hour, every worker summed.
SELECT minute, queue, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed
FROM outbox_throughput
WHERE minute > date_trunc('minute', now()) - interval '60 minutes'
GROUP BY minute, queue
ORDER BY minute, queue
