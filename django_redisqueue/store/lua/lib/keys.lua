-- The backend's keys, by the names the scripts and the other files of lib/ use for
-- them; and the two rules every script keeps.
--
-- Every script gets one key, KEYS[1]: the backend's prefix with its hash tag and a
-- colon ('{drq:default}:'). The names below complete it as keys.py spells them
-- (tests/test_broker.py checks that they agree); per-job and per-queue keys are then
-- completed with an id or a queue name, which a claim or a promotion learns only
-- inside the script. Every key carries the one hash tag, so Cluster keeps them on the
-- slot of KEYS[1]. No other file reads KEYS: a script's header lists, by these names,
-- every key it touches, itself or through the functions it calls (tests check both).
--
-- Two rules keep every move atomic. Time is Redis's (TIME), never a caller's, so
-- clocks of other hosts decide no lease and no due time. And nothing stored can make
-- a script fail half-way, because Redis does not undo the writes a failing script
-- made before the error: a job key of another type, or fields holding garbage, are
-- read as absent or as defaults, and a set of the protocol's holding another type
-- (written by hand) is read as empty and replaced when written (zadd, typed).
local P = KEYS[1]
local JOB, QUEUE, WAKE, SEQ = P .. 'job:', P .. 'queue:', P .. 'wake:', P .. 'seq'
local RUNNING, DELAYED, SCHEDULER_WAKE = P .. 'running', P .. 'delayed:', P .. 'scheduler:wake'
local PAUSED, FAILED, STATS = P .. 'paused', P .. 'failed:', P .. 'stats:'
local SCHEDULERS, WORKERS, WORKER = P .. 'schedulers', P .. 'workers', P .. 'worker:'
local KNOWN_QUEUES = P .. 'queues'
local GROUP, GROUPS, BROADCAST = P .. 'group:', P .. 'groups', P .. 'broadcast:'
local BROADCAST_SEQ, CURSORS = BROADCAST .. 'seq', BROADCAST .. 'cursors'
local UNREAD, SENT = BROADCAST .. 'unread', BROADCAST .. 'sent'
local UNIQUE, LIMIT, LIMITS = P .. 'unique:', P .. 'limit:', P .. 'limits'
local PERIODIC, SCHEDULE = P .. 'periodic', P .. 'periodic:'
local IDLE, IDLE_WORKER, HANDOFF = P .. 'idlers:', P .. 'idle-worker:', P .. 'handoff:'
local HANDED, RELAYED = P .. 'handed', P .. 'relayed'
