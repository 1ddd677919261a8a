-- Store a job and make it READY: on its queue, or in the delayed set until it is due.
-- ARGV[1] job id, ARGV[2] payload (JSON envelope), ARGV[3] queue name,
-- ARGV[4] priority (-100..100), ARGV[5] due time (ms), or 0 to queue it now
-- Returns 1, or 0 when a job with this id exists already (nothing is changed).
local id = ARGV[1]
if redis.call('EXISTS', JOB .. id) == 1 then
  return 0
end
redis.call('HSET', JOB .. id, 'payload', ARGV[2], 'queue', ARGV[3], 'priority', ARGV[4])
local due = tonumber(ARGV[5])
if due > 0 then
  push_delayed(id, due, ARGV[3])
else
  push_ready(id, ARGV[3], ARGV[4])
end
return 1
