"""Property-based fuzzing of the records the app reads besides jobs: worker, scheduler
and stats records, and what every dashboard page shows. Whatever they hold, the
overview and every page answer without a server error, escaping what they show, the
metrics count no more busy slots than slots, and a job still finishes. The hostile
values and the checks: tests/support/fuzzing.py."""

import itertools
import json
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import NoReverseMatch, reverse
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.observe.metrics import render
from tests.support import tasks
from tests.support.fuzzing import (
    JOB_FIELDS,
    MARK,
    OTHER_TYPES,
    TRIED,
    a_good_job_runs,
    counted,
    encode,
    fuzz,
    garbage,
    job_key,
    make_other_type,
    members,
    payloads,
)

pytestmark = pytest.mark.django_db


# 4. Worker, scheduler and stats records; 5. the dashboard's pages

BASE = "/admin/django_redisqueue/dashboard/default/"
QUEUES = ("high", "default", "low")

RECORD_TEXTS = [
    "", " ", MARK, "a/b", "x" * 300, "é", "1e400", "nan", "-1", "9" * 5000, "default,high",
    ",", "{}", "[]", b"\xff\xfe", b"\xed\xa0\x80", "0", "8", " 8", "9" * 400,
]  # fmt: skip
record_texts = st.one_of(
    st.sampled_from(RECORD_TEXTS),
    st.text(max_size=30),
    st.binary(max_size=30),
)
seen_scores = st.one_of(
    st.sampled_from(["now", "old", "later", float("inf"), float("-inf"), 0.0, 1e300, -1e300]),
    st.floats(allow_nan=False),
)
WORKER_FIELDS = ["queues", "pid", "host", "started_at", "jobs_done", "slots"]
# A job in hand whose task's name carries the mark: the overview shows it, escaped.
MARKED_TASK = json.dumps({"v": 1, "task": MARK, "args": [], "kwargs": {}})


def seen_at(value, now: int) -> float:
    return {"now": now, "old": now - 10**6, "later": now + 10**6}.get(value, value)


