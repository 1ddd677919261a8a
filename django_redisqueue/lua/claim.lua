-- Finish the caller's previous job, then claim the next: the first job of the first
-- non-empty, unpaused queue in the order given. One round trip per job when busy.
-- Claiming starts the job: it is RUNNING, under a lease, from this step on.
-- ARGV[1] lease (ms), ARGV[2] worker id, ARGV[3] result TTL (s),
-- ARGV[4] F, the number of outcomes to store first,
-- then F groups of 6: job id, owner token, status, result JSON or '', error JSON or '',
--   retry delay (ms, for RETRY)
-- then the names of the queues to try, in order (none: only store the outcomes)
-- Returns {stored, claimed}: stored holds 1 (stored) or 0 (fenced out: no longer the
-- owner) per outcome; claimed is {} or {id, owner, field, value, ...} with the job's
-- fields as the worker reads them.
local lease, worker, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local outcomes = tonumber(ARGV[4])
local now = clock_ms()

local stored = {}
for i = 0, outcomes - 1 do
  local at = 5 + i * 6
  stored[#stored + 1] = finish_job(ARGV[at], ARGV[at + 1], ARGV[at + 2], now,
                                   ARGV[at + 3], ARGV[at + 4], ttl, ARGV[at + 5])
end
local first_queue = 5 + outcomes * 6

local READ = {'payload', 'attempts', 'workers', 'lost', 'enqueued_at', 'started_at',
              'queue', 'priority'}

local function claim(id)
  local job = JOB .. id
  local fields = redis.call('HMGET', job, unpack(READ))
  local attempts = math.floor(math.max(number(fields[2], 0), 0)) + 1
  local owner = worker .. '/' .. attempts
  local workers = fields[3] and (fields[3] .. ',' .. worker) or worker
  local started = fields[6] or now
  redis.call('HSET', job, 'status', 'RUNNING', 'owner', owner, 'attempts', attempts,
             'workers', workers, 'last_attempted_at', now, 'started_at', started)
  redis.call('ZADD', RUNNING, now + lease, id)
  local reply = {id, owner, 'status', 'RUNNING', 'attempts', attempts, 'workers', workers,
                 'last_attempted_at', now, 'started_at', started}
  for i, name in ipairs(READ) do
    if fields[i] and name ~= 'attempts' and name ~= 'workers' and name ~= 'started_at' then
      reply[#reply + 1] = name
      reply[#reply + 1] = fields[i]
    end
  end
  return reply
end

local claimed = {}
for i = first_queue, #ARGV do
  local name = ARGV[i]
  local queue = QUEUE .. name
  while redis.call('SISMEMBER', PAUSED, name) == 0 do
    local id = redis.call('ZPOPMIN', queue)[1]
    if not id then
      break
    end
    if #id > 128 or not string.find(id, '^[%w_%-%.:]+$') then
      discard_malformed(id, name, 'a malformed job id (' .. #id .. ' bytes)', now, ttl)
    elseif redis.call('TYPE', JOB .. id)['ok'] ~= 'hash'
        and redis.call('EXISTS', JOB .. id) == 1 then
      discard_malformed(id, name, 'a job whose key is not a hash', now, ttl)
    elseif not final(redis.call('HGET', JOB .. id, 'status')) then
      claimed = claim(id)
      break
    end -- else a job that has ended, left in a queue by hand: it does not run again
  end
  if #claimed > 0 then
    -- Pass the wake-up on: another idle worker may take what is left.
    if redis.call('ZCARD', queue) > 0 then
      leave_wake_token(WAKE .. name)
    end
    break
  end
end
return {stored, claimed}
