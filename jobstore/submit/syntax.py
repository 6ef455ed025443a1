"""HTCondor's argument and environment syntax: V1 and V2 (raw) strings, split and joined."""

from __future__ import annotations

from collections.abc import Iterable

from jobstore.errors import InvalidInput

_V2_SPACE = " \t\n\r\v\f"


def split_args_v2(raw: str) -> list[str]:
    """Split a V2 raw argument string (single quotes group, ``''`` is a literal quote)."""
    words: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        if raw[i] in _V2_SPACE:
            i += 1
            continue
        word: list[str] = []
        while i < n and raw[i] not in _V2_SPACE:
            if raw[i] != "'":
                word.append(raw[i])
                i += 1
                continue
            i += 1
            while True:
                if i >= n:
                    raise InvalidInput("unterminated single quote")
                if raw[i] == "'":
                    if raw.startswith("''", i):
                        word.append("'")
                        i += 2
                        continue
                    i += 1
                    break
                word.append(raw[i])
                i += 1
        words.append("".join(word))
    return words


def _quote_word(word: str, force: bool = False) -> str:
    """Quote one word for a V2 raw string if it needs it."""
    if force or not word or "'" in word or any(c in _V2_SPACE for c in word):
        return "'" + word.replace("'", "''") + "'"
    return word


def join_args_v2(words: Iterable[str]) -> str:
    """Join words into a V2 raw string; the result never ends in a backslash."""
    words = list(words)
    quoted = [_quote_word(w) for w in words]
    if words and words[-1].endswith("\\"):
        quoted[-1] = _quote_word(words[-1], force=True)
    return " ".join(quoted)


def _v2_unquote(value: str) -> str:
    """Submit-file ``"..."`` (V2 quoted) value -> V2 raw string."""
    out: list[str] = []
    i, n = 1, len(value)
    while i < n:
        c = value[i]
        if c == '"':
            if value.startswith('""', i):
                out.append('"')
                i += 2
                continue
            if value[i + 1 :].strip():
                raise InvalidInput("unexpected text after the closing double quote")
            return "".join(out)
        out.append(c)
        i += 1
    raise InvalidInput("missing closing double quote")


def _split_v1_wacked(value: str) -> list[str]:
    """Old submit-file argument syntax: whitespace separates, ``\\"`` is a literal quote."""
    words: list[str] = []
    for token in value.split():
        word: list[str] = []
        i = 0
        while i < len(token):
            if token.startswith('\\"', i):
                word.append('"')
                i += 2
            elif token[i] == '"':
                raise InvalidInput(
                    "unescaped double quote in old-syntax arguments "
                    '(write \\" or put the whole value in double quotes)'
                )
            else:
                word.append(token[i])
                i += 1
        words.append("".join(word))
    return words


def args_to_v2(value: str) -> str:
    """Submit ``arguments`` value (new or old syntax) -> V2 raw string."""
    if value.startswith('"'):
        return join_args_v2(split_args_v2(_v2_unquote(value)))
    return join_args_v2(_split_v1_wacked(value))


def env_words_to_v2(entries: Iterable[str]) -> str:
    """Validate ``NAME=value`` entries and join them as a V2 raw environment string."""
    merged: dict[str, str] = {}
    for entry in entries:
        name, eq, val = entry.partition("=")
        if not eq or not name:
            raise InvalidInput(f"entry {entry!r} is not NAME=value")
        if any(c in _V2_SPACE for c in name):
            raise InvalidInput(f"variable name {name!r} contains whitespace")
        merged[name] = val
    return join_args_v2(f"{k}={v}" for k, v in merged.items())


def env_to_v2(value: str) -> str:
    """Submit ``environment`` value (new quoted or old ``;`` syntax) -> V2 raw string."""
    if value.startswith('"'):
        return env_words_to_v2(split_args_v2(_v2_unquote(value)))
    return env_v1_to_v2(value)


def env_v1_to_v2(value: str) -> str:
    """Old ``A=1;B=2`` environment -> V2 raw string."""
    return env_words_to_v2(e.strip() for e in value.split(";") if e.strip())
