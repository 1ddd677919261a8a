"""The dashboard's fan-out pages: groups, a group (and cancelling it), broadcasts, and
what a job page says of its group and of the job it runs after."""

import re
from html import unescape

import pytest
from django.contrib.auth.models import User
from django.test import Client

from django_redisqueue import broadcast, chain, group
from django_redisqueue.compat import TaskResultStatus
from django_redisqueue.store.gateway import now_ms
from tests.conftest import clock_at, run_worker_here, user
from tests.support import tasks
from tests.support.entries import as_hash
from tests.test_admin import BASE

pytestmark = pytest.mark.django_db

HOSTILE = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def rows(page, table):
    """The text of each body row of the table with id ``table``, tags dropped."""
    body = re.search(rf'id="{table}".*?<tbody>(.*?)</tbody>', page, re.S)[1]
    return [
        " ".join(unescape(re.sub(r"<[^>]+>", " ", row)).split())
        for row in re.findall(r"<tr>(.*?)</tr>", body, re.S)
    ]


def test_the_fanout_pages_need_the_view_permission(viewer):
    result = group([tasks.add.job(1, 1)]).enqueue()
    pages = [BASE + "groups/", BASE + f"group/{result.id}/", BASE + "broadcasts/"]
    staff = user("staff", is_staff=True)
    for url in pages:
        assert viewer.get(url).status_code == 200, url
        assert staff.get(url).status_code == 403, url
        assert Client().get(url).headers["Location"].startswith("/admin/login/"), url
    confirm = BASE + f"confirm/cancel_group/?group_id={result.id}"
    assert viewer.get(confirm).status_code == 403
    act = BASE + "act/cancel_group/"
    assert viewer.post(act, {"group_id": result.id, "confirmed": "yes"}).status_code == 403
    assert tasks.add.get_result(result.member_ids[0]).status == TaskResultStatus.READY


def test_the_overview_links_the_groups_and_broadcasts_pages(viewer):
    page = viewer.get(BASE).text
    assert f'href="{BASE}groups/"' in page and f'href="{BASE}broadcasts/"' in page


def test_the_fanout_pages_refresh_their_live_part(viewer):
    result = group([tasks.add.job(1, 1)]).enqueue()
    for url in [BASE + "groups/", BASE + f"group/{result.id}/", BASE + "broadcasts/"]:
        assert 'data-refresh="5"' in viewer.get(url).text, url
        partial = viewer.get(url, {"partial": 1})
        assert partial.status_code == 200 and "<html" not in partial.text, url


def test_the_groups_page_lists_the_latest_first_with_progress_and_callback(viewer, backend):
    done = group(
        [tasks.add.job(1, 1), tasks.fail.job("x")], callback=tasks.collect.job("cb")
    ).enqueue()
    run_worker_here(backend)
    pending = group([tasks.add.job(2, 2)]).enqueue()

    listed = rows(viewer.get(BASE + "groups/").text, "drq-groups")
    assert [pending.id[:13] in listed[0], done.id[:13] in listed[1]] == [True, True]
    assert listed[0].endswith("0 of 1 0 in progress none")
    assert "2 of 2 1 finished" in listed[1]
    assert done.callback_id[:13] in listed[1] and listed[1].endswith("SUCCESSFUL")


def test_the_groups_page_shows_fifty_groups_a_page(viewer):
    for _ in range(51):
        group([tasks.noop.job()]).enqueue()
    first = viewer.get(BASE + "groups/").text
    assert len(rows(first, "drq-groups")) == 50 and "page 1 of 2" in first
    assert len(rows(viewer.get(BASE + "groups/?page=2").text, "drq-groups")) == 1


def test_the_group_page_counts_members_by_status_and_pages_them(viewer, backend):
    result = group(
        [tasks.add.job(i, i) for i in range(59)] + [tasks.fail.job("x")],
        callback=tasks.collect.job("cb"),
    ).enqueue()
    backend.broker.claim(["default"], "worker-1")  # the first member: RUNNING
    url = BASE + f"group/{result.id}/"

    page = viewer.get(url).text
    assert "0 of 60 members, 0 failed" in unescape(re.sub(r"<[^>]+>", "", page))
    assert rows(page, "drq-member-statuses") == ["READY 59", "RUNNING 1"]
    assert f'href="{BASE}job/{result.callback_id}/"' in page
    assert "tests.support.tasks.collect, READY (waiting)" in page
    members = rows(page, "drq-jobs")
    assert len(members) == 50 and members[0].startswith("1 ")
    assert members[1] == f"2 {result.member_ids[1][:13]}… tests.support.tasks.add READY"
    second = rows(viewer.get(url, {"page": 2}).text, "drq-jobs")
    assert len(second) == 10 and second[-1].startswith(f"60 {result.member_ids[-1][:13]}")
    assert "Cancel the group" not in page  # a viewer may not act


def test_an_unknown_group_is_not_found(manager):
    response = manager.get(BASE + "group/no-such-group/")
    assert response.status_code == 404 and "No group no-such-group" in response.text
    confirm = manager.get(BASE + "confirm/cancel_group/", {"group_id": "no-such-group"})
    assert confirm.status_code == 404
    act = manager.post(
        BASE + "act/cancel_group/", {"group_id": "no-such-group", "confirmed": "yes"}, follow=True
    )
    assert "was not cancelled: it does not exist" in act.text


