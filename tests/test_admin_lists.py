"""The dashboard's lists: breadcrumbs in the admin's markup of this Django, times as
people say them, the overview's totals, the failed list's filters (bounded reads,
hostile values) and actions on the jobs selected in a list (POST, CSRF, permission,
confirmation, validated and bounded selections)."""

import re
from datetime import UTC, datetime
from html import unescape
from unittest.mock import patch

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils.http import url_has_allowed_host_and_scheme
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.dashboard import actions
from django_redisqueue.dashboard import reads as dashboard
from django_redisqueue.dashboard.rows import relative
from django_redisqueue.templatetags.redisqueue_dashboard import moment
from tests.conftest import clock_at, run_worker_here
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS
from tests.test_admin import BASE

pytestmark = pytest.mark.django_db

SELECTED = BASE + "selected/"
MARK = "<script>drq()"  # must never reach a page unescaped
FAILED_SET = DEFAULT_KEYS.failed("default")


def fuzz(examples: int) -> hypothesis_settings:
    return hypothesis_settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def messages_of(response) -> str:
    found = re.search(r'<ul class="messagelist">(.*?)</ul>', response.text, re.S)
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", found[1])).split()) if found else ""


def text_of(html: str) -> str:
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def table_rows(page: str) -> list[str]:
    body = re.search(r'id="drq-jobs".*?<tbody>(.*?)</tbody>', page, re.S)[1]
    return [text_of(row) for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)]


