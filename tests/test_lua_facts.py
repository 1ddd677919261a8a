"""The facts that the Lua scripts and the Python code must agree on, written on both
sides: the error class paths the scripts store, the queue-name and job-id rules, and the
format of a claim's owner token. Each is checked here against the other side.

Then the scripts as the loader (``store/scripts.py``) assembles them, with the shared
files of ``lua/lib/`` they include: it refuses an include it cannot resolve, and every
script loads in Redis. Read statically (``tests/support/lua_source.py``), each file includes
the shared files it uses and only those; every name it uses is defined before the use;
every shared definition serves a script; and a script's ``-- Keys:`` header lists the
keys it touches."""

import hashlib
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from django_redisqueue import exceptions
from django_redisqueue.core.jobs import JOB_ID_RE, QUEUE_NAME_RE, error_info
from django_redisqueue.dashboard.rows import JobRow
from django_redisqueue.store import scripts
from django_redisqueue.store.scripts import IncludeError
from tests.support import lua_source, tasks
from tests.support.keys import DEFAULT_KEYS
from tests.support.topology import WITHOUT_FUNCTIONS, keys_server

LIBRARY = scripts.read_library()
# Every file as written: the scripts of lua/ by file name, the shared files of lua/lib/
# by their name in an include.
SCRIPTS = {
    file.name: file.read_text() for file in scripts.LUA.iterdir() if file.name.endswith(".lua")
}
FILES = {**SCRIPTS, **LIBRARY}

# Names near the rules' edges: every character class, empty, the longest and one more.
NAMES = st.text(
    alphabet=st.sampled_from("aZ09_.-:/ {}é\x00\n\t*?[]%"), min_size=0, max_size=130
) | st.sampled_from(["", "a" * 64, "a" * 65, "a" * 128, "a" * 129, "é", "a%w"])


@pytest.mark.pure
def test_every_error_class_a_script_stores_is_the_python_class_of_that_path():
    paths = {
        path
        for text in FILES.values()
        for path in re.findall(r"'(django_redisqueue\.[\w.]+)'", text)
    }
    assert paths, "the scripts name no error class"
    for path in paths:
        module, _, name = path.rpartition(".")
        assert module == exceptions.__name__, path
        cls = getattr(exceptions, name)
        assert issubclass(cls, exceptions.RedisQueueError), path
        # The path Python records for the same error, when Python raises it.
        assert error_info(cls("x"))["exception_class_path"] == path


# The fixture's client is only read through: no state carries from one input to the next.
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=NAMES)
def test_the_queue_name_rule_is_the_same_in_lua_and_python(r, name):
    rule = r.register_script(
        scripts.assemble(
            "rule", "-- include: values\nreturn valid_queue(ARGV[1]) and 1 or 0", LIBRARY
        )
    )
    in_lua = rule(keys=DEFAULT_KEYS.script_keys, args=[name]) == 1
    assert in_lua == bool(QUEUE_NAME_RE.fullmatch(name)), repr(name)


# The fixture's client is only read through: no state carries from one input to the next.
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(job_id=NAMES)
def test_the_job_id_rule_is_the_same_in_lua_and_python(r, job_id):
    rule = r.register_script(
        scripts.assemble(
            "rule", "-- include: values\nreturn valid_id(ARGV[1]) and 1 or 0", LIBRARY
        )
    )
    in_lua = rule(keys=DEFAULT_KEYS.script_keys, args=[job_id]) == 1
    assert in_lua == bool(JOB_ID_RE.fullmatch(job_id)), repr(job_id)


# The fixture's client is only read through: no state carries from one input to the next.
@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(-(2**53), 2**53).map(float)
    | st.sampled_from([0.0, 1.0, 1e13, 1e14, 1e15, 2.0**44 * 201 - 1, 2.0**53, 2.0**53 + 2])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([0.5, 1.5, 2.5, -0.5, 1e300, -1e300])
)
def test_a_number_is_written_with_every_digit_as_python_reads_it(r, n):
    # Times in ms, counts and queue scores (up to 201 * 2^44) are whole numbers the
    # scripts write as text for Python to read back: every digit, no exponent; any
    # other number (read from a key written by hand) rounded as C's %.0f rounds it.
    rule = r.register_script(
        scripts.assemble("rule", "-- include: values\nreturn whole(tonumber(ARGV[1]))", LIBRARY)
    )
    written = rule(keys=DEFAULT_KEYS.script_keys, args=[repr(n)])
    # (Negative zero is written 0: the same number to Redis and to Python.)
    assert written == ("0" if n == 0 else f"{n:.0f}")
    if n.is_integer() and abs(n) <= 2**53:
        assert written == str(int(n))


def test_an_owner_token_names_its_worker_as_python_reads_it(r, backend):
    job = tasks.noop.enqueue()
    worker_id = "host.example:4242:0a1b2c"  # as workers make them: host:pid:random
    _, claimed = backend.broker.claim(["default"], worker_id)
    assert claimed is not None and claimed.job_id == job.id
    fields = backend.queries.get_job(job.id)
    assert fields is not None and fields["owner"] == claimed.owner
    row = JobRow.build(job.id, fields, 0.0, backend.config.max_payload_bytes)
    assert row.worker == worker_id