def test_cancelling_a_group_is_confirmed_then_posted_with_csrf(manager, backend):
    result = group(
        [tasks.add.job(i, i) for i in range(3)], callback=tasks.collect.job("cb")
    ).enqueue()
    url = BASE + f"group/{result.id}/"
    button = re.search(r'href="([^"]*/confirm/cancel_group/[^"]*)"', manager.get(url).text)
    confirm = manager.get(unescape(button[1]))
    assert confirm.status_code == 200 and "Yes, I'm sure" in confirm.text
    assert f'name="group_id" value="{result.id}"' in confirm.text

    act = BASE + "act/cancel_group/"
    data = {"group_id": result.id, "next": url}
    assert manager.get(act, data).status_code == 405
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(User.objects.get(username="manager"))
    assert strict.post(act, {**data, "confirmed": "yes"}).status_code == 403
    unconfirmed = manager.post(act, data, follow=True)
    assert "not confirmed, nothing done" in unconfirmed.text
    assert result.members[0].status == TaskResultStatus.READY

    response = manager.post(act, {**data, "confirmed": "yes"})
    assert response.status_code == 302 and response.headers["Location"] == url
    page = manager.get(url).text
    assert f"Group {result.id} cancelled: 4 job(s) that had not started" in page
    assert [member.status for member in result.members] == [TaskResultStatus.FAILED] * 3
    assert result.callback.status == TaskResultStatus.FAILED
    assert rows(page, "drq-member-statuses") == ["FAILED (cancelled) 3"]
    assert "cancelled" in rows(page, "drq-group")[0] and "Cancel the group" not in page


def test_the_job_page_shows_its_group_what_it_runs_after_and_whether_it_waits(viewer):
    first, second = chain(tasks.add.job(1, 1), tasks.add.job(2, 2)).enqueue()
    page = viewer.get(BASE + f"job/{second.id}/").text
    assert "READY (waiting)" in page
    assert f'job <a href="{BASE}job/{first.id}/">{first.id}</a>, which has not succeeded' in page
    assert "(waiting)" not in viewer.get(BASE + f"job/{first.id}/").text

    result = group([tasks.add.job(1, 1)], callback=tasks.collect.job("cb")).enqueue()
    link = f'<a href="{BASE}group/{result.id}/">{result.id}</a>'
    assert link in viewer.get(BASE + f"job/{result.member_ids[0]}/").text
    callback = viewer.get(BASE + f"job/{result.callback_id}/").text
    assert f"every member of group {link} (its callback), which has not ended yet" in callback


def test_the_broadcasts_page_lists_messages_and_what_each_worker_did(viewer, backend, r):
    broker = backend.broker
    for worker in ("worker-a", "worker-b"):
        broker.heartbeat(worker, {"queues": "default"}, {})  # alive: it reads what comes next
    reload = broadcast(tasks.record.job("reload"))
    only_low = broadcast(tasks.record.job("low"), queue="low")
    broken = broker.broadcast("not json")
    taken = broker.receive("worker-a", ["default"]).messages
    broker.receive("worker-a", ["default"], ran=[(reload, "SUCCESSFUL"), (broken, "FAILED")])
    broker.receive("worker-b", ["default"])
    assert [number for number, _ in taken] == [reload, broken]

    def listed_at(at_ms):
        """The page read with Redis's clock pinned at ``at_ms``."""
        with clock_at(at_ms):
            return rows(viewer.get(BASE + "broadcasts/").text, "drq-broadcasts")

    def ran_at(worker):
        """When ``worker`` stored what it did with the reload message (ms, Redis's)."""
        stored = r.hget(backend.keys.broadcast_message(reload), f"ran:{worker}")
        return int(stored.split()[1])

    listed = listed_at(ran_at("worker-a") + 400)
    assert [row.split()[0] for row in listed] == [str(broken), str(only_low), str(reload)]
    assert "? payload is not valid JSON" in listed[0] and "worker-a: FAILED, just now" in listed[0]
    assert 'tests.support.tasks.record "low" low no worker yet' in listed[1]
    assert (
        'tests.support.tasks.record "reload" every queue worker-a: SUCCESSFUL, just now'
        in listed[2]
    )
    assert "worker-b: RUNNING, just now" in listed_at(ran_at("worker-b") + 400)[2]
    assert "worker-a: FAILED, 2 seconds ago" in listed_at(ran_at("worker-a") + 2_000)[0]


def test_values_read_from_redis_are_escaped_on_the_fanout_pages(manager, backend, r):
    keys = backend.keys
    r.hset(keys.group(HOSTILE), mapping={"size": 1, "total": 1, "created_at": now_ms()})
    r.zadd(keys.groups, {HOSTILE: now_ms()})
    job = tasks.add.enqueue(1, 1)
    r.hset(as_hash(r, keys, job.id), mapping={"group": HOSTILE, "after": "group:" + HOSTILE})
    r.rpush(keys.group_members(HOSTILE), job.id)
    backend.broker.heartbeat(HOSTILE, {"queues": "default"}, {})
    number = backend.broker.broadcast(f'{{"v":1,"task":"{HOSTILE}"}}')
    backend.broker.receive(HOSTILE, ["default"])
    backend.broker.receive(HOSTILE, ["default"], ran=[(number, HOSTILE)])

    pages = [BASE + "groups/", BASE + f"group/{HOSTILE}/", BASE + f"job/{job.id}/"]
    pages.append(BASE + "broadcasts/")
    for url in pages:
        response = manager.get(url)
        assert response.status_code == 200, url
        assert "<script>alert" not in response.text, url
        assert "&lt;script&gt;alert" in response.text, url
    assert f"{ESCAPED}: {ESCAPED}" in manager.get(BASE + "broadcasts/").text  # worker: status
    confirm = manager.get(BASE + "confirm/cancel_group/", {"group_id": HOSTILE}).text
    assert "<script>alert" not in confirm
    assert f'<input type="hidden" name="group_id" value="{ESCAPED}">' in confirm
