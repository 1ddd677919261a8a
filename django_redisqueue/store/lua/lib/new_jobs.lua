-- include: keys, values, queues, limits
-- A new job: its options as the enqueue sends them, and its hash (or its entry) stored
-- and made READY (enqueue, enqueue_linked, periodic).

-- A job's options, as the enqueue sends them: '' (none, the common case) or a JSON
-- object with ``unique`` (key), ``unique_ms`` (how long the key holds; 0: while the
-- job has not ended), ``limit`` (key), ``max_running`` and ``rate``/``per`` (starts per
-- ms), ``fair`` (its fairness key, '' too, on a fair queue). Returns a table, empty
-- for none.
local function job_options(json)
  if json == nil or json == '' then
    return {}
  end
  local ok, options = pcall(cjson.decode, json)
  if not ok or type(options) ~= 'table' then
    return {}
  end
  for _, name in ipairs({'unique', 'limit'}) do
    if type(options[name]) ~= 'string' or options[name] == '' then
      options[name] = nil
    end
  end
  if type(options.fair) ~= 'string' then
    options.fair = nil
  end
  return options
end

-- A new job's hash fields, but its status: only what its claim needs. No priority when
-- it is the default 0, and no score (its queue holds it; a claim copies it to the hash,
-- where a give-back finds it). Waiting jobs are the many: each field left out is bytes
-- a job. `fair`: its fairness key, or nil.
local function new_job_fields(payload, queue, priority, now, fair)
  local fields = {'payload', payload, 'queue', queue, 'enqueued_at', whole(now)}
  if number(priority, 0) ~= 0 then
    fields[#fields + 1] = 'priority'
    fields[#fields + 1] = priority
  end
  if fair then
    fields[#fields + 1] = 'fair'
    fields[#fields + 1] = fair
  end
  return fields
end

-- Store a new job and make it READY: on its queue (returns the queue, for the caller
-- to wake once per batch), or in its queue's delayed set until `due` (ms). `options`
-- (job_options) adds the job's limits to its hash, where the claim reads them. `fresh`:
-- the job has no options and is due now: it is kept as an entry instead of a hash
-- (values.lua's write_entry); returns false, storing nothing, when its id holds an
-- entry already.
local function store_job(id, payload, queue, priority, due, now, options, fresh)
  local entry = nil
  if fresh then
    entry = write_entry(id, payload, queue, priority, now)
    if entry == false then
      return false
    end
  end
  if not entry then
    local job = JOB .. id
    store_limits(job, options)
    local fields = new_job_fields(payload, queue, priority, now, options.fair)
    fields[#fields + 1] = 'status'
    fields[#fields + 1] = 'READY'
    redis.call('HSET', job, unpack(fields))
    if due > now then
      add_delayed(id, due, queue)
      return nil
    end
  end
  local score = next_score(priority, entry)
  zadd(QUEUE .. queue, score, id)
  if options.fair then
    fair_add(id, queue, options.fair, score, false)
  end
  return queue
end
