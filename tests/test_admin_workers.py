"""The overview's workers: each process's slots, how many are busy and the jobs in
hand (linked, with their tasks and starts, a few a worker), and the metrics' count of
slots and busy slots, from a real SlotWorker running blocked jobs."""

import json
import re
import threading
from unittest.mock import patch

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_redisqueue.dashboard.workers import IN_HAND_SHOWN
from django_redisqueue.observe.metrics import render
from django_redisqueue.runtime.slots import SlotWorker
from django_redisqueue.runtime.worker import Worker
from tests.conftest import manage, wait_until
from tests.support import tasks

pytestmark = pytest.mark.django_db

BASE = "/admin/django_redisqueue/dashboard/default/"


def gauge(backend, name):
    """A per-backend gauge of the exposition, as prometheus_client reads it."""
    for family in text_string_to_metric_families(render([backend])):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"backend": backend.alias}:
                return sample.value
    raise KeyError(name)


def worker_row(page, worker_id):
    """The overview's row of one worker: its cells' text, tags stripped."""
    row = re.search(rf'<tr data-worker="{re.escape(worker_id)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {worker_id}"
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row[1], re.S)
    return [" ".join(re.sub(r"<[^>]+>", " ", cell).split()) for cell in cells], row[1]


def started(r):
    return sum(1 for line in r.lrange(tasks.LOG, 0, -1) if line.startswith("started:"))


def test_the_overview_shows_each_processs_busy_slots_and_jobs_in_hand(viewer, backend, r):
    held = [tasks.block_until_released.enqueue(f"job{i}", 60) for i in range(4)]
    worker = SlotWorker(backend, threads=3, burst=True)
    idle = Worker(backend)  # one slot, none busy
    idle.register()

    def run():
        with patch("django_redisqueue.runtime.worker.close_old_connections"):
            worker.run()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        wait_until(lambda: started(r) == 3, 30, "three jobs started")
        wait_until(lambda: len(worker.in_hand()) == 3, 30, "three jobs in hand")
        assert r.hget(backend.keys.worker(worker.worker_id), "slots") == "3"
        assert r.hget(backend.keys.worker(idle.worker_id), "slots") == "1"

        page = viewer.get(BASE).text
        assert "Workers (2): 3 of 4 slots busy" in page
        cells, html = worker_row(page, worker.worker_id)
        assert cells[2] == "3 of 3"
        in_hand = [job.job_id for job, _ in worker.in_hand()]
        for job_id in in_hand:
            assert f'href="{BASE}job/{job_id}/"' in html
        assert cells[3].count("tests.support.tasks.block_until_released, started") == 3
        assert "more" not in cells[3]
        idle_cells, _ = worker_row(page, idle.worker_id)
        assert idle_cells[2:4] == ["0 of 1", "idle"]

        assert gauge(backend, "redisqueue_worker_slots") == 4
        assert gauge(backend, "redisqueue_worker_busy_slots") == 3
    finally:
        r.rpush("test:release", *[1] * len(held))
        thread.join(30)
    assert [job.wait(timeout=10) for job in held] == [True] * 4
    wait_until(lambda: gauge(backend, "redisqueue_worker_busy_slots") == 0, 10, "idle slots")


def test_a_worker_shows_its_longest_running_jobs_and_counts_the_rest(viewer, backend, r):
    """A worker of 8 slots holding 7 jobs: the 5 that started first are listed, oldest
    first, and the other 2 counted, with a link to the running page."""
    backend.broker.heartbeat("web-1:7:cafe", {"queues": "default", "slots": 8}, {})
    jobs = [tasks.add.enqueue(i, i) for i in range(7)]
    for _ in jobs:
        backend.broker.claim(["default"], "web-1:7:cafe")
    now = backend.broker.clock_ms()
    for age, job in enumerate(jobs):  # the last enqueued started first
        r.hset(backend.keys.job(job.id), "last_attempted_at", now - age * 1000)

    page = viewer.get(BASE).text
    cells, html = worker_row(page, "web-1:7:cafe")
    assert cells[2] == "7 of 8"
    shown = re.findall(rf'href="{BASE}job/([^/"]+)/"', html)
    assert shown == [job.id for job in reversed(jobs)][:IN_HAND_SHOWN]
    assert cells[3].endswith("and 2 more")
    assert f'href="{BASE}running/"' in html
    assert gauge(backend, "redisqueue_worker_busy_slots") == 7


def test_a_worker_that_records_no_slots_has_one(viewer, backend, r):
    """An older worker's record has no slot count: it shows, and counts, as one slot."""
    backend.broker.heartbeat("old:1:beef", {"queues": "default", "jobs_done": 4}, {})
    job = tasks.add.enqueue(1, 1)
    backend.broker.claim(["default"], "old:1:beef")
    cells, html = worker_row(viewer.get(BASE).text, "old:1:beef")
    assert cells[2] == "1 of 1" and cells[4] == "4"
    assert f"{BASE}job/{job.id}/" in html and "tests.support.tasks.add" in cells[3]
    assert gauge(backend, "redisqueue_worker_slots") == 1
    assert gauge(backend, "redisqueue_worker_busy_slots") == 1


def test_queuestats_counts_each_workers_slots(backend):
    backend.broker.heartbeat("web-1:7:cafe", {"queues": "default", "slots": 4}, {})
    tasks.add.enqueue(1, 1)
    backend.broker.claim(["default"], "web-1:7:cafe")
    table = manage("queuestats")
    assert "1 worker(s) alive (1 of 4 slots busy)" in table.stdout, table.stdout
    (worker,) = json.loads(manage("queuestats", "--json").stdout)["workers"]
    assert (worker["id"], worker["slots"], worker["busy"]) == ("web-1:7:cafe", 4, 1)
