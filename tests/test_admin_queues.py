"""The dashboard with QUEUES empty: queue names read back from Redis that break the
queue-name rule are skipped by every reader, and with thousands of queues every page
stays small and costs as many Redis commands as with a few."""

import os
import re
import time
from html import escape
from urllib.parse import urljoin

import pytest
from django.test import Client

from django_redisqueue.compat import TaskResultStatus, task_backends
from django_redisqueue.dashboard.rows import MENU_QUEUES, PAGE_SIZE
from django_redisqueue.runtime.worker import Worker
from tests.conftest import run_worker_here
from tests.support import tasks
from tests.support.keys import ANYQUEUE_KEYS
from tests.support.topology import keys_server, make_client

pytestmark = pytest.mark.django_db

ANY = "/admin/django_redisqueue/dashboard/anyqueue/"
# Members of the known queues that no enqueue writes: by hand, an older version, a bug.
NOT_QUEUE_NAMES = [
    b"a/b",
    b"",
    b"x" * 500,
    b"\xff\xfe",
    b"with space",
    b"good\n",
    "caf\u00e9".encode(),
    b"<script>alert(1)</script>",
]


def raw_client():
    """A client of the test's Redis that reads and writes bytes, not text."""
    return make_client(os.environ["REDISQUEUE_TEST_URL"])


def test_names_in_the_known_queues_that_are_no_queue_names_are_skipped(manager):
    backend = task_backends["anyqueue"]
    job = tasks.add.using(backend="anyqueue", queue_name="good").enqueue(1, 2)
    raw_client().sadd(backend.keys.known_queues, *NOT_QUEUE_NAMES)

    assert backend.served_queues() == ["good"]
    pages = [
        "",
        "?partial=1",
        "queue/good/",
        "delayed/",
        "delayed/good/",
        "failed/",
        "failed/good/",
        "running/",
        f"job/{job.id}/",
        "groups/",
        "broadcasts/",
        "schedules/",
        "confirm/empty/?queue=good",
    ]
    for page in pages:
        response = manager.get(ANY + page, follow=True)
        assert response.status_code == 200, page
        assert "/queue/good/" in response.text, page
        assert "with space" not in response.text and "<script>alert" not in response.text, page
    # A name that breaks the rule is no queue of the dashboard's, even if Redis holds it.
    for name in ("with%20space", "caf%C3%A9", "x" * 500):
        assert manager.get(ANY + f"queue/{name}/").status_code == 404, name

    metrics = Client().get("/metrics")
    assert metrics.status_code == 200
    assert 'backend="anyqueue",queue="good"' in metrics.text
    assert 'queue="with space"' not in metrics.text and 'queue="a/b"' not in metrics.text

    # A worker given no queue discovers the valid ones only, and serves them.
    worker = Worker(backend, burst=True)
    worker._refresh_queues()
    assert worker.queues == ["good"]
    run_worker_here(backend)
    assert backend.get_result(job.id).status == TaskResultStatus.SUCCESSFUL


MANY = 5000


def add_queues(backend, names):
    """Queues as enqueues to them leave them: known, some paused, one job in the last."""
    raw = raw_client()
    raw.sadd(backend.keys.known_queues, *names)
    raw.sadd(backend.keys.paused, *names[::2])


def add_live_worker(backend, names):
    """A worker alive now whose record says it serves ``names``, as one that discovered
    them does."""
    raw = raw_client()
    raw.zadd(backend.keys.workers, {"host:1:w": backend.broker.clock_ms()})
    raw.hset(backend.keys.worker("host:1:w"), mapping={"queues": ",".join(names), "host": "h"})


def commands(r, get):
    """The Redis commands (calls, by INFO commandstats) that ``get()`` costs."""

    def calls():
        stats = keys_server(r, ANYQUEUE_KEYS.prefix).info("commandstats")
        return sum(stat["calls"] for name, stat in stats.items() if name != "cmdstat_info")

    before = calls()
    get()
    return calls() - before


def menu(text):
    return re.search(r'<nav class="drq-nav".*?</nav>', text, re.S)[0]


PAGES = [
    "",
    "?partial=1",
    "?q=q0000",
    "?q=q0000&partial=1",
    "queue/q00001/",
    "delayed/q00002/",
    "failed/q00003/",
    "running/",
    "groups/",
    "broadcasts/",
    "schedules/",
]


