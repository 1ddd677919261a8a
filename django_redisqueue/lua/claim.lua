-- Finish the caller's previous job (optional), then claim the next job: the first job
-- of the first non-empty queue in the order given. One round trip per job when busy.
-- ARGV[1] now (ms), ARGV[2] lease (ms), ARGV[3] worker id,
-- ARGV[4..10] the job to finish first, or ARGV[4] = '' for none: id, owner token,
--   status, result JSON or '', error JSON or '', result TTL (s), retry due time (ms)
-- ARGV[11..] the names of the queues to try, in order
-- Returns {finished, id, payload, attempts, owner, workers, lost}, or {finished} when
-- every queue is empty; finished is 1 (stored), 0 (fenced out: no longer the owner)
-- or -1 (none asked).
local now, lease, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local finished = -1
if ARGV[4] ~= '' then
  finished = finish_job(ARGV[4], ARGV[5], ARGV[6], now, ARGV[7], ARGV[8], ARGV[9], ARGV[10])
end

for i = 11, #ARGV do
  local popped = redis.call('ZPOPMIN', QUEUE .. ARGV[i])
  if popped[1] then
    local id = popped[1]
    local job = JOB .. id
    local attempts = redis.call('HINCRBY', job, 'attempts', 1)
    local owner = worker .. '/' .. attempts
    local fields = redis.call('HMGET', job, 'payload', 'workers', 'lost')
    local workers = fields[2] and (fields[2] .. ',' .. worker) or worker
    redis.call('HSET', job, 'status', 'RUNNING', 'owner', owner, 'workers', workers,
               'last_attempted_at', now)
    if attempts == 1 then
      redis.call('HSET', job, 'started_at', now)
    end
    redis.call('ZADD', RUNNING, now + lease, id)
    -- Pass the wake-up on: another idle worker may take what is left.
    for j = 11, #ARGV do
      if redis.call('ZCARD', QUEUE .. ARGV[j]) > 0 then
        leave_wake_token(WAKE .. ARGV[j])
      end
    end
    return {finished, id, fields[1] or '', attempts, owner, workers, tonumber(fields[3] or 0)}
  end
end
return {finished}
