"""How the scripts are called (store/calls.py): as Redis Functions where Redis has them,
by EVALSHA where it has not (Redis 6.2, or a user whose ACL refuses Functions); loaded
on first use and again whenever Redis has lost them, in single calls and in pipelines."""

from __future__ import annotations

import pathlib
import shutil

import pytest
import redis

from django_redisqueue.core.jobs import SUCCESSFUL
from django_redisqueue.store import scripts
from django_redisqueue.store.broker import Broker
from django_redisqueue.store.calls import has_no_functions, is_missing, library_name
from django_redisqueue.store.keys import KeySchema
from django_redisqueue.store.wire import NewJob, Outcome
from tests.conftest import not_on_cluster
from tests.support.servers import RedisServer, server_program
from tests.support.topology import NO_FUNCTIONS, WITHOUT_FUNCTIONS

PAYLOAD = '{"v":1,"task":"tests.support.tasks.noop"}'


def script_stats(client: redis.Redis) -> dict[str, int]:
    """Calls of FCALL and EVALSHA that ran (not refused, not answered 'not loaded')."""
    info = client.info("commandstats")
    return {
        command: stats.get("calls", 0) - stats.get("failed_calls", 0)
        for command in ("fcall", "evalsha")
        for stats in [info.get(f"cmdstat_{command}", {})]
    }


def round_trip(broker: Broker, job_id: str) -> None:
    """A job through enqueue, claim and finish: three scripts, each checked by its effect."""
    assert broker.enqueue([NewJob(job_id, "default", 0, PAYLOAD)])[0]
    _, claimed = broker.claim(["default"], "w1")
    assert claimed is not None and claimed.job_id == job_id
    assert broker.finish(Outcome(job_id, claimed.owner, SUCCESSFUL))


@pytest.fixture
def own_server(request):
    """A private redis-server; ``request.param``: the server program's name (see
    ``server_program``) and its extra arguments."""
    program, args = getattr(request, "param", (None, ()))
    server = RedisServer(*args, program=server_program(program))
    server.start()
    yield server
    server.stop()


def broker_of(server: RedisServer) -> tuple[Broker, redis.Redis]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    return Broker(client, KeySchema("{drq:calls}"), lease=30, result_ttl=60), client


@pytest.mark.skipif(WITHOUT_FUNCTIONS, reason="this server has no Functions")
def test_scripts_run_as_functions_loaded_on_first_use_and_again_after_a_flush(own_server):
    broker, client = broker_of(own_server)
    round_trip(broker, "a")
    assert client.function_list(library="drq_enqueue_*")
    client.function_flush()  # a restart, a failover to a server that never had them
    client.script_flush()
    round_trip(broker, "b")
    assert broker.scripts.functions
    assert script_stats(client) == {"fcall": 6, "evalsha": 0}


@pytest.mark.skipif(WITHOUT_FUNCTIONS, reason="this server has no Functions")
def test_a_pipeline_of_calls_loads_what_is_missing_and_runs_each_once(own_server):
    broker, client = broker_of(own_server)
    round_trip(broker, "a")
    client.function_flush()
    calls = [
        ("enqueue", [0, "", 0, *NewJob(f"j{i}", "default", 0, PAYLOAD).as_args()]) for i in "12"
    ]
    replies = broker._run_many(calls)
    assert all(reply[0] for reply in replies)
    assert client.zcard(broker.keys.queue("default")) == 2


# The servers without Functions: a real Redis 6.2, and a Redis 7 from the PATH with
# them renamed away; each answers FCALL in its own words.
WITHOUT = [
    pytest.param(("redis-6.2", ()), id="redis-6.2"),
    pytest.param(("", NO_FUNCTIONS), id="renamed"),
]


@pytest.mark.parametrize("own_server", WITHOUT, indirect=True)
def test_a_redis_without_functions_gets_the_same_scripts_by_evalsha(own_server):
    broker, client = broker_of(own_server)
    round_trip(broker, "a")
    assert not broker.scripts.functions  # learnt from the first call's answer
    client.script_flush()  # NOSCRIPT: loaded again
    round_trip(broker, "b")
    calls = [("enqueue", [0, "", 0, *NewJob("c", "default", 0, PAYLOAD).as_args()])]
    client.script_flush()
    assert broker._run_many(calls)[0][0]
    assert script_stats(client) == {"fcall": 0, "evalsha": 7}
    # A pinned broker (a worker's loop) starts where its backend's broker is.
    assert not broker.pinned().scripts.functions


@pytest.mark.parametrize("own_server", WITHOUT, indirect=True)
def test_a_first_pipeline_to_a_redis_without_functions_runs_every_call(own_server):
    broker, client = broker_of(own_server)
    calls = [
        ("enqueue", [0, "", 0, *NewJob(f"j{i}", "default", 0, PAYLOAD).as_args()]) for i in "123"
    ]
    replies = broker._run_many(calls)  # each FCALL refused, then each sent by EVALSHA
    assert all(reply[0] for reply in replies)
    assert client.zcard(broker.keys.queue("default")) == 3


@not_on_cluster
@pytest.mark.skipif(WITHOUT_FUNCTIONS, reason="this server has no Functions")
def test_a_user_whose_acl_refuses_functions_gets_the_scripts_by_evalsha(own_server):
    admin = redis.Redis.from_url(own_server.url, decode_responses=True)
    admin.acl_setuser(
        "app", enabled=True, nopass=True, keys="*", commands=["+@all", "-fcall", "-function"]
    )
    client = redis.Redis(port=own_server.port, username="app", decode_responses=True)
    broker = Broker(client, KeySchema("{drq:calls}"), lease=30, result_ttl=60)
    round_trip(broker, "a")
    assert not broker.scripts.functions
    assert script_stats(admin)["evalsha"] == 3


