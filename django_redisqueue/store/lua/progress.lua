-- include: keys, values, running
-- Keys: JOB..id, ENTRIES..bucket
-- Store running jobs' progress, each only while its job is RUNNING under the owner
-- token given: a late write, from an attempt whose lease ran out or that has ended,
-- is refused.
-- ARGV: triples of job id, owner token and progress record (JSON, core/progress.py)
-- Returns 1 (stored) or 0 (refused) per job.
local stored = {}
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if is_job(id) and owned_by(redis.call('HMGET', JOB .. id, 'owner', 'status'), ARGV[i + 1]) then
    redis.call('HSET', JOB .. id, 'progress', ARGV[i + 2])
    stored[#stored + 1] = 1
  else
    stored[#stored + 1] = 0
  end
end
return stored
