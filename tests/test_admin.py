"""The queue dashboard in the admin: pages, actions, permissions, CSRF, escaping."""

import io
import re
from html import unescape
from html.parser import HTMLParser
from urllib.parse import parse_qs, urlsplit

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client, override_settings

from django_redisqueue.backends.redis import RedisQueueBackend, our_backends
from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.runtime.worker import Worker
from django_redisqueue.store.gateway import now_ms
from tests.conftest import run_worker_here, user
from tests.support import tasks
from tests.support.keys import DEFAULT_KEYS

pytestmark = pytest.mark.django_db

BASE = "/admin/django_redisqueue/dashboard/default/"
PAGES = [
    "/admin/django_redisqueue/dashboard/",
    BASE,
    BASE + "queue/default/",
    BASE + "delayed/default/",
    BASE + "running/",
    BASE + "failed/default/",
    BASE + "job/some-id/",
    BASE + "confirm/empty/?queue=low",
]
ACTIONS = [
    (BASE + "act/pause/", {"queue": "low"}),
    (BASE + "act/retry_failed/", {"queue": "default"}),
    (BASE + "act/empty/", {"queue": "low", "confirmed": "yes"}),
]


@pytest.fixture
def clients():
    return {
        "anonymous": Client(),
        "staff": user("staff", is_staff=True),
        "viewer": user("viewer", "view_dashboard", is_staff=True),
        "manager": user("manager", "view_dashboard", "manage_queues", is_staff=True),
        "superuser": user("root", is_staff=True, is_superuser=True),
    }


@pytest.fixture
def manager(clients):
    return clients["manager"]


def run_worker(backend):
    run_worker_here(backend)


@pytest.mark.parametrize(
    ("who", "page_status", "action_status"),
    [
        ("anonymous", 302, 302),  # to the admin login
        ("staff", 403, 403),
        ("viewer", 200, 403),
        ("manager", 200, 302),  # an action redirects back with a message
        ("superuser", 200, 302),
    ],
)
def test_permission_matrix(clients, who, page_status, action_status):
    client = clients[who]
    for url in PAGES:
        response = client.get(url, follow=url.endswith("dashboard/"))
        expected = page_status
        if page_status == 200 and "/job/" in url:
            expected = 404  # no such job: the page says so
        if who == "viewer" and "/confirm/" in url:
            expected = 403  # confirming is acting
        if who == "anonymous":
            assert "/admin/login/" in response.headers.get(
                "Location", response.request["PATH_INFO"]
            )
        else:
            assert response.status_code == expected, (who, url)
    for url, data in ACTIONS:
        response = client.post(url, data)
        assert response.status_code == action_status, (who, url)
        if who == "anonymous":
            assert response.headers["Location"].startswith("/admin/login/")


def test_an_action_redis_refuses_is_told_not_a_server_error(manager, r, backend):
    job = tasks.noop.using(delay=3600).enqueue()
    r.set(backend.keys.delayed("default"), "spoilt")  # written by hand
    r.set(backend.keys.queue("low"), "spoilt")
    for url, data in [
        (BASE + "act/run_now/", {"queue": "default", "job_id": job.id}),
        (BASE + "act/empty/", {"queue": "low", "confirmed": "yes"}),
    ]:
        response = manager.post(url, data, follow=True)
        assert response.status_code == 200, url
        assert "Redis refused it or did not answer" in response.text, url


def test_the_admin_index_links_the_dashboard(clients):
    assert "/admin/django_redisqueue/dashboard/" in clients["viewer"].get("/admin/").text
    assert "/admin/django_redisqueue/dashboard/" not in clients["staff"].get("/admin/").text


def test_actions_refuse_get_and_need_csrf(manager):
    assert manager.get(BASE + "act/pause/?queue=low").status_code == 405
    assert manager.post(BASE + "confirm/empty/", {"queue": "low"}).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="manager"))
    assert strict.post(BASE + "act/pause/", {"queue": "low"}).status_code == 403


def test_pages_and_actions_refuse_to_be_framed_without_the_middleware(manager, settings):
    assert "django.middleware.clickjacking.XFrameOptionsMiddleware" not in settings.MIDDLEWARE
    job_id = tasks.noop.enqueue().id
    responses = {url: manager.get(url) for url in PAGES}
    responses.update({url: manager.post(url, data) for url, data in ACTIONS})
    confirm_selected = {"queue": "default", "action": "cancel", "job_id": [job_id]}
    responses["selected"] = manager.post(BASE + "selected/", confirm_selected)
    assert "Yes, I'm sure" in responses["selected"].text  # a confirm page
    for url, response in responses.items():
        assert response.get("X-Frame-Options") == "DENY", url


