"""A static reading of the Lua scripts, for the tests that hold them to their headers.

``read`` walks a script's source as the loader assembles it (``store/scripts.py``: the
shared files of ``lua/lib/`` it includes, then the script) and resolves every name it
uses to where it is declared, with Lua's scoping: a ``local`` is seen from there to the
end of its block; a function's parameters in its body; a loop's variables in its loop.
It reports each use of a name declared nowhere before it (Redis lets a script read no
global it did not define, and define none), and tells which top-level definition of
``lua/lib/`` each definition uses, and so which keys (the names of ``lib/keys.lua``) a
script reaches.

A shortcut: a ``local`` is seen from its ``=`` on, where Lua sees it from the next
statement. It matters only for ``local x = ... x ...``, which reads the outer ``x``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from django_redisqueue.store import scripts

# Lua's keywords, and what Redis's Lua offers a script: the libraries and functions it
# may call (it may define no global of its own).
# fmt: off
KEYWORDS = frozenset((
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
))
GLOBALS = frozenset((
    "redis", "cjson", "cmsgpack", "bit", "struct", "KEYS", "ARGV", "string", "math",
    "table", "tonumber", "tostring", "type", "pairs", "ipairs", "unpack", "select",
    "pcall", "xpcall", "error", "assert", "next", "rawget", "rawset", "rawequal",
    "setmetatable", "getmetatable", "loadstring",
))
# fmt: on
KEYS_LIB = "keys"

_TOKEN = re.compile(
    r"""(?P<space>\s+)
      | (?P<comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]|--[^\n]*)
      | (?P<long>\[(?P<leq>=*)\[.*?\](?P=leq)\])
      | (?P<string>'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")
      | (?P<number>0[xX][0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<name>[A-Za-z_]\w*)
      | (?P<symbol>\.\.\.|\.\.|==|~=|<=|>=|[-+*/%^#<>=(){}\[\];:,.])""",
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True)
class Token:
    kind: str  # name, keyword, symbol, string or number
    text: str
    file: str
    line: int


def tokenize(text: str, file: str) -> list[Token]:
    """The tokens of a Lua file, comments and spaces left out."""
    tokens, at, line = [], 0, 1
    while at < len(text):
        found = _TOKEN.match(text, at)
        if not found:
            raise ValueError(f"{file}:{line}: cannot read {text[at : at + 20]!r}")
        kind = found.lastgroup  # the outer group: it closes last
        assert kind is not None
        if kind == "name" and found.group() in KEYWORDS:
            kind = "keyword"
        if kind == "long":
            kind = "string"
        if kind not in ("space", "comment"):
            tokens.append(Token(kind, found.group(), file, line))
        line += found.group().count("\n")
        at = found.end()
    return tokens


@dataclass(eq=False)
class Definition:
    """A name a shared file declares at its top level (a function, a constant, a key
    name), or a whole script (``name`` empty); ``uses``: the top-level definitions
    the uses of its statement resolve to (a statement ``local a, b = x, y`` gives
    both ``a`` and ``b`` the uses of ``x`` and ``y``)."""

    file: str
    line: int
    name: str = ""
    uses: set[Definition] = field(default_factory=set)

    def __repr__(self) -> str:
        return f"{self.file}:{self.name or self.line}"


@dataclass
class Reading:
    definitions: list[Definition]
    errors: list[str]  # uses of names not declared before them

    def of(self, file: str) -> list[Definition]:
        return [d for d in self.definitions if d.file == file]

    def reached(
        self, start: Iterable[Definition], *, through_keys: bool = True
    ) -> set[Definition]:
        """The definitions ``start`` uses, directly or through others (``through_keys``
        False: without looking into what key names are built of)."""
        seen: set[Definition] = set()
        todo = list(start)
        while todo:
            for used in todo.pop().uses:
                if used not in seen:
                    seen.add(used)
                    if through_keys or used.file != KEYS_LIB:
                        todo.append(used)
        return seen


def read(parts: list[tuple[str, str]], whole: str | None = None) -> Reading:
    """Read files in order, as one chunk: ``parts`` are (name, text); the one named
    ``whole`` (a script) is one definition, every other file a definition per name
    it declares at its top level."""
    tokens = [token for name, text in parts for token in tokenize(text, name)]
    definitions: list[Definition] = []
    errors: list[str] = []
    # Each scope maps a name to its top-level definition, or to None for a local one.
    scopes: list[dict[str, Definition | None]] = [{}]
    brackets: list[str] = []
    loop_names: list[str] = []
    # The definitions of the top-level statement read: they share its uses.
    statement: list[Definition] = []

    def declare(token: Token) -> None:
        if len(scopes) > 1:
            scopes[-1][token.text] = None
        elif token.file == whole:
            scopes[0][token.text] = statement[0]
        else:
            definition = Definition(token.file, token.line, token.text)
            definitions.append(definition)
            statement.append(definition)
            scopes[0][token.text] = definition

    def function_at(i: int) -> int:
        """Open the body of a function whose parameters start at ``i + 1`` (a
        ``(``); return the index past them."""
        scopes.append({})
        assert tokens[i + 1].text == "(", tokens[i + 1]
        i += 2
        while tokens[i].text != ")":
            if tokens[i].kind == "name":
                scopes[-1][tokens[i].text] = None
            i += 1
        return i + 1

    i = 0
    while i < len(tokens):
        token, before = tokens[i], tokens[i - 1] if i else None
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        if not statement or statement[0].file != token.file:
            # A new file: a script is one definition; a shared file's top-level
            # statements start at their ``local``.
            statement[:] = [Definition(token.file, token.line)]
            if token.file == whole:
                definitions.append(statement[0])
        if token.kind == "keyword":
            word = token.text
            if word == "local":
                if len(scopes) == 1 and token.file != whole:
                    statement.clear()
                if after is not None and after.text == "function":
                    declare(tokens[i + 2])
                    i = function_at(i + 2)
                    continue
                i += 1
                while tokens[i].kind == "name":
                    declare(tokens[i])
                    if tokens[i + 1].text != ",":
                        break
                    i += 2
                i += 1
                continue
            if word == "function":
                if after is not None and after.kind == "name":
                    errors.append(f"{token.file}:{token.line}: defines a global {after.text}")
                    while tokens[i + 1].text != "(":
                        i += 1
                i = function_at(i)
                continue
            if word == "for":
                i += 1
                while tokens[i].text not in ("=", "in"):
                    if tokens[i].kind == "name":
                        loop_names.append(tokens[i].text)
                    i += 1
                continue
            if word in ("do", "then", "repeat"):
                scopes.append({name: None for name in loop_names} if word == "do" else {})
                loop_names = []
            elif word in ("end", "until", "elseif"):
                scopes.pop()
            elif word == "else":
                scopes[-1] = {}
        elif token.kind == "symbol":
            if token.text in "({[":
                brackets.append(token.text)
            elif token.text in ")}]":
                brackets.pop()
        elif token.kind == "name":
            field_name = before is not None and before.text in (".", ":")
            table_key = (
                brackets[-1:] == ["{"]
                and before is not None
                and before.text in ("{", ",", ";")
                and after is not None
                and after.text == "="
            )
            if not (field_name or table_key):
                for scope in reversed(scopes):
                    if token.text in scope:
                        declared = scope[token.text]
                        if declared is not None and declared not in statement:
                            for definition in statement:
                                definition.uses.add(declared)
                        break
                else:
                    if token.text not in GLOBALS:
                        errors.append(
                            f"{token.file}:{token.line}: {token.text} is used, but not "
                            "defined before (a missing include?)"
                        )
        i += 1
    return Reading(definitions, errors)


def read_file(name: str, library: Mapping[str, str] | None = None) -> Reading:
    """Read a script of lua/ (``claim.lua``) or a shared file of lua/lib/ (``limits``)
    with the files it includes, as the loader assembles them."""
    library = scripts.read_library() if library is None else library
    if name in library:
        text, whole = library[name], None
    else:
        text, whole = (scripts.LUA / name).read_text(), name
    return read_text(name, text, library, whole=whole)


def read_text(
    name: str, text: str, library: Mapping[str, str], *, whole: str | None = None
) -> Reading:
    """Read ``text`` (the file ``name``) with the shared files it includes."""
    order = scripts.resolve(name, text, library)
    return read([*((lib, library[lib]) for lib in order), (name, text)], whole)


def header_keys(text: str) -> list[str]:
    """The items of a script's ``-- Keys:`` header (its lines up to the first that
    does not go on with more indented items), in order."""
    lines = text.splitlines()
    for at, line in enumerate(lines):
        if line.startswith("-- Keys:"):
            listed = line.removeprefix("-- Keys:")
            for more in lines[at + 1 :]:
                if not re.match(r"--\s{2,}\S", more):
                    break
                listed += "," + more.removeprefix("--")
            return [item.strip() for item in listed.split(",") if item.strip()]
    return []


def key_header_problems(
    name: str, text: str, library: Mapping[str, str], prefixes: Mapping[str, bool]
) -> list[str]:
    """How the ``-- Keys:`` header of the script ``name`` differs from the keys it
    reaches: the names of lib/keys.lua it uses, itself or through the shared functions
    it calls. ``prefixes`` tells each key name whether it is completed by an id or a
    name (listed then as ``NAME..id``) or a whole key (listed as ``NAME``)."""
    reading = read_text(name, text, library, whole=name)
    script = reading.of(name)
    reached = {
        definition.name
        for definition in reading.reached(script, through_keys=False)
        if definition.file == KEYS_LIB
    }
    used = reached & prefixes.keys()
    problems = list(reading.errors)
    listed: dict[str, list[str]] = {}
    for item in header_keys(text):
        found = re.fullmatch(r"([A-Z_]+)(\.\.\S+)?", item)
        if not found or found.group(1) not in prefixes:
            problems.append(f"{name}: {item!r} in its Keys header names no key of keys.lua")
            continue
        key, suffix = found.groups()
        if bool(suffix) != prefixes[key]:
            shape = f"{key}..<id or name>" if prefixes[key] else key
            problems.append(f"{name}: its Keys header lists {item!r}: write {shape}")
        if item in listed.get(key, []):
            problems.append(f"{name}: its Keys header lists {item!r} twice")
        listed.setdefault(key, []).append(item)
    for key in sorted(used - listed.keys()):
        problems.append(f"{name} touches {key}, which its Keys header does not list")
    for key in sorted(listed.keys() - used):
        problems.append(f"{name}'s Keys header lists {key}, which it does not touch")
    return problems


def include_problems(name: str, text: str, library: Mapping[str, str]) -> list[str]:
    """How the includes of a script or shared file (``name``, not ending in ``.lua``
    when shared) differ from the shared files whose definitions it uses itself: it
    names exactly those (the files they include come with them)."""
    reading = read_text(name, text, library, whole=None if name in library else name)
    used = {
        definition.file
        for own in reading.of(name)
        for definition in own.uses
        if definition.file != name
    }
    named = set(scripts.includes(text))
    return [
        *(f"{name} uses {lib}, which it does not include" for lib in sorted(used - named)),
        *(f"{name} includes {lib}, which it uses nothing of" for lib in sorted(named - used)),
    ]
