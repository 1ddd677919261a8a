-- include: keys, values, queues, limits, outcome, running, handoff
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, RUNNING,
--       DELAYED..queue, SCHEDULER_WAKE, PAUSED, FAILED..queue, STATS..minute, GROUP..gid,
--       BROADCAST_SEQ, UNIQUE..key, LIMIT..key, LIMITS, IDLE..queue, IDLE_WORKER..wid,
--       IDLE_WIDE, HANDOFF..wid, HANDED, FAIR..queue
-- Finish the caller's previous job, then claim the next: the first job of the first
-- non-empty, unpaused queue in the order given. One round trip per job when busy.
-- Claiming starts the job: it is RUNNING, under a lease, from this step on.
-- ARGV[1] lease (ms), ARGV[2] worker id, ARGV[3] result TTL (s),
-- ARGV[4] the queue whose wake-up token woke the worker for this claim, or '',
-- ARGV[5] '1' to read the last broadcast's number, else '' (a busy worker reads it
--   now and then, not with every job: one command less a job),
-- ARGV[6] '1' when the worker registered as idle since its last claim that named
--   queues: the job handed to it meanwhile, if any, is the one it claims (handoff.lua),
-- ARGV[7] how long (ms) the worker stands idle when it finds no job, or '' for not
--   at all (it will not wait: burst, stopping),
-- ARGV[8] F, the number of outcomes to store first,
-- then F groups of 7: job id, owner token, status, result JSON or '', error JSON or '',
--   retry delay (ms, for RETRY, and a RELEASE for later), the attempt's trace
--   record or '' (running.lua)
-- then the names of the queues to try, in order (none: only store the outcomes, and
--   neither take a handed job nor register)
-- A job over its limits (max_running, rate) is parked instead (limits.lua).
-- Returns {stored, claimed, broadcast}: stored holds 1 (stored) or 0 (fenced out: no
-- longer the owner) per outcome; claimed is {} or {id, owner, field, value, ...} with
-- the job's fields as the worker reads them, or the JSON of that list for a handed
-- job; broadcast is the number of the last
-- broadcast message sent (0: none), which tells the worker whether to receive, or ''
-- when not asked.
local lease, worker, ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local woken_by, read_broadcast = ARGV[4], ARGV[5] == '1'
local take, idle_for, outcomes = ARGV[6] == '1', number(ARGV[7], nil), tonumber(ARGV[8])
local now = clock_ms()

local stored = {}
for i = 0, outcomes - 1 do
  local at = 9 + i * 7
  stored[#stored + 1] = finish_job(ARGV[at], ARGV[at + 1], ARGV[at + 2], now,
                                   ARGV[at + 3], ARGV[at + 4], ttl, ARGV[at + 5], lease,
                                   ARGV[at + 6])
end
local first_queue = 9 + outcomes * 7
local queues = {unpack(ARGV, first_queue)}

-- Most jobs one claim parks over their limits: past it, the claim ends without a job
-- and leaves the queue's wake-up token, so that the worker claims again at once.
local MOST_PARKED = 100

local claimed, parked = {}, 0
local looks = {left = FAIR_LOOKS} -- the fair queues' budget of this claim (fair_pop)
if take and #queues > 0 then
  local handed, id = take_handed(worker)
  if handed then -- taken: under the worker's lease from now on
    redis.pcall('ZREM', HANDED, id)
    zadd(RUNNING, now + lease, id)
    claimed = handed
  end