def test_overview_counts_match_redis(manager, backend, r):
    for _ in range(3):
        tasks.add.enqueue(1, 1)
    tasks.add.using(queue_name="low").enqueue(1, 1)
    tasks.fail.enqueue("x")
    run_worker(backend)  # 3 ok + 1 failed + 1 ok in low
    for _ in range(2):
        tasks.add.using(queue_name="high").enqueue(1, 1)
    tasks.add.using(delay=300).enqueue(1, 1)

    page = manager.get(BASE).text
    high = row(page, "high")
    assert (high["ready"], high["delayed"], high["failed"]) == ("2", "0", "0")
    default = row(page, "default")
    assert (default["ready"], default["delayed"], default["failed"]) == ("0", "1", "1")
    assert default["finished"] == "4"
    assert row(page, "low")["finished"] == "1"
    assert "5 in all" in page  # the chart's label: jobs finished in the last hour
    assert "No worker is running" in page
    assert "No scheduler is running" in page
    assert r.zcard(DEFAULT_KEYS.queue("high")) == 2


def row(page, queue):
    """The numbers of one queue's row in the overview table."""
    match = re.search(rf'<tr data-queue="{queue}">(.*?)</tr>', page, re.S)
    cells = dict(re.findall(r'class="drq-(\w+)">(?:<a [^>]*>)?(\d+)', match[1]))
    return cells


def test_partial_refresh_returns_only_the_live_part(manager):
    full = manager.get(BASE).text
    partial = manager.get(BASE + "?partial=1").text
    assert 'id="drq-live"' in full and "<html" in full
    assert "<html" not in partial and "drq-queues" in partial


def test_the_pages_list_jobs_in_order_and_escape_arguments(manager, backend):
    first = tasks.record.enqueue("<script>alert(1)</script>")
    urgent = tasks.record.using(priority=50).enqueue("urgent")
    page = manager.get(BASE + "queue/default/").text
    assert page.index(urgent.id[:10]) < page.index(first.id[:10])
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page

    later = tasks.record.using(delay=600).enqueue("later")
    sooner = tasks.record.using(delay=60).enqueue("sooner")
    page = manager.get(BASE + "delayed/default/").text
    assert page.index(sooner.id[:10]) < page.index(later.id[:10])


def test_failed_jobs_show_their_errors_and_can_be_retried_or_deleted(manager, backend, r):
    jobs = [tasks.fail.enqueue(f"<b>boom {i}</b>") for i in range(3)]
    run_worker(backend)
    page = manager.get(BASE + "failed/default/").text
    assert "ValueError: &lt;b&gt;boom 0&lt;/b&gt;" in page

    detail = manager.get(BASE + f"job/{jobs[0].id}/").text
    assert "Error 1 of 1: builtins.ValueError" in detail
    assert "raise ValueError(message)" in detail  # the whole traceback

    response = manager.post(
        BASE + "act/retry_failed/", {"queue": "default", "job_id": jobs[0].id}, follow=True
    )
    assert "1 job(s) of queue default put back on their queue" in response.text
    assert backend.get_result(jobs[0].id).status == TaskResultStatus.READY
    assert jobs[0].id not in manager.get(BASE + "failed/default/").text
    assert r.zrange(DEFAULT_KEYS.queue("default"), 0, -1) == [jobs[0].id]

    not_confirmed = manager.post(BASE + "act/delete_failed/", {"queue": "default"}, follow=True)
    assert "not confirmed, nothing done" in not_confirmed.text
    confirm = manager.get(BASE + f"confirm/delete_failed/?queue=default&job_id={jobs[1].id}")
    assert "Yes, I'm sure" in confirm.text
    assert f"This acts on job <strong>{jobs[1].id}</strong>" in confirm.text
    manager.post(
        BASE + "act/delete_failed/",
        {"queue": "default", "job_id": jobs[1].id, "confirmed": "yes"},
    )
    assert r.exists(DEFAULT_KEYS.job(jobs[1].id)) == 0

    manager.post(BASE + "act/retry_failed/", {"queue": "default"})  # all that are left
    assert backend.get_result(jobs[2].id).status == TaskResultStatus.READY
    run_worker(backend)
    stored = backend.get_result(jobs[2].id)
    assert stored.status == TaskResultStatus.FAILED and stored.attempts == 2
    assert len(stored.errors) == 2  # the history is kept across the retry

    manager.post(BASE + "act/delete_failed/", {"queue": "default", "confirmed": "yes"})
    assert r.zcard(DEFAULT_KEYS.failed("default")) == 0


