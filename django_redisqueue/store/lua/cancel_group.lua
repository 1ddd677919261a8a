-- include: keys, values, errors, outcome
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, DELAYED..queue,
--       SCHEDULER_WAKE, FAILED..queue, STATS..minute, GROUP..gid, UNIQUE..key,
--       LIMIT..key, FAIR..queue
-- Cancel a group: its callback first (so that no slice can let it go), then every
-- member that has not started. Members already running or ended are left to finish;
-- the group ends when they do. In slices, so that Redis is never held long.
-- ARGV[1] group id, ARGV[2] result TTL (s), ARGV[3] error JSON for the members,
-- ARGV[4] index of the first member to handle (0: the first slice, which also
-- cancels the callback), ARGV[5] how many
-- Returns {cancelled, next}: how many jobs this call cancelled, and the index to go
-- on from (-1: done).
local gid, ttl, error = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local first, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local group = GROUP .. gid
if redis.call('TYPE', group)['ok'] ~= 'hash' then
  return {0, -1}
end
local now = clock_ms()
local cancelled = 0
if first == 0 then
  redis.call('HSET', group, 'cancelled', 1)
  local callback = redis.call('HGET', group, 'callback')
  if callback and callback ~= '' and cancel_job(callback, group_cancelled(), now, ttl) == 'CANCELLED' then
    cancelled = cancelled + 1
  end
end
local members = group .. ':members'
if redis.call('TYPE', members)['ok'] ~= 'list' then -- spoilt by hand: no members to read
  return {cancelled, -1}
end
local ids = redis.call('LRANGE', members, first, first + count - 1)
for _, id in ipairs(ids) do
  if cancel_job(id, error, now, ttl) == 'CANCELLED' then
    cancelled = cancelled + 1
  end
end
return {cancelled, #ids == count and first + count or -1}
