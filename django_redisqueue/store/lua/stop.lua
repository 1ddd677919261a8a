-- include: keys, values, running, handoff
-- Keys: JOB..id, ENTRIES..bucket, QUEUE..queue, WAKE..queue, SEQ, RUNNING,
--       DELAYED..queue, SCHEDULER_WAKE, PAUSED, FAILED..queue, STATS..minute, GROUP..gid,
--       UNIQUE..key, LIMIT..key, LIMITS, HANDOFF..wid, HANDED, STOPS..wid, FAIR..queue
-- Ask a running job to stop. Its `stop` field keeps the stop's error: from then on the
-- job never runs again (running.lua: where it would go back to its queue or its
-- delayed set, it ends FAILED with that error). Its worker learns it at once: the id
-- and the attempt's owner token go on the worker's stop list, which its heartbeat
-- blocks on (and its next heartbeat names the job, should that entry be lost).
-- A job handed to an idle worker and not taken yet ends FAILED now: nothing runs it.
-- ARGV[1] job id, ARGV[2] result TTL (s), ARGV[3] lease (ms), which limits use and the
-- stop list lives (a dead worker's goes), ARGV[4] the stop's error (JSON)
-- Returns 'STOPPING' (its worker was told), 'STOPPED' (handed, not started: ended
-- now), or the status of a job that is not running ('' when there is no such job).
local id, ttl, lease, error = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
if not is_job(id) then
  return ''
end
local job = JOB .. id
local f = redis.call('HMGET', job, 'owner', 'status', 'limit')
if f[2] ~= 'RUNNING' or not f[1] then
  return f[2] or ''
end
redis.call('HSET', job, 'stop', error)
local worker = string.match(f[1], '^(.*)/') or ''
-- pcall: a handed set of another type (written by hand) holds none.
local handed = type(redis.pcall('ZSCORE', HANDED, id)) == 'string'
if handed and not redis.call('ZSCORE', typed(RUNNING, 'zset'), id) then
  drop_handed(worker, id)
  give_back(id, f[3], clock_ms(), lease, ttl)
  return 'STOPPED'
end
-- The entry names the attempt (its owner token): a request left over from an earlier
-- attempt (asked twice, or raced with the attempt's own end) stops no later one, such
-- as an operator's retry run by the same worker.
local stops = typed(STOPS .. worker, 'list')
redis.call('RPUSH', stops, id .. ' ' .. f[1])
redis.call('PEXPIRE', stops, lease)
return 'STOPPING'
