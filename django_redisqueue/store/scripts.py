"""The Lua scripts' source: each script of ``lua/`` with the shared files it includes.

A script, or a shared file of ``lua/lib/``, starts with lines such as
``-- include: keys, values``; a script's source is those files, each once and each after
the files it includes (a Lua ``local function`` must be defined before it is used), then
the script. On Redis 7 and later ``library`` makes it a Redis Function (docs/protocol.md,
"The scripts and their shared files").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

from django_redisqueue.store.keys import KeySchema

LUA = resources.files(__package__) / "lua"
LIB = "lib"

# An include line of a file's leading comment block.
_INCLUDE = re.compile(r"--\s*include:(.*)")


class IncludeError(ValueError):
    """A script or shared file includes a file lua/lib/ does not hold, or includes
    itself through others."""


def includes(text: str) -> list[str]:
    """The names a file's ``-- include:`` lines give, in order: those of its leading
    comment block, before its first line of code."""
    names: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("--"):
            break
        found = _INCLUDE.fullmatch(line)
        if found:
            names += [name.strip() for name in found.group(1).split(",") if name.strip()]
    return names


def resolve(name: str, text: str, library: Mapping[str, str]) -> list[str]:
    """The shared files ``text`` (the file ``name``) includes, directly or through
    others: each once, each after the files it includes, else in the order named."""
    order: list[str] = []
    path: list[str] = [name]

    def visit(includer: str, included: list[str]) -> None:
        for lib in included:
            if lib in path:
                cycle = " -> ".join([*path[path.index(lib) :], lib])
                raise IncludeError(f"the includes of {name} go round a cycle: {cycle}")
            if lib in order:
                continue
            if lib not in library:
                raise IncludeError(f"{includer} includes {lib!r}, which lua/lib/ does not hold")
            path.append(lib)
            visit(lib, includes(library[lib]))
            path.pop()
            order.append(lib)

    visit(name, includes(text))
    return order


def _lines(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


def assemble(name: str, text: str, library: Mapping[str, str]) -> str:
    """A script's source: the shared files it includes, then the script; of the shared
    files only the top-level definitions the script uses."""
    parts = [_lines(library[lib]) for lib in resolve(name, text, library)]
    return "".join(_used_statements(parts, text)) + _lines(text)


# keys.lua's statements: the prefix from KEYS[1], then names made from it, one statement
# a line.
KEYS_FILE = "keys"
_PREFIX = "local P = KEYS[1]"
_KEY_NAMES = re.compile(r"local\s+([\w\s,]+?)\s*=\s*(.+)")


# What every library and Function of this app is named by.
FUNCTION_PREFIX = "drq_"


def function_name(name: str, text: str) -> str:
    """The Redis Function of script ``name`` (source ``text``, as assembled): named
    after its source, so that two versions of this app serve one Redis side by side."""
    return f"{FUNCTION_PREFIX}{name}_{hashlib.sha1(text.encode()).hexdigest()[:16]}"


def library(name: str, text: str, library_files: Mapping[str, str]) -> tuple[str, str]:
    """Script ``name`` as a Redis Functions library: its function's name and the
    library's source, whose shared definitions are made once, at load; each call binds
    KEYS, ARGV and, when the prefix changed, the key names. Raises IncludeError for a
    keys.lua statement that is not one line of ``local NAMES = VALUES`` (the key names
    must be bindable per call)."""
    order = resolve(name, text, library_files)
    parts = [_lines(library_files[lib]) for lib in order if lib != KEYS_FILE]
    names, bound = [], []
    if KEYS_FILE in order:
        for line in library_files[KEYS_FILE].splitlines():
            line = line.strip()
            if not line or line.startswith("--") or line == _PREFIX:
                continue
            statement = _KEY_NAMES.fullmatch(line)
            if statement is None:
                raise IncludeError(f"keys.lua: not one line of local NAMES = VALUES: {line!r}")
            names.append(f"local {statement.group(1)}\n")
            bound.append(f"  {statement.group(1)} = {statement.group(2)}\n")
    function = function_name(name.removesuffix(".lua"), assemble(name, text, library_files))
    # The key names no statement uses are bound all the same: a few concatenations,
    # once per prefix.
    return function, "".join(
        [
            f"#!lua name={function}\n",
            "local KEYS, ARGV, P\n",
            *names,
            "local function bind_keys(prefix)\n",
            "  if prefix == P then\n    return\n  end\n",
            "  P = prefix\n",
            *bound,
            "end\n",
            *_used_statements(parts, text),
            "local function run()\n",
            _lines(text),
            "end\n",
            f"redis.register_function('{function}', function(keys, args)\n",
            "  KEYS, ARGV = keys, args\n",
            "  bind_keys(keys[1])\n",
            "  return run()\n",
            "end)\n",
        ]
    )


# A top-level definition of a shared file: a line at the left margin that starts a
# ``local`` statement, and the names it declares.
_DEFINITION = re.compile(r"local\s+(?:function\s+(\w+)|([\w\s,]+?)\s*(?:=|$))")
# What names are not: comments and strings, taken out before names are looked for.
_NOT_CODE = re.compile(
    r"--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]"
    r"|'(?:\\.|[^'\\\n])*'"
    r'|"(?:\\.|[^"\\\n])*"',
    re.DOTALL,
)
_NAME = re.compile(r"[A-Za-z_]\w*")


def _names_used(code: str) -> set[str]:
    return set(_NAME.findall(_NOT_CODE.sub(" ", code)))


def _used_statements(parts: list[str], script: str) -> list[str]:
    """The top-level statements of ``parts`` (shared files, in order) that ``script``
    needs: each ``local`` statement whose names it uses, directly or through the
    statements kept; anything else (a file's leading comments) as it is."""
    statements: list[tuple[set[str], str]] = []  # (names declared, text)
    for part in parts:
        for chunk in re.split(r"(?m)^(?=local\s)", part):
            found = _DEFINITION.match(chunk)
            names = {found.group(1)} if found and found.group(1) else set()
            if found and found.group(2):
                names = {n.strip() for n in found.group(2).split(",")}
            statements.append((names, chunk))
    wanted = _names_used(script)
    kept = [not names for names, _ in statements]
    # Later statements use earlier ones only: one pass from the end finds them all.
    for at in range(len(statements) - 1, -1, -1):
        names, chunk = statements[at]
        if names & wanted:
            kept[at] = True
            wanted |= _names_used(chunk)
    return [chunk for (_, chunk), keep in zip(statements, kept, strict=True) if keep]


def read_library(directory: Traversable = LUA) -> dict[str, str]:
    """The shared files of ``directory/lib``, by name (without ``.lua``); in keys.lua,
    the line ``-- names: made from store/keys.py`` becomes the key names' statements."""
    lib = directory / LIB
    if not lib.is_dir():
        return {}
    return {
        file.name.removesuffix(".lua"): file.read_text().replace(_MADE_HERE, key_statements())
        for file in lib.iterdir()
        if file.name.endswith(".lua")
    }


_MADE_HERE = "-- names: made from store/keys.py\n"


@cache
def key_statements() -> str:
    """keys.lua's names, one ``local NAME = P .. 'rest'`` a line, as KeySchema spells
    each key after the prefix that KEYS[1] holds (with its colon)."""
    schema = KeySchema(prefix="")
    return "".join(
        f"local {name} = P .. '{key.removeprefix(':')}'\n"
        for name, key in schema.fixed_keys.items()
    )


def _texts(directory: Traversable) -> dict[str, str]:
    return {
        file.name.removesuffix(".lua"): file.read_text()
        for file in directory.iterdir()
        if file.name.endswith(".lua") and file.is_file()
    }


def sources(directory: Traversable = LUA) -> dict[str, str]:
    """Every script of ``directory``, by name (without ``.lua``), with its includes."""
    library_files = read_library(directory)
    return {
        name: assemble(name + ".lua", text, library_files)
        for name, text in _texts(directory).items()
    }


@dataclass(frozen=True)
class Script:
    """A script in both of the forms Redis runs: ``source`` for EVAL (SHA ``sha``), and
    the Redis Function ``function`` of the library ``library``."""

    name: str
    source: str
    sha: str
    function: str
    library: str


def load(directory: Traversable = LUA) -> dict[str, Script]:
    """Every script of ``directory``, by name, in both forms."""
    library_files = read_library(directory)
    found = {}
    for name, text in _texts(directory).items():
        source = assemble(name + ".lua", text, library_files)
        function, library_source = library(name + ".lua", text, library_files)
        sha = hashlib.sha1(source.encode()).hexdigest()
        found[name] = Script(name, source, sha, function, library_source)
    return found


@cache
def scripts() -> dict[str, Script]:
    """The scripts of this app (read once a process)."""
    return load()
