-- Cancel a job that has not started: take it off its queue or the delayed set and
-- record it as FAILED with the given error.
-- ARGV[1] job id, ARGV[2] now (ms), ARGV[3] result TTL (s), ARGV[4] error JSON
-- Returns 'CANCELLED', or the job's status when it cannot be cancelled ('' if none).
local id = ARGV[1]
local fields = redis.call('HMGET', JOB .. id, 'status', 'queue')
if not fields[1] then
  return ''
end
if fields[1] ~= 'READY' then
  return fields[1]
end
pop_delayed(id, fields[2])
redis.call('ZREM', QUEUE .. fields[2], id)
record_outcome(id, 'FAILED', tonumber(ARGV[2]), '', ARGV[4], ARGV[3])
return 'CANCELLED'
