"""The Lua scripts' source: each script of ``lua/`` with the shared files it includes.

A script, or a shared file of ``lua/lib/``, starts with lines such as
``-- include: keys, values`` naming the files of ``lua/lib/`` it uses. A script's source
is those files, and the ones they include in turn, each once and each after the files
it includes (a Lua ``local function`` must be defined before it is used), then the
script itself. ``lua/lib/keys.lua`` names the keys and states the rules every script
keeps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from importlib.resources.abc import Traversable

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


def assemble(name: str, text: str, library: Mapping[str, str]) -> str:
    """A script's source: the shared files it includes, then the script; of the shared
    files only the top-level definitions the script uses."""
    parts = [library[lib] for lib in resolve(name, text, library)]
    parts = [part if part.endswith("\n") else part + "\n" for part in parts]
    return "".join(_used_statements(parts, text)) + (text if text.endswith("\n") else text + "\n")


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
    """The shared files of ``directory/lib``, by name (without ``.lua``)."""
    lib = directory / LIB
    if not lib.is_dir():
        return {}
    return {
        file.name.removesuffix(".lua"): file.read_text()
        for file in lib.iterdir()
        if file.name.endswith(".lua")
    }


def sources(directory: Traversable = LUA) -> dict[str, str]:
    """Every script of ``directory``, by name (without ``.lua``), with its includes."""
    library = read_library(directory)
    return {
        file.name.removesuffix(".lua"): assemble(file.name, file.read_text(), library)
        for file in directory.iterdir()
        if file.name.endswith(".lua") and file.is_file()
    }
