-- include: keys, values, running, handoff
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, RUNNING,
--       DELAYED..queue, SCHEDULER_WAKE, PAUSED, FAILED..queue, STATS..minute, GROUP..gid,
--       UNIQUE..key, LIMIT..key, LIMITS, IDLE_WORKER..wid, HANDOFF..wid, HANDED,
--       FAIR..queue
-- Give back every job a worker owns, uncounted, to its place in its queue: those it
-- claimed and those handed to it, taken or not. A worker calls this when the reply to
-- a claim or to its wait was lost: the call may have given it a job, which would
-- otherwise wait for its lease and count as lost though it never ran. The worker
-- holds no other job then (its last outcome was stored first), but those it keeps.
-- Its registration as idle ends (handoff.lua).
-- ARGV[1] worker id, ARGV[2] result TTL (s), ARGV[3] lease (ms), which limits use,
-- ARGV[4] '1': only the job handed to the worker that it has not taken, as a worker
-- stopping while registered as idle, which holds no other job, gives back: one job
-- looked at instead of every running one.
-- ARGV[5..] pairs of job id and owner token: the attempts the worker keeps, those it
-- runs in its other slots (a process running several jobs at once), which the lost call
-- cannot have given it. A job the lost call claimed again while a slot still runs its
-- attempt whose lease ran out has another token: it goes back.
-- Returns the ids given back.
local worker, prefix = ARGV[1], ARGV[1] .. '/'
local now, ttl = clock_ms(), tonumber(ARGV[2])
local given = {}
local keep = {}
for i = 5, #ARGV - 1, 2 do
  keep[ARGV[i] .. '|' .. ARGV[i + 1]] = true
end
local owned
if ARGV[4] == '1' then
  local _, handed = take_handed(worker)
  owned = {handed}
else
  owned = redis.call('ZRANGE', typed(RUNNING, 'zset'), 0, -1)
  for _, id in ipairs(redis.call('ZRANGE', typed(HANDED, 'zset'), 0, -1)) do
    owned[#owned + 1] = id
  end
end
end_registration(worker)
redis.call('DEL', HANDOFF .. worker)
for _, id in ipairs(owned) do
  local job = JOB .. id
  if is_job(id) then
    local f = redis.call('HMGET', job, 'owner', 'status')
    if f[1] and f[2] == 'RUNNING' and string.sub(f[1], 1, #prefix) == prefix
        and not keep[id .. '|' .. f[1]] then
      give_back(id, redis.call('HGET', job, 'limit'), now, tonumber(ARGV[3]), ttl)
      given[#given + 1] = id
    end
  end
end
return given
