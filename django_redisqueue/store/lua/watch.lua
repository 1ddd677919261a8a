-- include: keys, values
-- Keys: JOB..id, ENTRIES..bucket
-- Ask to be woken when a job finishes, unless it has finished already.
-- ARGV[1] job id
-- Returns the job's status, or '' when there is no such job.
if not is_job(ARGV[1]) then
  return ''
end
local job = JOB .. ARGV[1]
local status = redis.call('HGET', job, 'status')
if not status then
  return ''
end
if status ~= 'SUCCESSFUL' and status ~= 'FAILED' then
  redis.call('HSET', job, 'waiters', 1)
end
return status