def test_every_script_loads_in_redis(r):
    for name, source in scripts.sources().items():
        assert r.script_load(source) == hashlib.sha1(source.encode()).hexdigest(), name


@pytest.mark.skipif(WITHOUT_FUNCTIONS, reason="this server has no Functions")
def test_every_script_loads_as_a_redis_function(r):
    for name, script in scripts.scripts().items():
        assert script.sha == hashlib.sha1(script.source.encode()).hexdigest(), name
        assert keys_server(r).function_load(script.library, replace=True) == script.function
    listed = keys_server(r).function_list("drq_*")  # per library: [name, value, ...]
    loaded = {dict(zip(lib[::2], lib[1::2], strict=True))["library_name"] for lib in listed}
    assert loaded >= {script.function for script in scripts.scripts().values()}


def _lua_files(directory, files):
    for path, text in files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_text(text)


@pytest.mark.pure
def test_the_loader_puts_each_shared_file_once_after_the_files_it_includes(tmp_path):
    files = {
        "lib/a.lua": "-- include: b, c\nlocal A = B .. C\n",
        "lib/b.lua": "-- A comment first.\n-- include: d\nlocal B = D\n",
        "lib/c.lua": "-- include: d\nlocal C = D\n",
        "lib/d.lua": "local D = 'd'",  # no newline at its end
        "s.lua": "-- include: a, d\nreturn A\n",
        "plain.lua": "return 1\n",
    }
    _lua_files(tmp_path, files)
    assert scripts.sources(tmp_path) == {
        "s": "".join(
            [files["lib/d.lua"] + "\n"] + [files[f"lib/{n}.lua"] for n in "bca"] + [files["s.lua"]]
        ),
        "plain": "return 1\n",
    }


@pytest.mark.pure
def test_the_loader_keeps_of_the_shared_files_only_the_definitions_a_script_uses(tmp_path):
    files = {
        "lib/a.lua": (
            "-- include: b\n-- What a is.\nlocal A = 'a'\n"
            "local function used(x)\n  return helper(x) .. A -- not unused()\nend\n"
            "local function unused()\n  return 'unused()'\nend\n"
        ),
        "lib/b.lua": "local function helper(x)\n  return x\nend\nlocal B, C = 1, 2\n",
        "s.lua": "-- include: a\n-- unused() is not called\nreturn used(C)\n",
    }
    _lua_files(tmp_path, files)
    assert scripts.sources(tmp_path)["s"] == (
        "local function helper(x)\n  return x\nend\nlocal B, C = 1, 2\n"
        "-- include: b\n-- What a is.\nlocal A = 'a'\n"
        "local function used(x)\n  return helper(x) .. A -- not unused()\nend\n" + files["s.lua"]
    )


@pytest.mark.pure
@pytest.mark.parametrize("name", sorted(scripts.sources()))
def test_a_script_as_loaded_defines_every_name_it_uses_and_no_more(name):
    source = scripts.sources()[name]
    reading = lua_source.read([(name, source)], whole=None)
    assert reading.errors == []
    # Each shared function left in is one the script uses, directly or through others
    # (a statement declaring several names stays whole).
    script = (scripts.LUA / f"{name}.lua").read_text()
    whole = lua_source.read_text(name, script, LIBRARY, whole=name)
    shared = {d.name for d in whole.definitions if d.file != name}
    used = {d.name for d in whole.reached(whole.of(name))}
    assert set(re.findall(r"(?m)^local function (\w+)", source)) & shared <= used


@pytest.mark.pure
def test_the_loader_refuses_an_include_it_cannot_resolve(tmp_path):
    _lua_files(tmp_path, {"lib/a.lua": "-- include: nope\n", "s.lua": "-- include: a\n"})
    message = "a includes 'nope', which lua/lib/ does not hold"
    with pytest.raises(IncludeError, match=re.escape(message)):
        scripts.sources(tmp_path)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        ({"lib/a.lua": "-- include: b\n", "lib/b.lua": "-- include: a\n"}, "b -> a -> b"),
        ({"lib/a.lua": "-- include: a\n", "lib/b.lua": ""}, "a -> a"),
    ],
)
def test_the_loader_refuses_includes_that_go_round_a_cycle(tmp_path, files, cycle):
    _lua_files(tmp_path, {**files, "s.lua": "-- include: b, a\n"})
    message = f"the includes of s.lua go round a cycle: {cycle}"
    with pytest.raises(IncludeError, match=re.escape(message)):
        scripts.sources(tmp_path)


# The scripts and the shared files (every check below also looks at the shared files on
# their own: each must include what it uses, whatever a script includes before it).
SCRIPT_NAMES = sorted(SCRIPTS)
LIB_NAMES = sorted(LIBRARY)