def test_run_a_delayed_job_now_and_cancel_jobs(manager, backend, r):
    delayed = tasks.add.using(delay=600).enqueue(1, 2)
    manager.post(BASE + "act/run_now/", {"queue": "default", "job_id": delayed.id})
    assert r.zrange(DEFAULT_KEYS.queue("default"), 0, -1) == [delayed.id]
    assert r.zcard(DEFAULT_KEYS.delayed("default")) == 0

    waiting = tasks.add.enqueue(1, 1)
    response = manager.post(
        BASE + "act/cancel/",
        {"queue": "default", "job_id": waiting.id, "confirmed": "yes"},
        follow=True,
    )
    assert f"Job {waiting.id} cancelled" in response.text
    assert backend.get_result(waiting.id).status == TaskResultStatus.FAILED

    run_worker(backend)
    again = manager.post(
        BASE + "act/cancel/",
        {"queue": "default", "job_id": delayed.id, "confirmed": "yes"},
        follow=True,
    )
    assert "was not cancelled" in again.text and "SUCCESSFUL" in again.text


def test_pause_resume_and_empty_a_queue(manager, backend, r):
    job = tasks.add.using(queue_name="low").enqueue(1, 1)
    manager.post(BASE + "act/pause/", {"queue": "low"})
    assert "paused" in manager.get(BASE + "queue/low/").text
    run_worker(backend)
    assert backend.get_result(job.id).status == TaskResultStatus.READY  # skipped

    manager.post(BASE + "act/resume/", {"queue": "low"})
    assert r.llen(DEFAULT_KEYS.wake("low")) == 1  # idle workers look again
    run_worker(backend)
    assert backend.get_result(job.id).status == TaskResultStatus.SUCCESSFUL

    for i in range(5):
        tasks.add.using(queue_name="low").enqueue(i, i)
    response = manager.post(BASE + "act/empty/", {"queue": "low", "confirmed": "yes"}, follow=True)
    assert "5 job(s) of queue low deleted from the queue" in response.text
    assert r.zcard(DEFAULT_KEYS.queue("low")) == 0


def test_running_jobs_and_workers_alive(manager, backend, r):
    job = tasks.add.enqueue(1, 1)
    worker = Worker(backend)
    worker.register()
    backend.broker.claim(["default"], worker.worker_id)
    page = manager.get(BASE + "running/").text
    assert job.id[:10] in page and worker.worker_id in page
    overview = manager.get(BASE).text
    assert worker.worker_id in overview and "tests.support.tasks.add" in overview
    assert "Workers (1)" in overview


def test_job_lookup_and_time_zone(manager, backend):
    job = tasks.add.enqueue(1, 1)
    response = manager.get(BASE + "job/", {"id": job.id})
    assert response.headers["Location"] == BASE + f"job/{job.id}/"
    assert manager.get(BASE + "job/no-such-job/").status_code == 404

    with override_settings(TIME_ZONE="Asia/Tokyo"):
        page = manager.get(BASE + f"job/{job.id}/").text
    tokyo = job.enqueued_at.astimezone(__import__("zoneinfo").ZoneInfo("Asia/Tokyo"))
    assert tokyo.strftime("%Y-%m-%d %H:%M") in page


def test_a_parked_job_shows_its_limit_and_a_unique_job_its_key(manager, backend):
    jobs = [tasks.limited_two.using(limit_key="partner:<7>").enqueue(i, 0) for i in range(3)]
    for worker in ("w1", "w2", "w3"):
        backend.broker.claim(["default"], worker)
    page = unescape(manager.get(BASE + f"job/{jobs[2].id}/").text)
    assert "READY (parked: over its limit" in page
    assert "partner:<7>: at most 2 running" in page  # escaped in the page, as text
    unique = tasks.unique_report.enqueue("<b>")
    page = manager.get(BASE + f"job/{unique.id}/").text
    assert "Unique key" in page and "<b>" not in page