@pytest.fixture
def superuser() -> Client:
    account = User.objects.create_user("root", password="pw", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(account)
    return client


def get_page(client: Client, url: str, expected: int = 200) -> str:
    """GET a page: it must answer ``expected`` (a view that raises fails here) and
    show no raw markup from Redis."""
    response = client.get(url)
    assert response.status_code == expected, (url, response.status_code)
    text = response.content.decode("utf-8", "replace")
    assert MARK not in text, url
    return text


def delayed_urls(client: Client) -> tuple[dict[str, str], str]:
    """The delayed page of each queue, if this version has one per queue and it answers
    200 on an empty Redis (the page is being changed); else none."""
    try:
        urls = {q: reverse("admin:redisqueue_delayed", args=["default", q]) for q in QUEUES}
    except NoReverseMatch:
        return {}, "delayed pages skipped: no per-queue delayed page in this version"
    probe = Client(raise_request_exception=False)
    probe.cookies = client.cookies
    status = probe.get(urls["default"]).status_code
    if status != 200:
        return {}, f"delayed pages skipped: {urls['default']} answers {status} when empty"
    return urls, "delayed pages included"


@st.composite
def liveness_records(draw):
    workers = draw(
        st.lists(
            st.tuples(
                record_texts,
                seen_scores,
                st.one_of(
                    st.dictionaries(
                        st.one_of(st.sampled_from(WORKER_FIELDS), record_texts),
                        record_texts,
                        max_size=5,
                    ),
                    st.sampled_from(OTHER_TYPES),
                ),
                st.integers(0, 3),  # jobs in hand
            ),
            max_size=4,
            unique_by=lambda worker: encode(worker[0]),
        )
    )
    schedulers = draw(st.lists(st.tuples(record_texts, seen_scores), max_size=3))
    stats = draw(
        st.dictionaries(
            st.integers(-62, 1),
            st.one_of(
                st.dictionaries(
                    st.one_of(
                        st.sampled_from(["ok:default", "failed:default", "ok:high", "failed:low"]),
                        record_texts,
                    ),
                    st.one_of(garbage, st.integers().map(str)),
                    max_size=4,
                ),
                st.sampled_from(OTHER_TYPES),
            ),
            max_size=4,
        )
    )
    return workers, schedulers, stats


def test_the_overview_renders_whatever_the_worker_scheduler_and_stats_records_hold(
    raw, backend, superuser, report
):
    keys = backend.keys

    @fuzz(100)
    @given(
        records=liveness_records(),
        job_ids=st.lists(members, min_size=12, max_size=12),
        marked=st.booleans(),
    )
    def check(records, job_ids, marked):
        TRIED["liveness records"] += 1
        raw.flushall()
        now = backend.broker.clock_ms()
        workers, schedulers, stats = records
        ids = iter(job_ids)
        for worker_id, seen, info, in_hand in workers:
            worker_id = encode(worker_id)
            raw.zadd(keys.workers, {worker_id: seen_at(seen, now)})
            record = keys.worker("").encode() + worker_id
            if isinstance(info, str):
                make_other_type(raw, record, info, b"x")
            elif info:
                raw.hset(record, mapping={encode(k): encode(v) for k, v in info.items()})
            for job_id in itertools.islice(ids, in_hand):
                fields = {
                    "payload": MARKED_TASK if marked else "{", "queue": "default",
                    "status": "RUNNING", "owner": worker_id + b"/1",
                    "last_attempted_at": seen_at(seen, now),
                }  # fmt: skip
                raw.hset(job_key(backend, job_id), mapping=fields)
                raw.zadd(keys.running, {job_id: now + 10**6})
        for scheduler_id, seen in schedulers:
            raw.zadd(keys.schedulers, {encode(scheduler_id): seen_at(seen, now)})
        for offset, counts in stats.items():
            key = keys.stats(now // 60_000 + offset)
            if isinstance(counts, str):
                make_other_type(raw, key.encode(), counts, b"1")
            elif counts:
                raw.hset(key, mapping={encode(k): encode(v) for k, v in counts.items()})

        get_page(superuser, BASE)
        get_page(superuser, BASE + "?partial=1")
        found = {
            sample.name: sample.value
            for family in text_string_to_metric_families(render([backend]))
            for sample in family.samples
            if sample.name.startswith("redisqueue_worker")
        }
        assert 0 <= found["redisqueue_worker_busy_slots"] <= found["redisqueue_worker_slots"]
        assert found["redisqueue_worker_slots"] >= found["redisqueue_workers_alive"]

    with counted("liveness records", report):
        check()


def test_garbage_in_this_minutes_stats_does_not_stop_a_job_from_finishing(raw, backend, report):
    @fuzz(20)
    @given(
        field=st.sampled_from(["ok:default", "failed:default"]),
        value=st.one_of(
            st.sampled_from(["x", "1.5", " 1", "9" * 30, str(2**63 - 1), "", "1e3"]), garbage
        ),
    )
    def check(field, value):
        TRIED["stats values"] += 1
        raw.flushall()
        minute = backend.broker.clock_ms() // 60_000
        for key in (backend.keys.stats(minute), backend.keys.stats(minute + 1)):
            raw.hset(key, field, value)
        failing = tasks.fail.enqueue("expected")
        a_good_job_runs(backend)
        assert backend.get_result(failing.id).status == TaskResultStatus.FAILED

    with counted("stats values", report):
        check()


PLACES = ("queue", "delayed", "running", "failed")
# Valid envelopes whose every shown string carries the mark.
MARKED = json.dumps(MARK)
MARKED_PAYLOADS = [
    f'{{"v": 1, "task": {MARKED}, "args": [{MARKED}], "kwargs": {{{MARKED}: {MARKED}}}}}',
    f'{{"v": 1, "task": "tests.support.tasks.add", "args": [[{MARKED}]], "kwargs": {{}}}}',
    f'{{"v": 1, "task": "tests.support.tasks.add", "args": [], '
    f'"kwargs": {{"a": {{{MARKED}: 1}}}}}}',
]
marked_fields = st.dictionaries(
    st.sampled_from(JOB_FIELDS[:-1]),
    st.one_of(
        st.sampled_from(
            [MARK, json.dumps([{"exception_class_path": MARK, "traceback": MARK}]), f"{MARK}/1"]
        ),
        garbage,
    ),
    max_size=4,
)


@st.composite
def hostile_jobs(draw) -> list[tuple]:
    """Jobs with hostile ids, payloads and fields (or keys of another type), in a
    queue, a delayed set, the running set or a failed index."""
    return draw(
        st.lists(
            st.tuples(
                st.one_of(members, st.just(MARK.encode())),
                st.sampled_from(PLACES),
                st.sampled_from(QUEUES),
                st.one_of(
                    payloads,
                    st.sampled_from(MARKED_PAYLOADS).map(encode),
                    st.sampled_from(OTHER_TYPES),
                ),
                marked_fields,
                st.floats(allow_nan=False),
            ),
            min_size=1,
            max_size=6,
            unique_by=lambda job: job[0],
        )
    )


def test_every_dashboard_page_answers_and_escapes_whatever_the_jobs_hold(
    raw, backend, superuser, report
):
    keys = backend.keys
    delayed, note = delayed_urls(superuser)
    report(f"fuzz dashboard pages: {note}")

    @fuzz(80)
    @given(jobs=hostile_jobs(), partial=st.integers(0, 9))
    def check(jobs, partial):
        TRIED["dashboard pages"] += 1
        raw.flushall()
        pages = {BASE, BASE + "?partial=1"}
        for job_id, where, queue, payload, fields, score in jobs:
            key = job_key(backend, job_id)
            if payload in OTHER_TYPES:
                make_other_type(raw, key, payload, MARK.encode())
            else:
                raw.hset(key, mapping={"payload": payload, "queue": queue, **fields})
            target, page = {
                "queue": (keys.queue(queue), BASE + f"queue/{queue}/"),
                "delayed": (keys.delayed(queue), delayed.get(queue)),
                "running": (keys.running, BASE + "running/"),
                "failed": (keys.failed(queue), BASE + f"failed/{queue}/"),
            }[where]
            raw.zadd(target, {job_id: score})
            if page:
                pages.add(page)

        ordered = sorted(pages)
        for url in ordered:
            get_page(superuser, url)
        get_page(superuser, ordered[partial % len(ordered)] + "?partial=1")
        get_page(superuser, BASE + "job/no-such-job/", 404)
        for job_id, _, _, payload, _, _ in jobs:
            try:
                text = job_id.decode()
            except UnicodeDecodeError:
                continue
            if not text or "/" in text:
                continue  # cannot be one segment of a URL
            expected = 404 if payload in OTHER_TYPES else 200
            get_page(superuser, BASE + f"job/{quote(text, safe='')}/", expected)

    with counted("dashboard pages", report):
        check()
