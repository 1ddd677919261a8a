-- Finish the caller's previous job (optional), then claim the next job: the first job
-- of the first non-empty queue in the order given. One round trip per job when busy.
-- KEYS[1] running zset, KEYS[2] job key prefix,
-- KEYS[3 .. 2+n] queue zsets in the order to try, KEYS[3+n .. 2+2n] their wake lists
-- ARGV[1] now (ms), ARGV[2] lease (ms), ARGV[3] worker id,
-- ARGV[4..9] the job to finish first, or ARGV[4] = '' for none:
--   id, owner token, status, result JSON or '', error JSON or '', result TTL (s)
-- Returns {finished, id, payload, attempts, owner, workers}, or {finished} when every queue is
-- empty; finished is 1 (stored), 0 (fenced out: no longer the owner) or -1 (none asked).
local running, job_prefix = KEYS[1], KEYS[2]
local now, lease, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local finished = -1
if ARGV[4] ~= '' then
  finished = finish_job(running, job_prefix, ARGV[4], ARGV[5], ARGV[6], now,
                        ARGV[7], ARGV[8], ARGV[9])
end

local n = (#KEYS - 2) / 2
for i = 1, n do
  local popped = redis.call('ZPOPMIN', KEYS[2 + i])
  if popped[1] then
    local id = popped[1]
    local job = job_prefix .. id
    local attempts = redis.call('HINCRBY', job, 'attempts', 1)
    local owner = worker .. '/' .. attempts
    local workers = redis.call('HGET', job, 'workers')
    if workers then workers = workers .. ',' .. worker else workers = worker end
    redis.call('HSET', job, 'status', 'RUNNING', 'owner', owner, 'workers', workers,
               'last_attempted_at', now)
    if attempts == 1 then
      redis.call('HSET', job, 'started_at', now)
    end
    redis.call('ZADD', running, now + lease, id)
    -- Pass the wake-up on: another idle worker may take what is left.
    for j = 1, n do
      if redis.call('ZCARD', KEYS[2 + j]) > 0 then
        leave_wake_token(KEYS[2 + n + j])
      end
    end
    return {finished, id, redis.call('HGET', job, 'payload') or '', attempts, owner, workers}
  end
end
return {finished}
