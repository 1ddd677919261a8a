-- Finish a RUNNING job, fenced by its owner token (see finish_job in common.lua).
-- ARGV[1] now (ms), ARGV[2] id, ARGV[3] owner token, ARGV[4] status,
-- ARGV[5] result JSON or '', ARGV[6] error JSON or '', ARGV[7] result TTL (s),
-- ARGV[8] retry due time (ms; for status RETRY)
-- Returns 1 when stored, 0 when the caller no longer owns the job.
return finish_job(ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[1]), ARGV[5], ARGV[6], ARGV[7],
                  ARGV[8])