def table_cells(page: str) -> list[list[str]]:
    """The text of each cell of each body row of the jobs table."""
    body = re.search(r'id="drq-jobs".*?<tbody>(.*?)</tbody>', page, re.S)[1]
    return [
        [text_of(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def failing(backend, task, count, argument="x"):
    jobs = [task.enqueue(argument) for _ in range(count)]
    run_worker_here(backend)
    return jobs


# Breadcrumbs


def breadcrumbs(page: str) -> tuple[str, list[str]]:
    """The breadcrumbs' element (``ol`` or ``div``) and the text of each crumb."""
    nav = re.search(
        r'<nav aria-label="Breadcrumbs">\s*<(ol|div) class="breadcrumbs">(.*?)</\1>', page, re.S
    )
    assert nav, "no breadcrumbs in the admin's nav"
    if nav[1] == "ol":
        items = re.findall(r"<li[^>]*>(.*?)</li>", nav[2], re.S)
    else:
        items = nav[2].split("&rsaquo;")
    return nav[1], [text_of(item) for item in items]


def test_breadcrumbs_follow_the_markup_of_the_admin_of_this_django(viewer, backend):
    job = tasks.add.enqueue(1, 1)
    # The admin's own page of this app: the markup its CSS styles.
    admin_element, _ = breadcrumbs(viewer.get("/admin/django_redisqueue/").text)
    start = ["Home", "Redis queue"]
    for url, crumbs in [
        (BASE, [*start, "Queue dashboard (default)"]),
        (BASE + "queue/default/", [*start, "Queue dashboard (default)", "Queue default"]),
        (BASE + f"job/{job.id}/", [*start, "Queue dashboard (default)", f"Job {job.id}"]),
        (BASE + "failed/default/", [*start, "Queue dashboard (default)", "Failed jobs: default"]),
    ]:
        page = viewer.get(url).text
        assert breadcrumbs(page) == (admin_element, crumbs), url
    # The last crumb is the page itself, not a link; on a list the current one is marked.
    page = viewer.get(BASE + "groups/").text
    if admin_element == "ol":
        assert '<li aria-current="page">Groups</li>' in page
    else:
        assert re.search(r"&rsaquo; Groups\s*</div>", page)


# Times


def test_times_read_as_people_say_them_with_the_exact_time_in_a_title(viewer, backend, r):
    """Each page read with Redis's clock pinned a set time after (or before) the time
    it shows, so that the words are the same on a host however slow."""
    tasks.add.using(delay=3600).enqueue(1, 1)
    failing(backend, tasks.fail, 1)
    backend.broker.heartbeat("web-1:7:cafe", {"queues": "default"}, {})

    due = int(r.zrange(DEFAULT_KEYS.delayed("default"), 0, 0, withscores=True)[0][1])
    with clock_at(due - 3_599_000):  # 59 minutes 59 seconds before
        delayed = viewer.get(BASE + "delayed/default/").text
    exact = datetime.fromtimestamp(due / 1000, UTC)
    stamp = re.search(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', delayed)
    assert stamp[1] == exact.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert stamp[2] == exact.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert unescape(stamp[3]) == "in 59\xa0minutes"
    with clock_at(due - 3_600_000):
        delayed = viewer.get(BASE + "delayed/default/").text
    assert "in 1\xa0hour</time>" in delayed

    finished = int(r.zrange(DEFAULT_KEYS.failed("default"), 0, 0, withscores=True)[0][1])
    with clock_at(finished + 3_000):
        failed = table_rows(viewer.get(BASE + "failed/default/").text)[0]
    assert failed.startswith("3 seconds ago ")
    with clock_at(finished + 400):
        failed = table_rows(viewer.get(BASE + "failed/default/").text)[0]
    assert failed.startswith("just now ")
    seen = int(r.zscore(backend.keys.workers, "web-1:7:cafe"))
    with clock_at(seen + 1_000):
        overview = viewer.get(BASE).text
    workers = text_of(re.search(r'id="drq-workers".*?</table>', overview, re.S)[0])
    assert "web-1:7:cafe default 0 of 1 idle 1 second ago" in workers


def test_a_page_in_another_time_zone_titles_its_times_in_that_zone(viewer, backend, settings):
    job = tasks.add.enqueue(1, 1)
    settings.TIME_ZONE = "Asia/Tokyo"
    page = viewer.get(BASE + f"job/{job.id}/").text
    tokyo = job.enqueued_at.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    assert f'title="{tokyo:%Y-%m-%d %H:%M:%S} JST"' in page


@fuzz(300)
@given(
    moment_at=st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
    now=st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
    ),
)
def test_relative_times_say_which_way_and_how_far(moment_at, now):
    said = relative(moment_at, now)
    seconds = (moment_at - now).total_seconds()
    if abs(seconds) < 1:
        assert said in ("now", "just now")
    elif seconds > 0:
        assert re.fullmatch(r"in \d+\xa0\w+(, \d+\xa0\w+)?", said), said
    else:
        assert re.fullmatch(r"\d+\xa0\w+(, \d+\xa0\w+)? ago", said), said
    if 1 <= abs(seconds) < 60:
        assert f"{int(abs(seconds))}\xa0second" in said


@fuzz(50)
@given(value=st.one_of(st.none(), st.text(max_size=20), st.integers(), st.floats()))
def test_anything_but_a_time_shows_as_a_dash(value):
    assert moment({}, value) == "\u2013"


# The overview's totals


@pytest.mark.parametrize("who", ["viewer", "manager"])
def test_the_totals_row_has_a_cell_under_each_column(who, request):
    page = request.getfixturevalue(who).get(BASE).text
    table = re.search(r'id="drq-queues".*?</table>', page, re.S)[0]
    head = re.search(r"<thead>(.*?)</thead>", table, re.S)[1]
    foot = re.search(r"<tfoot>(.*?)</tfoot>", table, re.S)[1]
    body = re.search(r"<tbody>.*?<tr[^>]*>(.*?)</tr>", table, re.S)[1]
    cells = [len(re.findall(r"<t[hd][ >]", part)) for part in (head, body, foot)]
    assert cells[0] == cells[1] == cells[2] == (8 if who == "manager" else 7)


# The failed list's filters


def test_the_failed_list_filters_by_task_and_exception(viewer, backend):
    values = failing(backend, tasks.fail, 3)
    typed = [tasks.add.enqueue("one", 1) for _ in range(2)]  # TypeError
    run_worker_here(backend)
    url = BASE + "failed/default/"

    page = viewer.get(url).text
    assert '<option value="tests.support.tasks.fail">tests.support.tasks.fail (3)</option>' in page
    assert '<option value="tests.support.tasks.add">tests.support.tasks.add (2)</option>' in page
    assert '<option value="builtins.ValueError">builtins.ValueError (3)</option>' in page
    assert "Among the newest 5 failed jobs." in text_of(page)

    by_task = viewer.get(url, {"task": "tests.support.tasks.add"}).text
    assert [cells[2] for cells in table_cells(by_task)] == ["tests.support.tasks.add"] * 2
    assert '<option value="tests.support.tasks.add" selected>' in by_task
    both = viewer.get(
        url, {"task": "tests.support.tasks.fail", "exception": "builtins.TypeError"}
    ).text
    assert "No failed job matches the filters" in both
    by_class = viewer.get(url, {"exception": "builtins.ValueError", "partial": 1}).text
    assert sorted(cells[1][:-1] for cells in table_cells(by_class)) == sorted(
        job.id[:13] for job in values
    )
    assert typed[0].id[:13] not in by_class
    # A path of no failed job seen: offered as chosen, nothing listed.
    none = viewer.get(url, {"task": "app.tasks.gone"}).text
    assert '<option value="app.tasks.gone" selected>app.tasks.gone (0)</option>' in none
    assert "0 failed jobs in default of app.tasks.gone" in text_of(none)


def test_a_filtered_list_pages_with_its_filter(viewer, backend):
    failing(backend, tasks.fail, 52)
    failing(backend, tasks.add, 1, argument="one")
    page = viewer.get(BASE + "failed/default/", {"task": "tests.support.tasks.fail"}).text
    assert "page 1 of 2" in page
    assert 'href="?task=tests.support.tasks.fail&amp;page=2"' in page
    second = viewer.get(
        BASE + "failed/default/", {"task": "tests.support.tasks.fail", "page": 2}
    ).text
    assert len(table_rows(second)) == 2


def test_filtering_reads_only_the_newest_failed_jobs(viewer, backend, monkeypatch):
    failing(backend, tasks.add, 3, argument="one")  # the oldest
    failing(backend, tasks.fail, 5)
    monkeypatch.setattr(dashboard, "FILTER_SCAN_LIMIT", 4)
    monkeypatch.setattr(dashboard, "FILTER_READ_BATCH", 3)
    read = []
    jobs = backend.queries.jobs

    def counted(job_ids, *fields):
        read.append(len(job_ids))
        return jobs(job_ids, *fields)

    with patch.object(type(backend.queries), "jobs", side_effect=counted, autospec=False):
        page = viewer.get(BASE + "failed/default/", {"task": "tests.support.tasks.add"}).text
    assert max(read) <= 3 and sum(read) <= 4  # in batches, never the whole index
    assert "0 failed jobs in default of tests.support.tasks.add, among the newest 4" in text_of(
        page
    )
    assert "Among the newest 4 failed jobs of 8 (the filters read at most" in text_of(page)
    # Too old to be seen: offered as chosen only.
    assert (
        '<option value="tests.support.tasks.add" selected>tests.support.tasks.add (0)</option>'
        in page
    )
    assert "tests.support.tasks.fail (4)" in page


@fuzz(60)
@given(
    task=st.one_of(
        st.text(max_size=40), st.sampled_from([MARK, "a.<b>", "tests.support.tasks.fail"])
    ),
    exception=st.one_of(st.text(max_size=40), st.just(f'"{MARK}')),
    page=st.one_of(st.text(max_size=5), st.integers().map(str)),
)
def test_hostile_filter_values_never_error_nor_reach_the_page(viewer, task, exception, page):
    response = viewer.get(
        BASE + "failed/default/", {"task": task, "exception": exception, "page": page}
    )
    assert response.status_code == 200
    text = response.content.decode()
    assert MARK not in text and "<b>" not in text
    for name, value in (("task", task), ("exception", exception)):
        stripped = value.strip()
        valid = bool(stripped) and all(p.isidentifier() for p in stripped.split("."))
        note = re.search(r"Ignored the [^<]*", text)
        assert bool(note and name in note[0]) == bool(stripped and not valid), note


# Actions on selected jobs


def checkbox_ids(page: str) -> list[str]:
    return re.findall(
        r'<input type="checkbox" name="job_id" value="([^"]*)" form="drq-selection"', page
    )


def test_only_a_manager_sees_the_checkboxes_and_the_actions(viewer, manager, backend):
    jobs = failing(backend, tasks.fail, 2)
    assert checkbox_ids(viewer.get(BASE + "failed/default/").text) == []
    assert 'id="drq-selection"' not in viewer.get(BASE + "failed/default/").text
    page = manager.get(BASE + "failed/default/").text
    assert sorted(checkbox_ids(page)) == sorted(job.id for job in jobs)
    assert 'class="drq-select-all"' in page
    assert '<option value="retry_failed">Retry selected jobs</option>' in page
    # The refreshed part keeps its checkboxes, which join the form outside it.
    partial = manager.get(BASE + "failed/default/", {"partial": 1}).text
    assert sorted(checkbox_ids(partial)) == sorted(job.id for job in jobs)


def test_retry_and_delete_the_selected_failed_jobs(manager, backend, r):
    jobs = failing(backend, tasks.fail, 3)
    here = BASE + "failed/default/?task=tests.support.tasks.fail"
    response = manager.post(
        SELECTED,
        {
            "action": "retry_failed",
            "queue": "default",
            "job_id": [jobs[0].id, jobs[1].id],
            "next": here,
        },
    )
    assert response.status_code == 302 and response["Location"] == here
    assert [backend.get_result(job.id).status for job in jobs] == [
        TaskResultStatus.READY,
        TaskResultStatus.READY,
        TaskResultStatus.FAILED,
    ]
    assert "2 of 2 selected job(s) of queue default put back on their queue" in messages_of(
        manager.get(here)
    )

    # Deleting asks first, listing each job; nothing is deleted until confirmed.
    ask = manager.post(
        SELECTED,
        {"action": "delete_failed", "queue": "default", "job_id": [jobs[2].id, jobs[0].id]},
    )
    assert ask.status_code == 200 and "Yes, I'm sure" in ask.text
    listed = text_of(re.search(r'id="drq-selected">(.*?)</ul>', ask.text, re.S)[1])
    assert f"{jobs[2].id} : tests.support.tasks.fail, FAILED" in listed
    assert f"{jobs[0].id} : tests.support.tasks.fail, READY" in listed
    hidden = re.findall(r'<input type="hidden" name="job_id" value="([^"]*)">', ask.text)
    assert hidden == [jobs[2].id, jobs[0].id]
    assert r.zcard(FAILED_SET) == 1
    done = manager.post(
        SELECTED,
        {"action": "delete_failed", "queue": "default", "job_id": hidden, "confirmed": "yes"},
        follow=True,
    )
    # The job retried meanwhile had left the failed list: only the other is deleted.
    assert "1 of 2 selected job(s) of queue default deleted. The others had left" in messages_of(
        done
    )
    assert r.zcard(FAILED_SET) == 0 and r.exists(DEFAULT_KEYS.job(jobs[2].id)) == 0
    assert backend.get_result(jobs[0].id).status == TaskResultStatus.READY


def test_run_now_and_cancel_the_selected_delayed_and_waiting_jobs(manager, backend, r):
    delayed = [tasks.add.using(delay=600).enqueue(i, i) for i in range(3)]
    manager.post(
        SELECTED,
        {"action": "run_now", "queue": "default", "job_id": [delayed[0].id, delayed[2].id]},
    )
    assert sorted(r.zrange(DEFAULT_KEYS.queue("default"), 0, -1)) == sorted(
        [delayed[0].id, delayed[2].id]
    )
    assert r.zrange(DEFAULT_KEYS.delayed("default"), 0, -1) == [delayed[1].id]

    backend.broker.claim(["default"], "worker-1")  # one of them starts
    running = next(
        j for j in delayed if backend.get_result(j.id).status == TaskResultStatus.RUNNING
    )
    chosen = [delayed[0].id, delayed[1].id, delayed[2].id]
    ask = manager.post(SELECTED, {"action": "cancel", "queue": "default", "job_id": chosen})
    assert ask.status_code == 200 and "Cancel selected jobs" in ask.text
    response = manager.post(
        SELECTED,
        {"action": "cancel", "queue": "default", "job_id": chosen, "confirmed": "yes"},
        follow=True,
    )
    said = messages_of(response)
    assert "2 of 3 selected job(s) cancelled." in said
    assert "1 selected job(s) not cancelled, as they had started, ended or expired" in said
    assert said.endswith(f"meanwhile: {running.id}.")
    statuses = {j.id: backend.get_result(j.id).status for j in delayed}
    assert sorted(statuses.values()) == sorted(
        [TaskResultStatus.RUNNING, TaskResultStatus.FAILED, TaskResultStatus.FAILED]
    )


def test_acting_on_a_selection_needs_post_csrf_and_the_manage_permission(
    viewer, manager, backend, r
):
    jobs = failing(backend, tasks.fail, 1)
    data = {"action": "retry_failed", "queue": "default", "job_id": [jobs[0].id]}
    assert Client().post(SELECTED, data)["Location"].startswith("/admin/login/")
    assert viewer.post(SELECTED, data).status_code == 403
    assert manager.get(SELECTED, data).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="manager"))
    assert strict.post(SELECTED, data).status_code == 403
    assert manager.post(SELECTED, {**data, "queue": "nope"}).status_code == 404
    assert r.zcard(FAILED_SET) == 1


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"action": "retry_failed"}, "Select the jobs to act on: nothing done."),
        ({"action": "empty", "job_id": ["ok"]}, "Choose an action for the selected jobs"),
        ({"action": "", "job_id": ["ok"]}, "Choose an action for the selected jobs"),
        (
            {"action": "retry_failed", "job_id": ["ok", "a/b"]},
            "Some selected values are not job ids",
        ),
        (
            {"action": "retry_failed", "job_id": ["ok", *(f"id-{i}" for i in range(50))]},
            "At most 50 jobs",
        ),
    ],
)
def test_a_wrong_selection_changes_nothing(manager, backend, r, data, said):
    jobs = failing(backend, tasks.fail, 1)
    if "job_id" in data:  # the real failed job among the selection, "ok" standing for it
        data = {**data, "job_id": [jobs[0].id if i == "ok" else i for i in data["job_id"]]}
    response = manager.post(
        SELECTED, {"queue": "default", "confirmed": "yes", **data}, follow=True
    )
    assert said in messages_of(response)
    assert r.zrange(FAILED_SET, 0, -1) == [jobs[0].id]


@fuzz(60)
@given(
    action=st.one_of(st.sampled_from(sorted(actions.SELECTION_LABELS)), st.text(max_size=12)),
    job_ids=st.lists(
        st.one_of(
            st.text(max_size=140), st.just(MARK), st.from_regex(r"[a-z0-9]{1,20}", fullmatch=True)
        ),
        max_size=6,
    ),
    confirmed=st.sampled_from(["", "yes", MARK]),
    next_url=st.one_of(st.text(max_size=30), st.just(f"//{MARK}")),
)
def test_hostile_selections_never_error_nor_reach_the_page(
    manager, backend, action, job_ids, confirmed, next_url
):
    response = manager.post(
        SELECTED,
        {
            "action": action,
            "queue": "default",
            "job_id": job_ids,
            "confirmed": confirmed,
            "next": next_url,
        },
    )
    assert response.status_code in (200, 302)
    text = response.content.decode()
    assert MARK not in text
    if response.status_code == 302:
        assert url_has_allowed_host_and_scheme(response["Location"], {"testserver"})
        assert MARK not in messages_of(manager.get(BASE))
