-- Cancel a group: every member that has not started, then its callback. Members
-- already running or ended are left to finish; the group ends when they do, and its
-- callback is cancelled rather than run. In slices, so that Redis is never held long.
-- ARGV[1] group id, ARGV[2] result TTL (s), ARGV[3] error JSON for the members,
-- ARGV[4] index of the first member to handle, ARGV[5] how many
-- Returns {cancelled, next}: how many jobs this call cancelled, and the index to go
-- on from (-1: done; the group's callback was handled too).
local gid, ttl, error = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local first, count = tonumber(ARGV[4]), tonumber(ARGV[5])
local group = GROUP .. gid
if redis.call('TYPE', group)['ok'] ~= 'hash' then
  return {0, -1}
end
redis.call('HSET', group, 'cancelled', 1)
local now = clock_ms()
local cancelled = 0
local ids = redis.call('LRANGE', group .. ':members', first, first + count - 1)
for _, id in ipairs(ids) do
  if cancel_job(id, error, now, ttl) == 'CANCELLED' then
    cancelled = cancelled + 1
  end
end
if #ids == count then
  return {cancelled, first + count}
end
-- The last slice: a callback already let go (the group had ended) and not started is
-- cancelled too; one still waiting is cancelled when the group ends.
local callback = redis.call('HGET', group, 'callback')
if callback and callback ~= '' and cancel_job(callback, GROUP_CANCELLED, now, ttl) == 'CANCELLED' then
  cancelled = cancelled + 1
end
return {cancelled, -1}
