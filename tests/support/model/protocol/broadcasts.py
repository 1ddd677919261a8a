"""Broadcasts in the protocol model: messages for every worker or for a queue's, the
workers' cursors (a heartbeat registers one, receive moves it, unregister drops it, and
so does a lease of silence), the unread set, and each worker's receive loop, which
reads on until nothing for its queues is left."""

from __future__ import annotations

from functools import partial

import redis
from hypothesis import strategies as st
from hypothesis.stateful import rule

from django_redisqueue import Job as WorkflowJob
from django_redisqueue.core.jobs import FAILED, SUCCESSFUL
from django_redisqueue.store.wire import Received
from tests.support import tasks
from tests.support.model.harness import RUN, snapshot
from tests.support.model.protocol.records import Message
from tests.support.model.protocol.strategies import BROADCAST_QUEUE, ORDER, WORKER


class BroadcastModel:
    """Broadcast messages and the workers' cursors."""

    # The model's moves, as the scripts make them.

    def m_trim_broadcasts(self) -> None:
        """Drop the cursors of workers silent for a lease (or gone from the workers),
        then the messages every remaining cursor has passed."""
        for worker in list(self.cursors):
            if worker not in self.heartbeats or worker in self.silent:
                del self.cursors[worker]
        lowest = min(self.cursors.values(), default=None)
        self.unread = set() if lowest is None else {n for n in self.unread if n > lowest}

    def m_broadcast(self, queue: str, window: tuple[int, int]) -> int:
        self.last_message += 1
        number = self.last_message
        self.messages[number] = Message(number, queue, window)
        self.unread.add(number)
        self.m_trim_broadcasts()
        self.message_wakes |= set(self.cursors)
        return number

    def m_receive(
        self,
        worker: str,
        queues,
        ran: list[tuple[int, str]],
        most: int,
        window: tuple[int, int],
    ) -> tuple[list[int], bool]:
        """receive.lua: the messages taken, and whether unread ones remain past the
        ``most`` read (for this worker's queues or not)."""
        for number, status in ran:
            if number in self.messages:
                self.messages[number].ran[worker] = (status, *window)
        cursor = self.cursors.get(worker)
        if cursor is None:  # not registered: from now on, as a new worker
            self.cursors[worker] = self.last_message
            return [], False
        taken, last = [], cursor
        for number in sorted(n for n in self.unread if n > cursor)[:most]:
            last = number
            message = self.messages[number]
            if message.queue in ("", *queues):
                message.ran[worker] = ("RUNNING", *window)
                taken.append(number)
        if last > cursor:
            self.cursors[worker] = last
            self.m_trim_broadcasts()
        assert not self.received[worker] & set(taken), f"{worker} takes {taken} again"
        self.received[worker] |= set(taken)
        return taken, any(n > last for n in self.unread)

    # Operations.

    def op_broadcast(self, queue: str, via_api: bool, lost: bool = False) -> None:
        t0 = self.clock()
        number: int | None = None
        try:
            if via_api:
                number = self.backend.send_broadcast(WorkflowJob(tasks.noop), queue)
            else:
                number = self.broker.broadcast(self.payload, queue)
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
        t1 = self.clock()
        expected = self.m_broadcast(queue, (t0, t1))
        if not lost:
            assert number == expected, f"broadcast number {number}, model {expected}"

    def op_receive(
        self, worker: str, queues, report: str, most: int, lost: bool = False
    ) -> tuple[list[int], bool]:
        """The worker reports how the messages it took ran (``report``: all SUCCESSFUL,
        all FAILED, alternately, or not yet), then takes the next ones: their numbers
        (none when the reply is lost), and whether unread messages remain."""
        statuses = {SUCCESSFUL: [SUCCESSFUL], FAILED: [FAILED], "mixed": [SUCCESSFUL, FAILED]}
        ran = []
        if report in statuses:
            cycle = statuses[report]
            ran = [(n, cycle[i % len(cycle)]) for i, n in enumerate(self.to_report[worker])]
        t0 = self.clock()
        received: Received | None = None
        try:
            received = self.broker.receive(worker, queues, ran, most=most)
        except redis.exceptions.ConnectionError:
            if not lost:
                raise
        t1 = self.clock()
        expected, more = self.m_receive(worker, queues, ran, most, (t0, t1))
        if ran:
            self.to_report[worker] = []
        if lost:
            return [], False  # the worker never learns what it took: it does not run them
        assert received is not None
        got = [n for n, _ in received.messages]
        assert got == expected, f"{worker} received {got} from {queues}, model {expected}"
        assert received.more == more, f"{worker}: more {received.more}, model {more}"
        assert all(payload == self.payload for _, payload in received.messages)
        self.to_report[worker] += got
        RUN["messages received"] += len(got)
        RUN["receives past other queues' messages"] += bool(more and not got)
        return got, more

    def op_receive_loop(
        self, worker: str, order, report: str, most: int, memory_fills: bool
    ) -> None:
        """A worker's broadcast loop (broadcasts.Inbox.receive): it takes the messages
        it has not read, runs them, and reports how they ended in its next call, until
        a call takes nothing and says none remain (``report`` 'not yet': it stops after
        one call). ``memory_fills``: Redis is out of memory from the second call on
        (each call is refused whole, or runs whole)."""
        taken, more = self.op_receive(worker, order, report, most)
        if report == "not yet":
            return
        while taken or more:
            call = partial(self.op_receive, worker, order, report, most)
            if memory_fills:
                reply = self.out_of_memory(call, snapshot(self.r))
                if reply is None:  # refused: the worker backs off and tries later
                    return
                taken, more = reply
            else:
                taken, more = call()
        # Its loop is over: nothing sent for its queues since it registered is left.
        cursor = self.cursors.get(worker)
        if cursor is not None:
            missed = [
                n for n in self.unread if n > cursor and self.messages[n].queue in ("", *order)
            ]
            assert not missed, f"{worker} stopped receiving before messages {missed}"

    def op_unregister(self, worker: str) -> None:
        self.broker.unregister_worker(worker)
        self.heartbeats.discard(worker)
        self.silent.discard(worker)
        self.records.discard(worker)
        self.message_wakes.discard(worker)
        self.cursors.pop(worker, None)
        self.to_report[worker] = []

    # Rules: broadcast.

    @rule(queues=st.lists(BROADCAST_QUEUE, min_size=1, max_size=2), via_api=st.booleans())
    def broadcast(self, queues, via_api):
        """One message or two, for every worker or for a queue's."""
        for queue in queues:
            self.op_broadcast(queue, via_api)

    @rule(
        worker=WORKER,
        order=ORDER,
        report=st.sampled_from(["not yet", SUCCESSFUL, FAILED, "mixed"]),
        most=st.sampled_from([1, 2, 100]),
        beat=st.booleans(),
        memory_fills=st.sampled_from([False, False, False, True]),
    )
    def receive(self, worker, order, report, most, beat, memory_fills):
        """A worker's broadcast loop (broadcasts.Inbox.receive). ``beat``: its
        heartbeat ran just before, as a live worker's does every few seconds."""
        if beat:
            self.op_heartbeat(worker, {})
        self.op_receive_loop(worker, order, report, most, memory_fills)

    @rule(
        worker=WORKER,
        others=st.integers(1, 4),
        most=st.sampled_from([1, 2]),
        report=st.sampled_from([SUCCESSFUL, FAILED, "mixed"]),
    )
    def broadcasts_past_a_read(self, worker, others, most, report):
        """A worker of one queue is sent more messages for another queue than one
        receive reads, then one for every worker: its loop reads on past them."""
        self.op_heartbeat(worker, {})
        self.op_receive(worker, ("default",), "not yet", most)  # it has a cursor now
        for _ in range(others):
            self.op_broadcast("high", via_api=False)
        self.op_broadcast("", via_api=False)
        self.op_receive_loop(worker, ("default",), report, most, memory_fills=False)

    @rule(worker=WORKER, how=st.sampled_from(["falls silent", "unregisters"]))
    def worker_goes_away(self, worker, how):
        """A worker silent for a lease (its last heartbeat moves a lease into the
        past), or one that exits cleanly (unregister_worker)."""
        if how == "unregisters":
            self.op_unregister(worker)
        elif worker in self.heartbeats:
            self.r.zadd(self.keys.workers, {worker: 0}, xx=True)
            self.silent.add(worker)
