"""transfer_output_remaps' text: `name = target; other = target2`, with `\\;`, `\\=` and `\\\\`
for those characters; read on the submit side and by the hooks (standard library only)."""

from __future__ import annotations

from jobstore.errors import RemapError


def parse(text: str) -> list[tuple[str, str]]:
    """The (name, target) pairs of a remap text (outer double quotes allowed)."""
    body = text.strip()
    if len(body) >= 2 and body[0] == body[-1] == '"':
        body = body[1:-1]
    out: list[tuple[str, str]] = []
    for part in _split(body, ";"):
        if not part.strip():
            continue
        pair = _split(part, "=")
        if len(pair) != 2 or not pair[0].strip() or not pair[1].strip():
            raise RemapError(f"{part.strip()!r} is not NAME = TARGET")
        out.append((_unescape(pair[0].strip()), _unescape(pair[1].strip())))
    return out


def landing(name: str, pairs: list[tuple[str, str]] | tuple[tuple[str, str], ...],
            listed: tuple[str, ...] = ()) -> str:
    """Where output `name` (a path in the sandbox) lands, relative to where outputs go: its
    remap; inside a directory that transfer_output_files names (`listed`), under that
    directory's remap or last component, as HTCondor sends a directory whole; else its last
    component."""
    targets = dict(pairs)
    if name in targets:
        return targets[name]
    for entry in sorted(listed, key=len, reverse=True):
        entry = entry.rstrip("/")
        if entry and name.startswith(entry + "/"):
            top = targets.get(entry) or entry.split("/")[-1]
            return f"{top}/{name[len(entry) + 1:]}"
    return name.split("/")[-1]


def render(pairs: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> str:
    """The remap text of `pairs` (what `parse` reads back)."""
    return ";".join(f"{_escaped(a)}={_escaped(b)}" for a, b in pairs)


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace(";", "\\;").replace("=", "\\=")


def _split(text: str, sep: str) -> list[str]:
    parts, current, i = [], [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        if text[i] == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(text[i])
        i += 1
    parts.append("".join(current))
    return parts


def _unescape(text: str) -> str:
    return text.replace("\\;", ";").replace("\\=", "=").replace("\\\\", "\\")