def test_with_thousands_of_queues_every_page_stays_small_and_costs_the_same(manager, r, report):
    backend = task_backends["anyqueue"]
    names = [f"q{i:05d}" for i in range(MANY)]
    few = names[: PAGE_SIZE + 1]  # two pages of the overview
    add_queues(backend, few)
    add_live_worker(backend, few)
    for page in PAGES:
        manager.get(ANY + page)  # connections made, scripts loaded
    cost = {page: commands(r, lambda page=page: manager.get(ANY + page)) for page in PAGES}

    add_queues(backend, names)
    add_live_worker(backend, names)
    for page in PAGES:
        started = time.perf_counter()
        response = manager.get(ANY + page)
        took = time.perf_counter() - started
        assert response.status_code == 200, page
        size = len(response.content)
        assert size < 150_000, (page, size)  # 4 MB when every queue was listed
        if "partial" not in page:
            assert len(menu(response.text)) < 20_000, page
        report(f"{MANY} queues: {ANY + page} {size / 1024:.1f} KB in {took:.3f} s")
        assert commands(r, lambda page=page: manager.get(ANY + page)) == cost[page], page

    overview = manager.get(ANY).text
    more = MANY - MENU_QUEUES
    assert f"{more} more queues" in menu(overview)  # a link to the overview's pages
    assert "1&ndash;50 of 5000" in overview and f"and {more} more" in overview  # the worker
    # The page of a queue far down the list names it in the menu, the others not.
    assert 'aria-current="page">q04999<' in manager.get(ANY + "delayed/q04999/").text
    assert manager.get(ANY + "failed/").status_code == 302


def test_every_queue_is_reached_through_the_overview_pages_and_its_filter(viewer):
    backend = task_backends["anyqueue"]
    names = [f"q{i:05d}" for i in range(MANY)]
    add_queues(backend, names)
    seen = []
    url = ANY + "?partial=1"  # the part that refreshes holds the pager too
    while url:
        page = viewer.get(url).text
        seen += re.findall(r'<tr data-queue="([^"]+)">', page)
        following = re.search(r'<a href="([^"]+)">next &rsaquo;</a>', page)
        url = urljoin(ANY, following[1].replace("&amp;", "&") + "&partial=1") if following else ""
    assert seen == names

    found = viewer.get(ANY, {"q": " Q0499 "}).text  # any case, spaces around ignored
    assert re.findall(r'<tr data-queue="([^"]+)">', found) == names[4990:]
    assert 'value="Q0499"' in found
    many = viewer.get(ANY, {"q": "q01", "page": 3}).text  # the filter holds across pages
    assert "101&ndash;150 of 1000" in many and "page 3 of 20" in many
    assert 'href="?q=q01&amp;page=4"' in many


@pytest.mark.parametrize(
    "number", ["-1", "0", "99999999999999999999", "9" * 5000, "abc", "1e3", "2.5", "\x00", ""]
)
def test_any_page_number_gives_a_page_of_queues(viewer, number):
    add_queues(task_backends["anyqueue"], [f"q{i:05d}" for i in range(2 * PAGE_SIZE + 1)])
    for query in ({"page": number}, {"page": number, "q": "Q", "partial": "1"}):
        response = viewer.get(ANY, query)
        assert response.status_code == 200, query
        assert 1 <= len(re.findall(r"<tr data-queue=", response.text)) <= PAGE_SIZE, query


def test_the_queue_filter_is_shown_escaped(viewer):
    add_queues(task_backends["anyqueue"], [f"q{i:05d}" for i in range(2 * PAGE_SIZE)])
    for search in ("<script>alert(1)</script>", '"><svg onload=alert(1)>'):
        page = viewer.get(ANY, {"q": search}).text
        assert "<script>alert" not in page and "<svg onload" not in page
        assert page.count(escape(search)) == 2  # in the field and in the empty row


def test_names_in_the_other_sets_the_dashboard_reads_never_break_a_page(manager):
    backend = task_backends["anyqueue"]
    keys, raw, now = backend.keys, raw_client(), backend.broker.clock_ms()
    raw.sadd(keys.known_queues, "good")
    raw.sadd(keys.periodic, *NOT_QUEUE_NAMES)
    raw.sadd(keys.paused, *NOT_QUEUE_NAMES)
    for key in (keys.workers, keys.running, keys.groups, keys.broadcast_sent, keys.limits):
        raw.zadd(key, dict.fromkeys(NOT_QUEUE_NAMES, now))
    for key in (keys.queue("good"), keys.delayed("good"), keys.failed("good")):
        raw.zadd(key, dict.fromkeys(NOT_QUEUE_NAMES, now))
    raw.hset(keys.worker("with space"), mapping={"queues": b",".join(NOT_QUEUE_NAMES)})
    for page in ["", "queue/good/", "delayed/good/", "failed/good/", "running/", "groups/"]:
        for partial in ({}, {"partial": 1}):
            response = manager.get(ANY + page, partial)
            assert response.status_code == 200, page
            assert "<script>alert" not in response.text, page
    for page in ["broadcasts/", "schedules/"]:
        assert manager.get(ANY + page).status_code == 200, page
