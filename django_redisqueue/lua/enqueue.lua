-- Store a job and make it READY: on its queue, or in its queue's delayed set until due.
-- ARGV[1] job id, ARGV[2] payload (JSON envelope), ARGV[3] queue name,
-- ARGV[4] priority (-100..100), ARGV[5] due time (ms since the epoch), or 0 for now;
-- a due time Redis's clock has passed queues the job at once;
-- ARGV[6] 1 to record the queue's name among the queues used (QUEUES is empty)
-- Returns the enqueue time (ms), or 0 when a key with this id exists already (nothing
-- is changed).
local id = ARGV[1]
if redis.call('EXISTS', JOB .. id) == 1 then
  return 0
end
local now = clock_ms()
redis.call('HSET', JOB .. id, 'payload', ARGV[2], 'queue', ARGV[3], 'priority', ARGV[4],
           'enqueued_at', now)
if ARGV[6] == '1' then
  redis.call('SADD', KNOWN_QUEUES, ARGV[3])
end
local due = tonumber(ARGV[5])
if due > now then
  push_delayed(id, due, ARGV[3])
else
  push_ready(id, ARGV[3], ARGV[4])
end
return now