def test_the_overview_and_queuestats_show_the_limits_holding_jobs_back(manager, backend):
    for i in range(4):
        tasks.limited_two.using(limit_key="partner:<7>").enqueue(i, 0)
    for worker in ("w1", "w2", "w3"):
        backend.broker.claim(["default"], worker)
    page = manager.get(BASE).text
    limits = re.search(r'id="drq-limits".*?<tbody>(.*?)</tbody>', page, re.S)[1]
    cells = re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", limits, re.S)
    assert cells[:3] == ["<code>partner:&lt;7&gt;</code>", "2", "2"]
    out = io.StringIO()
    call_command("queuestats", stdout=out)
    assert "limit partner:<7>: 2 running, 2 parked" in out.getvalue()


def test_pages_stay_bounded_with_many_jobs(manager, backend):
    for i in range(120):
        tasks.add.enqueue(i, i)
    page = manager.get(BASE + "queue/default/?page=3").text
    assert "page 3 of 3" in page
    assert page.count('class="drq-args"') == 20
    assert now_ms() > 0


def test_queuestats_prints_the_overview(backend):
    import json as json_module

    from tests.conftest import manage

    tasks.add.enqueue(1, 1)
    tasks.add.using(queue_name="low", delay=60).enqueue(1, 1)
    table = manage("queuestats")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["queue", "ready", "running", "delayed", "failed", "finished"]
    assert lines[2].split() == ["default", "1", "0", "0", "0", "0"]
    assert lines[3].split() == ["low", "0", "0", "1", "0", "0"]
    data = json_module.loads(manage("queuestats", "--json").stdout)
    assert data["queues"]["default"]["ready"] == 1
    assert data["queues"]["low"]["delayed"] == 1


class Attributes(HTMLParser):
    """Every (tag, attribute, value) of a page, values unescaped."""

    def __init__(self, page):
        super().__init__(convert_charrefs=True)
        self.found = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.found += [(tag, name, value or "") for name, value in attrs]

    handle_startendtag = handle_starttag


def next_fields(page):
    """The ``next`` hidden inputs of a page."""
    tags = re.findall(r'<input type="hidden" name="next"[^>]*>', page)
    return [unescape(re.search(r'value="([^"]*)"', tag)[1]) for tag in tags]


def back_link(page):
    return unescape(re.search(r'<a href="([^"]*)" class="button cancel-link"', page)[1])


HOSTILE_NEXT = [
    "javascript:alert(document.cookie)",
    "JavaScript:alert(document.cookie)",
    " javascript:alert(document.cookie)",
    "java\tscript:alert(document.cookie)",
    "java\nscript:alert(document.cookie)",
    "\x01javascript:alert(document.cookie)",
    "data:text/html,<script>alert(document.cookie)</script>",
    "vbscript:alert(document.cookie)",
    "https://evil.example/",
    "http://evil.example",
    "https:evil.example",
    "//evil.example",
    "///evil.example",
    "////evil.example",
    "\\\\evil.example",
    "/\\evil.example",
    "\\/evil.example",
    "/\t/evil.example",
    "https://testserver@evil.example/",
    "http://evil.example\\@testserver/",
]


@pytest.mark.parametrize("hostile", HOSTILE_NEXT)
def test_the_confirm_page_and_actions_never_use_a_hostile_next(manager, hostile):
    confirm = manager.get(BASE + "confirm/empty/", {"queue": "low", "next": hostile})
    assert confirm.status_code == 200
    page = confirm.text
    assert next_fields(page) == [BASE]
    assert back_link(page) == BASE
    for tag, name, value in Attributes(page).found:
        squeezed = re.sub(r"[\x00-\x20\\]", "", value).lower()
        assert "evil.example" not in squeezed, (tag, name, value)
        assert not re.match(r"(java|vb)script:|data:", squeezed), (tag, name, value)
    assert "evil.example" not in page and "alert(" not in page

    for target in (hostile, next_fields(page)[0]):
        response = manager.post(BASE + "act/pause/", {"queue": "low", "next": target})
        assert response.status_code == 302
        assert response.headers["Location"] == BASE


def test_a_next_on_this_site_is_kept_from_the_confirm_page_to_the_redirect(manager):
    here = BASE + "queue/low/?page=2"
    page = manager.get(BASE + "confirm/empty/", {"queue": "low", "next": here}).text
    assert next_fields(page) == [here]
    assert back_link(page) == here
    response = manager.post(
        BASE + "act/empty/", {"queue": "low", "confirmed": "yes", "next": next_fields(page)[0]}
    )
    assert response.headers["Location"] == here
    absolute = "http://testserver" + here  # the same host is this site too
    response = manager.post(BASE + "act/pause/", {"queue": "low", "next": absolute})
    assert response.headers["Location"] == absolute


