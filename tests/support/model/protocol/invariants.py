"""The protocol model's invariants, checked after every step by reading Redis: each
job in exactly one place, with the fields, TTL and FIFO place the model says; the
groups, the broadcasts, the unique keys and limits; the counts, the stats, and every
key with a TTL unless the schema keeps it. And the abstract state each run counts."""

from __future__ import annotations

import json
from collections import Counter

from hypothesis.stateful import invariant

from django_redisqueue.core.jobs import FAILED
from django_redisqueue.store.queries import QueueCounts
from django_redisqueue.store.wire import entry_fields
from tests.support.model.harness import RESULT_TTL, RUN, STATES
from tests.support.model.protocol.records import (
    DELAYED,
    DELETED,
    DEPENDENCY,
    FINISHED,
    HOUR,
    LIMIT_KEYS,
    LIMITS,
    PARKED,
    QUEUED,
    QUEUES,
    RATE_MEMORY,
    RUNNING,
    UNIQUE_KEYS,
    WAITING,
    WIDE_ORDER,
    WORKERS,
    Err,
    Group,
    Job,
    Message,
    in_window,
)


class InvariantChecks:
    """What Redis must hold after every step, read back and compared with the model."""

    # The invariants, checked after every step by reading Redis.

    @invariant()
    def redis_holds_what_the_model_says(self):
        self.settle()
        RUN["checks"] += 1
        STATES.add(hash(self.abstract_state()))
        k, r = self.keys, self.r
        pipe = r.pipeline(transaction=False)
        for queue in QUEUES:
            pipe.zrange(k.queue(queue), 0, -1, withscores=True)
            pipe.zrange(k.delayed(queue), 0, -1, withscores=True)
            pipe.zrange(k.failed(queue), 0, -1, withscores=True)
            pipe.llen(k.wake(queue))
        pipe.zrange(k.running, 0, -1, withscores=True)
        pipe.zrange(k.handed, 0, -1, withscores=True)
        pipe.smembers(k.paused)
        pipe.llen(k.scheduler_wake)
        jobs = list(self.jobs.values())
        for job in jobs:
            pipe.hgetall(k.job(job.id))
            pipe.ttl(k.job(job.id))
            pipe.lrange(k.done(job.id), 0, -1)
            pipe.lrange(k.dependents(job.id), 0, -1)
            pipe.hget(k.entries(job.id), job.id)
        groups = list(self.groups.values())
        for group in groups:
            pipe.hgetall(k.group(group.id))
            pipe.lrange(k.group_members(group.id), 0, -1)
            pipe.lrange(k.group_done(group.id), 0, -1)
        pipe.zrange(k.groups, 0, -1, withscores=True)
        pipe.get(k.broadcast_seq)
        pipe.zrange(k.broadcast_unread, 0, -1, withscores=True)
        pipe.zrange(k.broadcast_cursors, 0, -1, withscores=True)
        pipe.zrange(k.broadcast_sent, 0, -1, withscores=True)
        messages = list(self.messages.values())
        for message in messages:
            pipe.hgetall(k.broadcast_message(message.n))
        replies = iter(pipe.execute())

        where: dict[str, list[str]] = {}
        queue_scores: dict[str, float] = {}
        for queue in QUEUES:
            ready, delayed, failed, wake = (next(replies) for _ in range(4))
            model_ready = self.queue_order(queue)
            got = [member for member, _ in ready]
            want = [j.id for j in model_ready]
            assert got == want, (
                f"queue {queue} holds {self.names(got)}; model (priority, then FIFO): "
                f"{self.names(want)}"
            )
            for member, score in ready:
                where.setdefault(member, []).append(f"queue:{queue}")
                queue_scores[member] = score
            model_delayed = {j.id: j.due for j in self.job_list(DELAYED) if j.queue == queue}
            assert dict(delayed) == model_delayed, (
                f"delayed:{queue} {self.names(dict(delayed))} {dict(delayed)}, "
                f"model {self.names(model_delayed)} {model_delayed}"
            )
            for member, _ in delayed:
                where.setdefault(member, []).append(f"delayed:{queue}")
            model_failed = {j.id: j.finished_at for j in self.failed_order(queue)}
            assert dict(failed) == model_failed, (
                f"failed:{queue} {self.names(dict(failed))}, model {self.names(model_failed)}"
            )
            assert wake <= 1, f"wake:{queue} holds {wake} tokens"
            # A worker standing idle on a queue is woken for its jobs: by a job handed
            # over, or by a token while the queue holds jobs.
            if want and queue not in self.paused and self.idle_on(queue):
                assert wake == 1, f"{queue} holds jobs, and its idle workers no token"
        for name in ("running", "handed"):
            leases = dict(next(replies))
            model_leases = {
                j.id: j.deadline for j in self.job_list(RUNNING) if j.handed == (name == "handed")
            }
            assert leases == model_leases, (
                f"{name} {self.names(leases)} {leases}, model {self.names(model_leases)} "
                f"{model_leases}"
            )
            for member in leases:
                where.setdefault(member, []).append(name)
        assert next(replies) == self.paused
        assert next(replies) <= 1, "more than one scheduler wake-up token"

        for job in jobs:
            fields, ttl, done, then, entry = (next(replies) for _ in range(5))
            if entry is not None:
                name = f"job {job.n} ({job.id})"
                assert job.entry, f"{name}: an entry, but the model says it has its hash"
                assert not fields, f"{name}: both an entry and a hash"
                assert job.place == QUEUED, f"{name}: an entry, {job.place} in the model"
                fields, ttl = entry_fields(entry), -1
                assert fields, f"{name}: its entry does not parse: {entry!r}"
            elif job.entry:
                job.entry = False  # a script made it its hash: one form from now on
                RUN["entries made hashes"] += 1
            self.check_job(job, fields, ttl, done, where.get(job.id, []), queue_scores)
            assert then == job.then, f"job {job.n}: then {self.names(then)}, {job.then}"
        untracked = set(where) - set(self.jobs)
        assert not untracked, f"sets hold jobs nobody enqueued: {untracked}"

        for group in groups:
            self.check_group(group, next(replies), next(replies), next(replies))
        index = dict(next(replies))
        indexed = [g for g in groups if g.indexed]
        assert set(index) == {g.id for g in indexed}, f"{k.groups}: {index}"
        assert all(
            index[g.id] == 0 if g.aged else in_window(index[g.id], g.created) for g in indexed
        ), index
        self.check_broadcasts(messages, replies)
        self.check_handoff()
        self.check_limits()
        self.check_fairness()
        self.check_counts()
        self.check_keys()
        self.let_time_pass()

    def check_handoff(self) -> None:
        """Each worker's hand-off list holds the job the model handed it (JSON of the
        claim's reply), or nothing; its idle key stands exactly while its registration
        does, naming its queues in order; each queue's registry holds every standing
        registration on it at its ms (stale entries may stay), in the order they registered."""
        k = self.keys
        pipe = self.r.pipeline(transaction=False)
        for worker in WORKERS:
            pipe.lrange(k.handoff(worker), 0, -1)
            pipe.get(k.idle_worker(worker))
            pipe.lrange(k.stops(worker), 0, -1)
        for queue in QUEUES:
            pipe.zrange(k.idle(queue), 0, -1, withscores=True)
        replies = iter(pipe.execute())
        stamps = {}
        for worker in WORKERS:
            entries, standing, stops = next(replies), next(replies), next(replies)
            want_stops = self.stop_lists.get(worker, [])
            assert stops == want_stops, f"stops:{worker} {stops}, model {want_stops}"
            ids = [json.loads(entry)[0] for entry in entries]
            want = [self.handed[worker]] if worker in self.handed else []
            assert ids == want, f"handoff:{worker} {self.names(ids)}, model {self.names(want)}"
            if worker not in self.idle:
                assert standing is None, f"idle-worker:{worker} {standing}; model: not idle"
                continue
            assert standing is not None, f"{worker} registered idle; its key is gone"
            stamp, order = standing.split("|")
            assert tuple(order.split(",")) == self.idle[worker][1], f"{worker}: {standing}"
            stamps[worker] = float(stamp)
        for queue in QUEUES:
            registry = [(w, s) for w, s in next(replies) if stamps.get(w) == s]
            want = sorted(
                (w for w, (_, order) in self.idle.items() if queue in order),
                key=lambda w: self.idle[w][0],
            )
            assert [w for w, _ in registry] == want, f"idle:{queue} {registry}, model {want}"

    def check_job(self, job: Job, fields, ttl, done, places, queue_scores) -> None:
        name = f"job {job.n} ({job.id})"
        expected_places = {
            QUEUED: [f"queue:{job.queue}"],
            DELAYED: [f"delayed:{job.queue}"],
            RUNNING: ["handed" if job.handed else "running"],
        }.get(job.place, [])
        assert places == expected_places, f"{name} is in {places}; model: {job.place}"
        assert done == job.done, f"{name}: done list {done}, model {job.done}"
        if job.place == DELETED:
            assert not fields and ttl == -2, f"{name} was deleted but its hash is there"
            return
        assert fields, f"{name}: its hash is gone ({job.place} in the model)"
        assert fields.get("status") == job.status, f"{name}: {fields.get('status')}, {job}"
        assert fields.get("owner") == job.token, f"{name}: owner {fields.get('owner')}, {job}"
        assert job.owner == (job.token if job.place == RUNNING else None), f"{name}: {job}"
        assert fields["queue"] == job.queue, f"{name}: queue {fields['queue']}, {job}"
        # Priority 0, the default, is left out of the hash.
        assert fields.get("priority", "0") == str(job.priority), f"{name}: priority, {job}"
        assert int(fields.get("attempts", 0)) == job.attempts, f"{name}: attempts, {job}"
        assert int(fields.get("lost", 0)) == job.lost, f"{name}: lost, {job}"
        assert fields.get("trace") == job.trace, f"{name}: trace {fields.get('trace')}"
        assert fields.get("progress") == job.progress, f"{name}: progress, {job}"
        assert ("stop" in fields) == job.stop, f"{name}: stop {fields.get('stop')}, {job}"
        assert fields.get("workers", "") == ",".join(job.workers), f"{name}: workers, {job}"
        self.check_errors(name, json.loads(fields.get("errors", "[]")), job.errors)
        assert fields.get("result") == job.result, f"{name}: result {fields.get('result')}"
        assert ("cancelled" in fields) == job.cancelled, f"{name}: cancelled, {job}"
        assert ("waiters" in fields) == job.waiters, f"{name}: waiters, {job}"
        assert "payload" in fields and "enqueued_at" in fields
        assert fields.get("group") == job.group, f"{name}: group {fields.get('group')}, {job}"
        assert ("counted" in fields) == bool(job.counted), f"{name}: counted, {job}"
        assert fields.get("after") == job.after, f"{name}: after {fields.get('after')}"
        assert fields.get("waiting") == ("1" if job.place == WAITING else None), (
            f"{name}: waiting {fields.get('waiting')}, model {job.place}"
        )
        stored_due = fields.get("due")
        assert (stored_due and int(float(stored_due))) == job.run_after, f"{name}: due"
        count = str(len(job.then)) if job.then else None
        assert fields.get("then") == count, f"{name}: then {fields.get('then')}, {job.then}"
        if job.place == FINISHED:
            assert 0 < ttl <= RESULT_TTL, f"{name}: finished with TTL {ttl}"
            assert int(fields["finished_at"]) == job.finished_at
        else:
            assert ttl == -1, f"{name}: {job.place} with TTL {ttl}"
            assert "finished_at" not in fields, f"{name}: {job.place} with a finished_at"
        if not job.scored:
            assert "score" not in fields, f"{name}: a score in the hash of a job never claimed"
        elif job.place in (RUNNING, PARKED):
            # The place it goes back to: a score of its priority's band of its queue.
            band = (100 - job.priority) * 2**44
            assert band < int(fields["score"]) < band + 2**44, f"{name}: stored score"
        self.check_job_options(name, job, fields)

    def check_errors(self, name: str, stored: list[dict], model: list[Err]) -> None:
        """The error classes in order; a DependencyFailed names the job it ran after and,
        down a chain, the job whose end started the failure."""
        got = [error.get("exception_class_path") for error in stored]
        assert got == [error.kind for error in model], f"{name}: errors {got}, model {model}"
        for error, expected in zip(stored, model, strict=True):
            if expected.kind != DEPENDENCY:
                continue
            traceback = error.get("traceback", "")
            assert f"job {expected.parent}, which this job runs after" in traceback, (
                f"{name}: {traceback!r} does not name job {self.names([expected.parent])}"
            )
            origin = f"without running: job {expected.root} failed"
            assert (origin in traceback) == (expected.root != expected.parent), (
                f"{name}: {traceback!r}, model: started by job {self.names([expected.root])}"
            )

    def check_group(self, group: Group, fields, members, done) -> None:
        """The group's hash and lists, and the promises: each member's end counted
        once, finished when sealed and every member ended, the callback waiting until
        then and let go at the end (or cancelled, with the group)."""
        name = f"group {group.n} ({group.id})"
        if group.gone:
            assert not fields and not members and not done, f"{name}: expired, yet {fields}"
            return
        counted = [self.jobs[m].counted for m in group.members]
        assert group.ended == len([c for c in counted if c]), f"{name}: ended, model"
        assert group.failed == counted.count(FAILED), f"{name}: failed, model"
        sealed = group.total is not None
        assert bool(group.finished) == (sealed and group.ended == group.total), name
        assert fields, f"{name}: its hash is gone"
        assert int(fields["size"]) == len(group.members), f"{name}: size {fields}"
        assert fields.get("total") == (str(group.total) if sealed else None), f"{name}: total"
        ended = (int(fields["ended"]), int(fields["failed"]))
        assert ended == (group.ended, group.failed), f"{name}: ended, failed {ended}, {group}"
        assert fields.get("callback") == group.callback, f"{name}: callback"
        assert ("cancelled" in fields) == group.cancelled, f"{name}: cancelled"
        assert in_window(fields.get("created_at"), group.created), f"{name}: created_at"
        if group.finished:
            assert in_window(fields.get("finished_at"), group.finished), f"{name}: finished_at"
        else:
            assert "finished_at" not in fields, f"{name}: finished, {group}"
        assert members == group.members, f"{name}: members {self.names(members)}"
        assert done == (["done"] if group.finished else []), f"{name}: done {done}"
        if group.callback is None:
            return
        callback = self.jobs[group.callback]
        stopped = callback.final == FAILED and callback.cancelled
        if not group.finished:
            assert callback.place == WAITING or stopped, f"{name}: callback {callback}"
        else:
            assert callback.place != WAITING, f"{name} ended; its callback still waits"

    def check_broadcasts(self, messages: list[Message], replies) -> None:
        """The message counter, the unread set, the cursors, and each message with the
        outcome per worker; no live cursor misses a message it has not read."""
        last, unread, cursors, sent = (next(replies) for _ in range(4))
        assert int(last or 0) == self.last_message, f"broadcast:seq {last}"
        unread_numbers = {int(n) for n, score in unread if int(n) == score}
        assert unread_numbers == self.unread and len(unread) == len(self.unread), (
            f"unread {unread}, model {sorted(self.unread)}"
        )
        assert dict(cursors) == self.cursors, f"cursors {cursors}, model {self.cursors}"
        live = self.heartbeats - self.silent
        assert live <= set(self.cursors), f"live workers without a cursor: {live}"
        for worker, cursor in self.cursors.items():
            lost = set(range(cursor + 1, self.last_message + 1)) - self.unread
            assert not lost, f"{worker} has not read messages {lost}, gone from unread"
        assert {int(n) for n, _ in sent} == set(self.messages), f"sent {sent}"
        assert all(in_window(at, self.messages[int(n)].sent) for n, at in sent), sent
        for message in messages:
            fields = next(replies)
            name = f"message {message.n}"
            assert fields.get("payload") == self.payload, f"{name}: {fields}"
            assert fields.get("queue") == message.queue, f"{name}: queue {fields}"
            assert in_window(fields.get("sent_at"), message.sent), f"{name}: sent_at"
            ran = {f.removeprefix("ran:"): v for f, v in fields.items() if f.startswith("ran:")}
            assert set(ran) == set(message.ran), f"{name}: ran {ran}, model {message.ran}"
            for worker, (status, t0, t1) in message.ran.items():
                stored, at = ran[worker].split(" ")
                assert stored == status and t0 <= int(at) <= t1, f"{name}: {worker} {ran}"

    def check_counts(self) -> None:
        counts = self.queries.counts(QUEUES)
        for queue in QUEUES:
            expected = QueueCounts(
                ready=len(self.queue_order(queue)),
                delayed=sum(j.queue == queue for j in self.job_list(DELAYED)),
                failed=len(self.failed_order(queue)),
                paused=queue in self.paused,
            )
            assert counts[queue] == expected, f"counts of {queue}: {counts[queue]}, {expected}"

    def expected_keys(self) -> tuple[dict[str, bool], set[str]]:
        """Every key the model allows, with whether it must expire; and the keys that
        must exist. Only the infrastructure (counters, sets of names, the queues, the
        running set, the cursors), jobs that have not ended and groups sealed but not
        ended live without a TTL."""
        k = self.keys
        kept = [k.seq, k.running, k.handed, k.scheduler_wake, k.paused, k.workers]
        kept += [k.schedulers]
        kept += [k.known_queues, k.broadcast_seq, k.broadcast_cursors]
        for queue in QUEUES:
            kept += [k.queue(queue), k.wake(queue), k.delayed(queue)]
        expires = dict.fromkeys(kept, False)
        expires |= {k.failed(queue): True for queue in QUEUES}
        expires |= {k.worker(w): True for w in self.records}
        for job in self.jobs.values():
            if job.entry:
                expires[k.entries(job.id)] = False
            elif job.place != DELETED:
                expires[k.job(job.id)] = job.place == FINISHED
            if job.done:
                expires[k.done(job.id)] = True
            if job.then:
                expires[k.dependents(job.id)] = False
        required = {k.entries(job.id) for job in self.jobs.values() if job.entry}
        for group in self.groups.values():
            if group.gone:
                continue
            ongoing = group.total is not None and not group.finished
            expires[k.group(group.id)] = not ongoing
            required.add(k.group(group.id))
            if group.members:
                expires[k.group_members(group.id)] = not ongoing
            if group.finished:
                expires[k.group_done(group.id)] = True
        if any(g.indexed for g in self.groups.values()):
            expires[k.groups] = False
        if self.relay_records:
            expires[k.relayed] = False
        if self.unread:
            expires[k.broadcast_unread] = True
        if self.messages:
            expires[k.broadcast_sent] = True
        expires |= {k.broadcast_message(n): True for n in self.messages}
        expires |= {k.broadcast_wake(w): True for w in self.message_wakes}
        required |= {k.broadcast_wake(w) for w in self.message_wakes}
        for queue in WIDE_ORDER:  # when it holds a registration, stale or standing
            expires[k.idle(queue)] = True
        if self.idle_wide:
            expires[k.idle_wide] = True
            required.add(k.idle_wide)
        expires |= {k.idle_worker(w): True for w in self.idle}
        required |= {k.idle_worker(w) for w in self.idle}
        expires |= {k.handoff(w): True for w in self.handed}
        required |= {k.handoff(w) for w in self.handed}
        expires |= {k.stops(w): True for w, ids in self.stop_lists.items() if ids}
        required |= {k.stops(w) for w, ids in self.stop_lists.items() if ids}
        self.expected_limit_keys(expires, required)
        self.expected_fair_keys(expires)
        return expires, required

    def check_keys(self) -> None:
        """Every key is one the schema names, with a TTL unless the schema keeps it (no
        key left without one); the stats count every finish."""
        k = self.keys
        expires, required = self.expected_keys()
        keys = self.r.keys("*")
        stats_keys = [
            key
            for key in keys
            if key.startswith(k.stats_prefix) and key[len(k.stats_prefix) :].isdigit()
        ]
        pipe = self.r.pipeline(transaction=False)
        pipe.zrange(k.workers, 0, -1)
        pipe.zrange(k.schedulers, 0, -1)
        for key in keys:
            pipe.pttl(key)
        for key in stats_keys:
            pipe.hgetall(key)
        workers, schedulers, *replies = pipe.execute()
        assert set(workers) == self.heartbeats, f"workers {workers}, model {self.heartbeats}"
        assert set(schedulers) == self.schedulers, f"schedulers {schedulers}"
        stats: Counter[str] = Counter()
        for counts in replies[len(keys) :]:
            stats.update({f: int(v) for f, v in counts.items()})
        for key, ttl in zip(keys, replies, strict=False):
            if key in stats_keys:
                assert ttl > 0, f"{key} never expires"
                continue
            assert key in expires, f"unexpected key {key}"
            assert (ttl > 0) == expires[key], (
                f"{key}: TTL {ttl} ms; model: {'expires' if expires[key] else 'kept'}"
            )
        assert required <= set(keys), f"missing keys: {required - set(keys)}"
        assert stats == self.stats, f"stats {dict(stats)}, model {dict(self.stats)}"

    # Unique keys and limits.

    def check_job_options(self, name: str, job, fields: dict[str, str]) -> None:
        limit = LIMITS.get(job.limit or "")
        assert fields.get("limit") == (limit and limit.key), f"{name}: limit {fields}"
        running = limit and limit.running and str(limit.running)
        assert fields.get("max_running") == (running or None), f"{name}: max_running"
        rate = limit and limit.rate and f"{limit.rate}/{limit.per}"
        assert fields.get("rate") == (rate or None), f"{name}: rate {fields.get('rate')}"
        parked = limit.key if limit and job.place == PARKED else None
        assert fields.get("parked") == parked, f"{name}: parked {fields.get('parked')}, {job}"
        assert fields.get("unique") == job.unique, f"{name}: unique {fields.get('unique')}"
        assert fields.get("fair") == job.fair, f"{name}: fair {fields.get('fair')}"
        until = fields.get("unique_until")
        if job.unique_until is None:
            assert until is None, f"{name}: unique_until {until}"
        else:
            lo, hi = job.unique_until
            assert until is not None and lo <= int(until) <= hi, f"{name}: until {until}"

    def check_limits(self) -> None:
        """Unique keys hold what the model says; per limit key: the slots are its
        RUNNING jobs, whatever their limits; no RUNNING job started beside more jobs
        of its key than its max_running allows; the starts kept are the newest the
        key's window keeps, and the window is the model's; the parked set holds its
        parked jobs in queue order at their queue scores; a key with parked jobs has a
        look or a slot holder to unpark them."""
        k, pipe = self.keys, self.r.pipeline(transaction=False)
        for key in UNIQUE_KEYS:
            pipe.get(k.unique(key))
            pipe.pttl(k.unique(key))
        for key in LIMIT_KEYS:
            pipe.smembers(k.limit(key, "running"))
            pipe.zrange(k.limit(key, "starts"), 0, -1, withscores=True)
            pipe.pttl(k.limit(key, "starts"))
            pipe.hgetall(k.limit(key, "window"))
            pipe.pttl(k.limit(key, "window"))
            pipe.zrange(k.limit(key, "parked"), 0, -1, withscores=True)
        pipe.zrange(k.limits, 0, -1, withscores=True)
        parked_jobs = self.job_list(PARKED)
        for job in parked_jobs:
            pipe.hget(k.job(job.id), "score")
        replies = iter(pipe.execute())
        for key in UNIQUE_KEYS:
            holder, ttl = next(replies), next(replies)
            entry = self.unique_keys.get(key)
            assert holder == (entry and entry[0]), f"unique:{key} holds {holder}, model {entry}"
            if entry is not None:
                assert (ttl > 0) == entry[1], f"unique:{key}: TTL {ttl} ms, model {entry}"
                assert ttl <= HOUR, f"unique:{key}: TTL {ttl} ms, past its window"
        per_key = {key: [next(replies) for _ in range(6)] for key in LIMIT_KEYS}
        looks = next(replies)
        looked = {key for key, _ in looks}
        scores: dict[str, float] = {}
        for key in LIMIT_KEYS:
            slots, starts, starts_ttl, window, window_ttl, parked = per_key[key]
            running = self.running_under(key)
            assert slots == {j.id for j in running}, f"{key}: slots {slots}, running {running}"
            for job in running:
                limit = LIMITS[job.limit].running
                before = [j for j in running if j.claim_order < job.claim_order]
                assert not limit or len(before) < limit, f"{key}: {job} started beside {before}"
            self.check_window(key, window, window_ttl)
            self.check_starts(key, starts, starts_ttl)
            want = [j.id for j in self.parked_under(key)]
            got = [member for member, _ in parked]
            assert got == want, f"{key}: parked {self.names(got)}, model {self.names(want)}"
            scores |= dict(parked)
            assert not got or key in looked or slots, f"{key}: parked jobs stranded"
        assert looked == set(self.looks), f"looks {looks}, model {self.looks}"
        for key, score in looks:
            due = score <= self.last_clock  # moved to 0, or asked for at once
            assert due == self.looks[key], f"look of {key} at {score}, model {self.looks}"
            assert due or score > self.last_clock, f"look of {key} at {score}: in the past"
        for job in parked_jobs:
            assert float(next(replies)) == scores[job.id], f"job {job.n}: parked score"

    def check_window(self, key: str, window: dict[str, str], ttl: int) -> None:
        if key not in self.windows:
            assert not window, f"{key}: window {window}, model none"
            return
        starts, ms = self.windows[key]
        assert window == {"starts": str(starts), "ms": str(ms)}, f"{key}: window {window}"
        assert 0 < ttl <= ms + RATE_MEMORY, f"{key}: window TTL {ttl} ms"

    def check_starts(self, key: str, starts: list, ttl: int) -> None:
        """Redis keeps the newest of the key's starts, as many as its window says (the
        model keeps them all): those counted in any period of its jobs' rates."""
        model = sorted(self.starts[key], key=lambda s: (s.score, s.job_id))
        if not model:
            assert not starts, f"{key}: starts {starts}, model none"
            return
        keep, ms = self.windows[key]
        assert 0 < ttl <= ms, f"{key}: starts with TTL {ttl} ms"
        kept = [(f"{s.job_id}@{s.at}", float(s.score)) for s in model[-keep:]]
        assert starts == kept, f"{key}: starts {starts}, model {kept}"

    def expected_limit_keys(self, expires: dict[str, bool], required: set[str]) -> None:
        """The keys of unique jobs and limits, and whether they expire: a unique key
        held for a window, a key's starts (its longest period) and its window record
        do."""
        k = self.keys
        for key, (_, timed) in self.unique_keys.items():
            expires[k.unique(key)] = timed
            required.add(k.unique(key))
        for key in LIMIT_KEYS:
            if self.running_under(key):
                expires[k.limit(key, "running")] = False
            if self.starts[key]:
                expires[k.limit(key, "starts")] = True
            if key in self.windows:
                expires[k.limit(key, "window")] = True
            if self.parked_under(key):
                expires[k.limit(key, "parked")] = False
        if self.looks:
            expires[k.limits] = False
        required |= {key for key in expires if key.startswith(k.limit_prefix)}
        required |= {k.limits} if self.looks else set()

    # What a run reports.

    def names(self, ids) -> list[str]:
        return [f"#{self.jobs[i].n}" if i in self.jobs else i for i in ids]

    def abstract_state(self) -> tuple:
        return (
            tuple(
                (
                    j.queue,
                    j.priority,
                    j.place,
                    j.final,
                    j.attempts,
                    j.lost,
                    j.expired,
                    j.owner,
                    j.indexed,
                    j.cancelled,
                    j.waiters,
                    len(j.errors),
                    j.group is not None,
                    j.counted,
                    len(j.then),
                )
                for j in self.jobs.values()
            ),
            tuple(
                (len(g.members), g.total, g.ended, g.failed, bool(g.finished), g.cancelled)
                for g in self.groups.values()
            ),
            tuple(sorted(self.paused)),
            tuple(tuple(sorted(self.held[w].values())) for w in WORKERS),
            tuple((w in self.idle, w in self.handed) for w in WORKERS),
            tuple(self.last_message - self.cursors.get(w, -1) for w in WORKERS),
            len(self.unread),
            self.limits_state(),
        )

    def limits_state(self) -> tuple:
        return (
            tuple(j.limit for j in self.jobs.values()),
            tuple(
                (key, self.jobs[holder].n, timed)
                for key, (holder, timed) in sorted(self.unique_keys.items())
            ),
            tuple(tuple(sorted(s.age for s in starts)) for starts in self.starts.values()),
            tuple(sorted(self.windows.items())),
            tuple(sorted(self.looks.items())),
        )