end
-- The first job of the first queue, from queues[from] on, that holds one: that queue's
-- index and the job popped ({id, score}); nil when none holds any. A ZMPOP over up to
-- ZMPOP_KEYS queues at a time skips the empty ones (a worker may serve hundreds);
-- without it (Redis 6.2), or with a queue of another type among them (written by hand:
-- it holds no job to claim), each is popped in turn.
local ZMPOP_KEYS = 1000 -- (Lua's unpack takes about 8,000 values at most)
local queue_keys = {}
for i, name in ipairs(queues) do
  queue_keys[i] = QUEUE .. name
end
local function first_job_from(from)
  while from < #queues do
    local last = math.min(#queues, from + ZMPOP_KEYS - 1)
    local args = {last - from + 1, unpack(queue_keys, from, last)}
    args[#args + 1] = 'MIN'
    local reply = redis.pcall('ZMPOP', unpack(args))
    if failed(reply) then
      break
    elseif reply then
      for i = from, last do
        if queue_keys[i] == reply[1] then
          return i, reply[2][1]
        end
      end
      local popped = reply[2][1] -- (from no queue named: back where it was)
      redis.call('ZADD', reply[1], popped[2], popped[1])
      break
    end
    from = last + 1
  end
  for i = from, #queues do
    local popped = redis.pcall('ZPOPMIN', queue_keys[i])
    if not failed(popped) and popped[1] then
      return i, popped
    end
  end
  return nil
end

local from = 1
while #claimed == 0 and parked < MOST_PARKED do
  local index, popped = first_job_from(from)
  if not index then
    break
  end
  local name = queues[index]
  local queue = QUEUE .. name
  -- Whether the queue is paused is asked once it has a job: empty queues then cost
  -- nothing more, and a job taken from a paused one goes back at its score, which no
  -- one can see happen inside the script.
  local paused = nil
  while true do
    if parked >= MOST_PARKED then
      leave_wake_token(WAKE .. name)
      break
    end
    -- pcall: a queue of another type (written by hand) holds no job to claim.
    popped = popped or redis.pcall('ZPOPMIN', queue)
    local id = not failed(popped) and popped[1]
    if not id then
      break
    end
    if paused == nil then
      paused = is_paused(name)
    end
    if paused then
      redis.call('ZADD', queue, popped[2], id)
      break
    end
    local fields, score
    if valid_id(id) then
      fields = read_waiting(id, popped[2])
    end
    -- A fair job first: the job whose turn it is instead (a queue that is not fair
    -- pays nothing for it).
    id, fields, score = next_of(name, id, fields, popped[2], looks)
    popped = nil
    if not id then
      break
    end
    if not fields then
      discard_malformed(id, name, 'a malformed job id (' .. #id .. ' bytes)', now, ttl)
    elseif fields.err then
      discard_malformed(id, name, 'a job whose key is not a hash', now, ttl)
    elseif not final(fields[1]) then
      -- A job over its limit is parked, and the jobs behind it go on.
      local limit = limits_of(fields[12], fields[13], fields[14])
      if not limit or limit_room(limit, now) > 0 then
        claimed = start_job(id, fields, score, worker, lease, now)
        if limit then
          take_limit(id, limit, now)
        end
        break
      end
      park(id, limit, score, next_look(limit, now, lease, 0))
      parked = parked + 1
    end -- else a job that has ended, left in a queue by hand: it does not run again
  end
  from = index + 1
end
if #claimed == 0 and parked < MOST_PARKED and idle_for and #queues > 0 then
  register_idle(worker, queues, now, idle_for)
end
-- Pass the wake-up on: a worker that took a queue's token leaves another while that
-- queue still holds jobs, for the next idle worker (it may itself have claimed from
-- another queue). A busy worker took no token and has none to pass on: every idle
-- worker is blocked on a token that an enqueue, a promotion or a pass-on leaves.
local waiting = valid_queue(woken_by) and redis.pcall('ZCARD', QUEUE .. woken_by)
if waiting and not failed(waiting) and waiting > 0 and not is_paused(woken_by) then
  leave_wake_token(WAKE .. woken_by)
end
-- The number as a whole number, whatever the key holds (a worker compares it).
local broadcast = ''
if read_broadcast then
  broadcast = whole(math.max(number(redis.pcall('GET', BROADCAST_SEQ), 0), 0))
end
return {stored, claimed, broadcast}
