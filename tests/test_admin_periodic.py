"""The dashboard's periodic jobs page: what it shows, pause / resume / run now (POST,
CSRF, the manage permission), unknown names, and ``queuestats``."""

import json
import re
from datetime import UTC, datetime
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from tests.conftest import clock_at, user
from tests.support.keys import PERIODIC_KEYS
from tests.test_periodic import BERLIN, periodic, state, stepper

pytestmark = pytest.mark.django_db

PAGE = "/admin/django_redisqueue/dashboard/periodic/schedules/"
ACT = "/admin/django_redisqueue/dashboard/periodic/act/"
SCHEDULES = {
    "nightly": {"task": "tests.support.tasks.record", "cron": "0 3 * * *", "args": ["night"]},
    "beat": {"task": "tests.support.tasks.noop", "every": 30, "catch_up": "all"},
}


@pytest.fixture
def backend():
    with periodic(SCHEDULES, "Europe/Berlin") as backend:
        yield backend


def rows(page):
    body = re.search(r'id="drq-schedules".*?<tbody>(.*?)</tbody>', page, re.S)[1]
    return [
        " ".join(unescape(re.sub(r"<[^>]+>", " ", row)).split())
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def registered_at(backend, r, moment: datetime | int) -> None:
    """The schedules registered at ``moment`` (the clock pinned there): the sync stamps
    ``last`` by Redis's own clock, which no patch reaches, so it is set here."""
    stepper(backend)
    at_ms = moment if isinstance(moment, int) else int(moment.timestamp() * 1000)
    for name in SCHEDULES:
        r.hset(state(name), "last", at_ms)


@pytest.mark.parametrize(
    ("now", "said", "next_run"),
    [
        # The instant a CI run failed at: 03:00 in Berlin 35 seconds away.
        (datetime(2026, 11, 29, 2, 59, 25, tzinfo=BERLIN), "in 35 seconds", "2026-11-29 03:00"),
        (datetime(2024, 7, 15, 1, 0, tzinfo=BERLIN), "in 2 hours", "2024-07-15 03:00"),
        (datetime(2024, 7, 15, 3, 0, tzinfo=BERLIN), "in 1 day", "2024-07-16 03:00"),
        # The night the clocks go back: 02:30 the first time round, 03:00 is 90 minutes on.
        (
            datetime(2024, 10, 27, 2, 30, tzinfo=BERLIN),
            "in 1 hour, 30 minutes",
            "2024-10-27 03:00",
        ),
        # The night they go forward: 01:30, then 03:00 half an hour on.
        (datetime(2024, 3, 31, 1, 30, tzinfo=BERLIN), "in 30 minutes", "2024-03-31 03:00"),
    ],
)
def test_the_page_shows_each_schedule(backend, viewer, r, now, said, next_run):
    due = datetime.fromisoformat(next_run).replace(tzinfo=BERLIN)
    with clock_at(now):
        first = rows(viewer.get(PAGE).text)
        assert "not registered yet" in first[0]
        registered_at(backend, r, now)
        page = viewer.get(PAGE).text
    nightly, beat = rows(page)
    assert (
        nightly
        == f"nightly tests.support.tasks.record 0 3 * * * At 03:00 {said} never \u2013 active"
    )
    # The exact time in the title, in Berlin time.
    utc = due.astimezone(UTC)
    assert (
        f'<time datetime="{utc:%Y-%m-%dT%H:%M:%SZ}" title="{due:%Y-%m-%d %H:%M:%S %Z}">in ' in page
    )
    assert beat.startswith("beat tests.support.tasks.noop every 30s every 30 seconds")
    assert "catches up every missed run" in beat
    assert "Pause" not in page  # a viewer has no actions
    assert 'href="/admin/django_redisqueue/dashboard/periodic/schedules/"' in page


def test_pause_resume_and_run_now(backend, manager, r):
    stepper(backend)
    response = manager.post(
        ACT + "pause_schedule/", {"schedule": "nightly", "next": PAGE}, follow=True
    )
    assert "Periodic job nightly paused" in response.text
    assert r.hget(state("nightly"), "paused") == "1"
    assert "paused" in rows(response.text)[0] and "Resume" in response.text
    manager.post(ACT + "resume_schedule/", {"schedule": "nightly"})
    assert r.hget(state("nightly"), "paused") is None
    response = manager.post(
        ACT + "run_schedule/", {"schedule": "nightly", "next": PAGE}, follow=True
    )
    job_id = r.hget(state("nightly"), "last_job")
    assert f"job {job_id} queued to run now" in response.text
    assert r.zrange(PERIODIC_KEYS.queue("default"), 0, -1) == [job_id]
    assert "READY" in rows(response.text)[0]
    assert f'href="/admin/django_redisqueue/dashboard/periodic/job/{job_id}/"' in response.text


def test_actions_need_the_manage_permission_post_and_csrf(backend, viewer, r):
    stepper(backend)
    assert viewer.post(ACT + "pause_schedule/", {"schedule": "nightly"}).status_code == 403
    assert Client().post(ACT + "pause_schedule/", {"schedule": "nightly"}).status_code == 302
    manager = user("manager", "view_dashboard", "manage_queues", is_staff=True)
    assert manager.get(ACT + "pause_schedule/?schedule=nightly").status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="manager"))
    assert strict.post(ACT + "run_schedule/", {"schedule": "nightly"}).status_code == 403
    assert r.hget(state("nightly"), "paused") is None
    assert r.zcard(PERIODIC_KEYS.queue("default")) == 0


@pytest.mark.parametrize("name", ["", "nope", "<script>alert(1)</script>", "a/b", "beat\n"])
def test_unknown_names_are_404_and_never_reflected(backend, manager, r, name):
    for action in ("pause_schedule", "resume_schedule", "run_schedule"):
        response = manager.post(ACT + f"{action}/", {"schedule": name})
        assert response.status_code == 404
        assert "<script>" not in response.text
    assert manager.get(PAGE.replace("schedules/", "confirm/run_schedule/")).status_code == 404
    assert not r.keys(PERIODIC_KEYS.periodic + "*")


def test_a_schedule_left_in_redis_shows_escaped(backend, viewer, r):
    stepper(backend)
    r.sadd(PERIODIC_KEYS.periodic, "<script>x</script>")
    r.hset(state("<script>x</script>"), mapping={"spec": '{"task": "<b>t</b>"}', "last": "x"})
    page = viewer.get(PAGE).text
    assert "<script>x" not in page and "&lt;script&gt;x" in page
    assert "no longer in settings" in rows(page)[2]


def test_queuestats_lists_the_schedules(backend, r, capsys):
    with clock_at(datetime(2026, 11, 29, 2, 59, 25, tzinfo=BERLIN)) as now:
        registered_at(backend, r, now)
        call_command("queuestats", "--backend", "periodic")
        out = capsys.readouterr().out
    assert re.search(r"nightly\s+0 3 \* \* \*\s+next 2026-11-29T03:00:00\+01:00 ", out)
    call_command("queuestats", "--backend", "periodic", "--json")
    data = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in data["periodic"]] == ["nightly", "beat"]
    assert data["periodic"][1]["words"] == "every 30 seconds"