def test_the_confirm_page_does_not_refresh(manager):
    page = manager.get(BASE + "confirm/empty/?queue=low").text
    assert "Yes, I'm sure" in page
    assert 'id="drq-live"' in page and "data-refresh" not in page
    # It has no live part: asking for one is not found, not a server error.
    assert manager.get(BASE + "confirm/empty/?queue=low&partial=1").status_code == 404


def test_every_other_page_refreshes_its_live_part(manager, backend):
    job = tasks.add.enqueue(1, 1)
    for url in [BASE, *PAGES[2:6], BASE + f"job/{job.id}/"]:
        page = manager.get(url).text
        assert 'data-refresh="5"' in page, url
        partial = manager.get(url, {"partial": 1})
        assert partial.status_code == 200, url
        assert "<html" not in partial.text, url


def test_actions_in_a_refreshed_part_come_back_to_the_whole_page(manager, backend):
    job = tasks.fail.enqueue("x")
    run_worker(backend)
    partial = manager.get(BASE + "failed/default/", {"page": 1, "partial": 1}).text
    assert job.id[:10] in partial
    assert next_fields(partial) == [BASE + "failed/default/?page=1"]  # the Retry button
    confirm = re.search(r'href="([^"]*/confirm/delete_failed/[^"]*)"', partial)[1]
    query = parse_qs(urlsplit(unescape(confirm)).query)
    assert query["next"] == [BASE + "failed/default/?page=1"]
    assert query["job_id"] == [job.id]


def test_request_values_are_escaped_wherever_they_are_shown(manager):
    nasty = "\"'><svg onload=alert(1)>&"
    escaped = "&quot;&#x27;&gt;&lt;svg onload=alert(1)&gt;&amp;"
    page = manager.get(BASE + "confirm/cancel/", {"queue": "default", "job_id": nasty}).text
    assert "<svg onload" not in page
    assert f'<input type="hidden" name="job_id" value="{escaped}">' in page
    job = manager.get(BASE + "job/" + nasty.replace("&", "%26") + "/")
    assert job.status_code == 404
    assert "<svg onload" not in job.text and escaped in job.text
    assert manager.get(BASE + "queue/" + nasty.replace("&", "%26") + "/").status_code == 404
    assert manager.get(BASE + "queue/default/", {"page": nasty}).status_code == 200


@pytest.mark.parametrize(
    "job_id", ["abc?next=//evil.example", "abc#x", "..", ".", "a b", "%2F", "//evil.example"]
)
def test_the_job_lookup_only_redirects_to_a_job_page(manager, job_id):
    response = manager.get(BASE + "job/", {"id": job_id})
    location = response.headers["Location"]
    if "/" in job_id:
        assert location == BASE  # refused, with a message
        return
    assert location.startswith(BASE + "job/") and location.endswith("/")
    followed = manager.get(location)
    assert followed.status_code == 404  # no such job, but its page: the lookup round-trips
    assert followed.request["PATH_INFO"].startswith(BASE + "job/")


def test_delayed_jobs_are_listed_per_queue(manager):
    later = tasks.add.using(queue_name="low", delay=600).enqueue(1, 2)
    response = manager.get(BASE + "delayed/")
    assert response.status_code == 302 and response["Location"].endswith("/delayed/low/")
    assert later.id[:10] in manager.get(BASE + "delayed/low/").text
    assert "0 delayed jobs in default" in manager.get(BASE + "delayed/default/").text
    assert manager.get(BASE + "delayed/nope/").status_code == 404


class RenamedBackend(RedisQueueBackend):
    """This app's backend under another class name, as a project may subclass it."""


def test_a_subclass_of_the_backend_is_served_by_the_dashboard_and_the_checks(clients):
    renamed = {
        **settings.TASKS["default"],
        "BACKEND": f"{__name__}.RenamedBackend",
        "QUEUES": ["default"],
    }
    with override_settings(TASKS={**settings.TASKS, "renamed": renamed}):
        assert "renamed" in dict(our_backends())
        viewer = clients["viewer"]
        assert viewer.get("/admin/django_redisqueue/dashboard/renamed/").status_code == 200
        overview = viewer.get("/admin/django_redisqueue/dashboard/", follow=True)
        assert "/dashboard/renamed/" in overview.content.decode()