def test_the_answers_that_mean_not_run_are_told_apart_from_the_others():
    assert is_missing(redis.exceptions.NoScriptError("No matching script."))
    assert is_missing(redis.ResponseError("Function not found"))
    assert not is_missing(redis.ResponseError("WRONGTYPE Operation against a key"))
    assert has_no_functions(redis.ResponseError("unknown command 'FCALL', with args beginning"))
    assert has_no_functions(redis.ResponseError("unknown command 'FUNCTION', with args"))
    # Redis 6.2's words
    assert has_no_functions(redis.ResponseError("unknown command `FCALL`, with args beginning"))
    assert has_no_functions(redis.ResponseError("unknown command `function`, with args"))
    assert has_no_functions(
        redis.exceptions.NoPermissionError("this user has no permissions to run the 'fcall'")
    )
    assert not has_no_functions(redis.ResponseError("unknown command 'FOO'"))
    assert not has_no_functions(redis.ResponseError("unknown command `FCALLX`"))
    assert not has_no_functions(
        redis.exceptions.NoPermissionError("No permissions to access a key")
    )
    assert not has_no_functions(redis.exceptions.OutOfMemoryError("command not allowed"))


@pytest.mark.pure
def test_a_function_is_named_after_its_source_so_two_versions_live_side_by_side(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "keys.lua").write_text("local P = KEYS[1]\nlocal JOB = P .. 'job:'\n")
    (tmp_path / "s.lua").write_text("-- include: keys\nreturn JOB\n")
    before = scripts.load(tmp_path)["s"]
    (tmp_path / "s.lua").write_text("-- include: keys\nreturn JOB .. '!'\n")
    after = scripts.load(tmp_path)["s"]
    assert before.function != after.function
    assert before.function.startswith("drq_s_") and before.function in before.library


@pytest.mark.pure
def test_a_key_name_that_cannot_be_bound_per_call_is_refused(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "keys.lua").write_text("local P = KEYS[1]\nlocal JOB = P ..\n  'job:'\n")
    (tmp_path / "s.lua").write_text("-- include: keys\nreturn JOB\n")
    with pytest.raises(scripts.IncludeError, match="one line"):
        scripts.load(tmp_path)


@pytest.mark.skipif(WITHOUT_FUNCTIONS, reason="this server has no Functions")
def test_one_library_serves_backends_of_different_prefixes(own_server):
    client = redis.Redis.from_url(own_server.url, decode_responses=True)
    brokers = [
        Broker(client, KeySchema(prefix), lease=30, result_ttl=60)
        for prefix in ("{drq:one}", "{drq:two}", "{drq:one}")
    ]
    for i, broker in enumerate(brokers):  # the prefix changes from call to call
        round_trip(broker, f"job{i}")
    assert client.hget("{drq:one}:job:job2", "status") == SUCCESSFUL
    assert client.hget("{drq:two}:job:job1", "status") == SUCCESSFUL
    assert not client.exists("{drq:two}:job:job0")


def libraries(client: redis.Redis) -> set[str]:
    """The names of this app's Functions libraries on the server."""
    return {library_name(entry) for entry in client.function_list(library="drq_*")}


def an_older_version(tmp_path, broker: Broker) -> Broker:
    """A broker on the same server whose scripts differ from this version's (as a
    process of an earlier release would run): every library named otherwise."""
    lua = tmp_path / "lua"
    shutil.copytree(pathlib.Path(scripts.__file__).parent / "lua", lua)
    for path in lua.glob("*.lua"):
        path.write_text(path.read_text() + "-- an earlier release\n")
    older = Broker(broker.client, broker.keys, lease=30, result_ttl=60)
    older.scripts.scripts = scripts.load(lua)
    return older


@pytest.mark.skipif(WITHOUT_FUNCTIONS, reason="this server has no Functions")
def test_the_libraries_of_other_versions_go_and_a_process_still_using_one_loads_it_again(
    own_server, tmp_path
):
    broker, client = broker_of(own_server)
    older = an_older_version(tmp_path, broker)
    round_trip(older, "a")
    round_trip(broker, "b")
    current = {script.function for script in broker.scripts.scripts.values()}
    theirs = {script.function for script in older.scripts.scripts.values()}
    loaded = libraries(client)
    assert {"drq_enqueue", "drq_claim"} <= {name.rsplit("_", 1)[0] for name in loaded}
    assert loaded & theirs and not current & theirs

    assert set(broker.scripts.prune()) == loaded & theirs
    left = libraries(client)
    assert left == loaded & current
    assert broker.scripts.prune() == []
    round_trip(older, "c")  # its Functions gone: loaded again, one round trip more
    round_trip(broker, "d")


@pytest.mark.parametrize("own_server", WITHOUT, indirect=True)
def test_a_redis_without_functions_has_no_library_to_prune(own_server):
    broker, _ = broker_of(own_server)
    round_trip(broker, "a")
    assert broker.scripts.prune() == []


@pytest.mark.skipif(WITHOUT_FUNCTIONS, reason="this server has no Functions")
def test_the_scheduler_deletes_the_libraries_of_other_versions(r, backend, tmp_path):
    from django_redisqueue.runtime.scheduler import Scheduler
    from tests.support.topology import keys_server

    older = an_older_version(tmp_path, backend.broker)
    round_trip(older, "a")
    theirs = {script.function for script in older.scripts.scripts.values()}
    server = keys_server(r)
    assert libraries(server) & theirs
    Scheduler(backend, burst=True).run()
    assert not libraries(server) & theirs
