-- include: keys, values
-- The errors the scripts store, as runtime/worker.py words them, and their place in a
-- job's JSON list of errors.

-- Append one JSON error object to the job's JSON list of errors (a list that is not
-- one, written by hand, is replaced).
local function append_error(job, error)
  if error == '' then
    return
  end
  local errors = redis.call('HGET', job, 'errors')
  if errors and string.sub(errors, 1, 1) == '[' and string.sub(errors, -1) == ']'
      and #errors > 2 then
    errors = string.sub(errors, 1, -2) .. ',' .. error .. ']'
  else
    errors = '[' .. error .. ']'
  end
  redis.call('HSET', job, 'errors', errors)
end

-- The error of a job that cannot be run for what Redis holds, as runtime/worker.py words it.
local function invalid_error(message)
  return cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.InvalidPayload',
    traceback = 'django_redisqueue.exceptions.InvalidPayload: ' .. message .. '\n',
  })
end

-- The error of a job that never ran because the job it waited for did not succeed;
-- down a chain, it names the job whose failure started it all (`root`).
local function dependency_error(parent, root)
  local why = 'job ' .. parent .. ', which this job runs after, ended FAILED'
  if root ~= parent then
    why = why .. ' without running: job ' .. root .. ' failed'
  end
  return cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.DependencyFailed',
    traceback = 'django_redisqueue.exceptions.DependencyFailed: ' .. why .. '\n',
  })
end

-- The job whose failure a FAILED job's end goes back to: itself, or the origin its last
-- error names when that is a DependencyFailed (so that a job linked to it later, in
-- another call, names the same origin as one linked to it in the same call), if that
-- is a job id: an error written by hand may name anything, of any length.
local function failure_root(id)
  local ok, errors = pcall(cjson.decode, redis.call('HGET', JOB .. id, 'errors') or '')
  local last = ok and type(errors) == 'table' and errors[#errors]
  if type(last) ~= 'table' or type(last.traceback) ~= 'string'
      or last.exception_class_path ~= 'django_redisqueue.exceptions.DependencyFailed' then
    return id
  end
  local root = string.match(last.traceback, 'without running: job ([%w_%-%.:]+) failed')
    or string.match(last.traceback, 'DependencyFailed: job ([%w_%-%.:]+), which')
  return valid_id(root) and root or id
end

-- The error of a group's callback when the group is cancelled. A function, not a
-- value: a library's definitions are made at its load, when cjson is not there yet.
local function group_cancelled()
  return cjson.encode({
    exception_class_path = 'django_redisqueue.exceptions.JobCancelled',
    traceback = 'django_redisqueue.exceptions.JobCancelled: its group was cancelled\n',
  })
end
