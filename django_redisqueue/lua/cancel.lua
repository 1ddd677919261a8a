-- Cancel a job that has not started: take it off its queue or delayed set and record
-- it as FAILED with the given error. A cancelled job stays out of the failed index.
-- ARGV[1] job id, ARGV[2] result TTL (s), ARGV[3] error JSON
-- Returns 'CANCELLED', or the job's status when it cannot be cancelled ('' if none).
local id = ARGV[1]
if not is_job(id) then
  return ''
end
local fields = redis.call('HMGET', JOB .. id, 'status', 'queue')
if not fields[1] then
  return ''
end
if fields[1] ~= 'READY' then
  return fields[1]
end
local queue = fields[2] or ''
redis.call('ZREM', DELAYED .. queue, id)
redis.call('ZREM', QUEUE .. queue, id)
redis.call('HSET', JOB .. id, 'cancelled', 1)
record_outcome(id, 'FAILED', clock_ms(), '', ARGV[3], tonumber(ARGV[2]))
return 'CANCELLED'
