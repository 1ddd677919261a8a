-- Finish the caller's previous job (optional), then claim the next job: the first job
-- of the first non-empty queue in the order given. One round trip per job when busy.
-- ARGV[1] now (ms), ARGV[2] lease (ms), ARGV[3] worker id,
-- ARGV[4..10] the job to finish first, or ARGV[4] = '' for none: id, owner token,
--   status, result JSON or '', error JSON or '', result TTL (s), retry due time (ms);
--   the result TTL is given either way
-- ARGV[11..] the names of the queues to try, in order; paused queues are skipped
-- Returns {finished, id, payload, attempts, owner, workers, lost}, or {finished} when
-- every queue is empty; finished is 1 (stored), 0 (fenced out: no longer the owner)
-- or -1 (none asked).
local now, lease, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]

local finished = -1
if ARGV[4] ~= '' then
  finished = finish_job(ARGV[4], ARGV[5], ARGV[6], now, ARGV[7], ARGV[8], ARGV[9], ARGV[10])
end

-- A queue member that is not a plausible job id (garbage written by hand or by a bug)
-- is recorded as a FAILED job of its own, named after its hash, and skipped.
local function discard_malformed(id, queue_name, ttl)
  local name = 'malformed-' .. redis.sha1hex(id)
  redis.call('HSET', JOB .. name, 'queue', queue_name, 'priority', 0)
  local error = cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.InvalidPayload',
    traceback = 'django_redisqueue.exceptions.InvalidPayload: queue ' .. queue_name ..
      ' held a malformed job id (' .. #id .. ' bytes), removed unrun\n',
  })
  record_outcome(name, 'FAILED', now, '', error, ttl)
end

for i = 11, #ARGV do
  local queue = QUEUE .. ARGV[i]
  while redis.call('SISMEMBER', PAUSED, ARGV[i]) == 0 do
    local id = redis.call('ZPOPMIN', queue)[1]
    if not id then
      break
    end
    if #id > 128 or not string.find(id, '^[%w_%-%.:]+$') then
      discard_malformed(id, ARGV[i], ARGV[9])
    else
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
        if redis.call('ZCARD', QUEUE .. ARGV[j]) > 0
            and redis.call('SISMEMBER', PAUSED, ARGV[j]) == 0 then
          leave_wake_token(WAKE .. ARGV[j])
        end
      end
      return {finished, id, fields[1] or '', attempts, owner, workers, tonumber(fields[3] or 0)}
    end
  end
end
return {finished}
