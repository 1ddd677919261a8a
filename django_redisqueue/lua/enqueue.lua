-- Store a job and make it READY on its queue, leaving a wake-up token.
-- KEYS[1] job hash, KEYS[2] queue zset, KEYS[3] queue's wake list, KEYS[4] seq counter
-- ARGV[1] job id, ARGV[2] payload (JSON envelope), ARGV[3] priority (-100..100)
-- Returns 1, or 0 when a job with this id exists already (nothing is changed).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'payload', ARGV[2], 'status', 'READY')
local seq = redis.call('INCR', KEYS[4])
redis.call('ZADD', KEYS[2], queue_score(tonumber(ARGV[3]), seq), ARGV[1])
leave_wake_token(KEYS[3])
return 1