@pytest.mark.pure
@pytest.mark.parametrize("name", SCRIPT_NAMES + LIB_NAMES)
def test_every_name_a_file_uses_is_defined_before_the_use(name):
    assert lua_source.read_text(name, FILES[name], LIBRARY, whole=name).errors == []


@pytest.mark.pure
def test_the_reading_finds_a_name_used_before_its_definition_or_out_of_its_block():
    # clock_ms is defined in values.lua, which this script does not include.
    text = "-- include: keys\nreturn {clock_ms(), JOB}"
    errors = lua_source.read_text("bad.lua", text, LIBRARY, whole="bad.lua").errors
    assert len(errors) == 1 and "bad.lua:2: clock_ms is used" in errors[0]
    text = (
        "local function a() return b() end\n"  # b is defined after a
        "local function b() return 1 end\n"
        "for i = 1, 2 do local c = i end\n"
        "return {a(), b(), c, i, undefined_name}"  # c and i are the loop's
    )
    errors = lua_source.read_text("bad.lua", text, {}, whole="bad.lua").errors
    assert [error.split(": ")[1].split()[0] for error in errors] == [
        "b",
        "c",
        "i",
        "undefined_name",
    ]


@pytest.mark.pure
@pytest.mark.parametrize("name", SCRIPT_NAMES + LIB_NAMES)
def test_a_file_includes_exactly_the_shared_files_it_uses(name):
    assert lua_source.include_problems(name, FILES[name], LIBRARY) == []


@pytest.mark.pure
def test_an_include_missing_or_not_used_is_found():
    # clock_ms is in values.lua, which outcome.lua includes: it runs, but hides a use.
    problems = lua_source.include_problems(
        "bad.lua", "-- include: outcome\nreturn clock_ms()", LIBRARY
    )
    assert problems == [
        "bad.lua uses values, which it does not include",
        "bad.lua includes outcome, which it uses nothing of",
    ]


@pytest.mark.pure
def test_keys_lua_names_the_keys_of_the_key_schema_and_is_alone_to_read_the_prefix():
    keys = lua_source.read_text("keys", LIBRARY["keys"], LIBRARY)
    assert {d.name for d in keys.of("keys")} == {"P", *DEFAULT_KEYS.fixed_keys}
    for name in SCRIPT_NAMES + LIB_NAMES:
        reading = lua_source.read_text(name, FILES[name], LIBRARY, whole=name)
        for definition in reading.of(name):
            assert all(used.name != "P" for used in definition.uses), definition
        if name != "keys":
            assert "KEYS" not in {t.text for t in lua_source.tokenize(FILES[name], name)}, name


@pytest.mark.pure
def test_every_shared_definition_is_used_by_a_script():
    used = set()
    for name in SCRIPT_NAMES:
        reading = lua_source.read_text(name, SCRIPTS[name], LIBRARY, whole=name)
        used |= {(d.file, d.name) for d in reading.reached(reading.of(name))}
    defined = {
        (d.file, d.name)
        for lib in LIB_NAMES
        for d in lua_source.read_text(lib, LIBRARY[lib], LIBRARY).of(lib)
    }
    assert defined - used == set()


# Each key name of lib/keys.lua: True for a prefix, completed by an id or a name.
KEY_PREFIXES = {name: key.endswith(":") for name, key in DEFAULT_KEYS.fixed_keys.items()}


@pytest.mark.pure
@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_a_scripts_header_lists_exactly_the_keys_it_touches(name):
    """A script's ``-- Keys:`` header lists every key name of lib/keys.lua that it
    uses, itself or in the shared functions it calls (directly or through others), and
    no other."""
    assert lua_source.key_header_problems(name, SCRIPTS[name], LIBRARY, KEY_PREFIXES) == []


@pytest.mark.pure
def test_a_keys_header_that_is_wrong_is_found():
    def problems(text):
        return lua_source.key_header_problems("bad.lua", text, LIBRARY, KEY_PREFIXES)

    watch = SCRIPTS["watch.lua"]
    assert problems(watch.replace("-- Keys: JOB..id", "-- Keys: JOB..id, RUNNING")) == [
        "bad.lua's Keys header lists RUNNING, which it does not touch"
    ]
    assert problems(watch.replace("-- Keys: JOB..id", "-- Keys: JOB, RUNNING..x, NOPE")) == [
        "bad.lua: its Keys header lists 'JOB': write JOB..<id or name>",
        "bad.lua: its Keys header lists 'RUNNING..x': write RUNNING",
        "bad.lua: 'NOPE' in its Keys header names no key of keys.lua",
        "bad.lua's Keys header lists RUNNING, which it does not touch",
    ]
    # A key reached only through shared functions: record_outcome counts the end in
    # this minute's stats, and lets its unique key go.
    text = "-- include: outcome\n-- Keys: JOB..id, QUEUE..queue\nreturn record_outcome()"
    assert [p for p in problems(text) if "STATS" in p or "UNIQUE" in p] == [
        "bad.lua touches STATS, which its Keys header does not list",
        "bad.lua touches UNIQUE, which its Keys header does not list",
    ]
