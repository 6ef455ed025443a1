"""The wire format between the thin hooks and the agent; standard library only (hot path).

A message is `MAGIC`, a 4-byte big-endian body length, then the body: a sequence of items, each
a 4-byte big-endian length and that many bytes.

* request items:  hook name, environment (NUL-separated `NAME=value`), stdin, then argv[1:]
* response items: status, exit code (ASCII digits), stdout, error line, then log lines

Status `ok`: the agent ran the hook. `busy`: it declined before doing anything (the hook may do
the work itself). `refused`: it will not run this hook for this caller (print the error only).
`hold` (a FETCH_WORK only, before its answer): the agent lets the fetch wait for work; item 1 is
how many more seconds the answer may take (the hook extends its deadline, within
hooktable.FETCH_HOLD_LIMIT of its start), and the answer follows on the same connection.
"""

from __future__ import annotations

from jobstore.errors import ProtocolError
from jobstore.node.hookproc import MAX_STDIN

MAGIC = b"JSA1"
HEADER = 8  # MAGIC + body length
MAX_SMALL = 64 * 1024  # any item but stdin and stdout
MAX_ITEMS = 40
MAX_REQUEST = MAX_STDIN + 256 * 1024
MAX_RESPONSE = 16 * 1024 * 1024
# The only environment variables a hook passes to the agent (the handlers' `request.env`).
PASSED_ENV = ("_CONDOR_SLOT",)
OK, BUSY, REFUSED, HOLD = b"ok", b"busy", b"refused", b"hold"


def encode(items: list[bytes]) -> bytes:
    """One message carrying `items`."""
    parts = []
    for item in items:
        parts.append(len(item).to_bytes(4, "big"))
        parts.append(item)
    body = b"".join(parts)
    return MAGIC + len(body).to_bytes(4, "big") + body


def body_length(header: bytes, limit: int) -> int:
    """The body length announced by an 8-byte header; refuses a wrong magic or `limit`."""
    if header[:4] != MAGIC:
        raise ProtocolError("not a jobstore agent message")
    n = int.from_bytes(header[4:8], "big")
    if n > limit:
        raise ProtocolError(f"message of {n} bytes is larger than {limit}")
    return n


def decode_body(body: bytes, *, big_item: int | None = None) -> list[bytes]:
    """The items of a body; every item but index `big_item` is at most MAX_SMALL bytes."""
    items: list[bytes] = []
    pos, end = 0, len(body)
    while pos < end:
        if len(items) >= MAX_ITEMS:
            raise ProtocolError("too many items")
        if pos + 4 > end:
            raise ProtocolError("truncated item length")
        n = int.from_bytes(body[pos : pos + 4], "big")
        pos += 4
        if pos + n > end:
            raise ProtocolError("truncated item")
        if len(items) != big_item and n > MAX_SMALL:
            raise ProtocolError(f"item {len(items)} is larger than {MAX_SMALL} bytes")
        items.append(body[pos : pos + n])
        pos += n
    return items


def encode_env(env: dict[str, str] | dict[bytes, bytes]) -> bytes:
    """The passed environment variables as NUL-separated `NAME=value`."""
    out = []
    for name, value in env.items():
        n = name.encode() if isinstance(name, str) else name
        v = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
        out.append(n + b"=" + v)
    return b"\0".join(out)


def decode_env(blob: bytes) -> dict[str, str]:
    """Only the names in PASSED_ENV are kept, whatever the caller sent."""
    env = {}
    for pair in blob.split(b"\0") if blob else []:
        name, sep, value = pair.partition(b"=")
        key = name.decode("ascii", "replace")
        if sep and key in PASSED_ENV:
            env[key] = value.decode("utf-8", "surrogateescape")
    return env
