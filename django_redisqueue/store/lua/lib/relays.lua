-- include: keys, values
-- The outbox's relay records (docs/protocol.md, "The outbox's relay"): RELAYED holds
-- the id of every job an outbox relay stored, by the ms of its latest relay, until the
-- relay that deleted the job's outbox row forgets it (or runscheduler's sweep, once the
-- row is gone). It outlives the job's result: a row relayed again after the job ran
-- and its result expired must not store the job again.

-- Whether a relay of job `id` must store nothing: a relay stored it before (whatever
-- became of the job since), or its id is taken (a job relayed before records were
-- kept).
local function relayed_before(id)
  return redis.call('ZSCORE', RELAYED, id) ~= false or id_taken(id)
end

-- Record a relay of job `id`, stored now or before: a write in either case, so that a
-- WAIT for replicas after the call covers the job's first relay too.
local function record_relay(id, now)
  redis.call('ZADD', typed(RELAYED, 'zset'), now, id)
end
