"""The process that evaluates the expressions a job's user wrote, for `node.bounded`: classad2
holds the GIL while it evaluates, so a costly expression (a regexp that backtracks, references
that double at every level) evaluated in the agent would stop all of it. Here it stops only this
process, which the agent kills when it takes too long.

Requests and answers are JSON, each after its length (4 bytes, big-endian), on stdin and stdout.
As root, it gives up its privileges (to nobody) before it reads anything: evaluating needs none.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from classad2 import ClassAd

from jobstore.core import policy
from jobstore.errors import InvalidInput
from jobstore.formats.matching import matches

NOBODY = 65534
MAX_MESSAGE = 16 * 1024 * 1024
READY = b"ready"  # the first thing a worker says, once it can answer


def _action(action: policy.Action | None) -> list[Any] | None:
    return None if action is None else [action.kind, action.reason, action.code, action.subcode]


def answer(request: dict[str, Any]) -> Any:
    """The answer to one request: `match` (job ad, slot ad), `periodic` (policy ad, now) or
    `exit` (the exit's terms, attributes and policy ad)."""
    op = request["op"]
    if op == "match":
        return matches(ClassAd(request["job"]), ClassAd(request["slot"]))
    if op == "periodic":
        return _action(policy.periodic_action(ClassAd(request["ad"]), float(request["now"])))
    if op == "exit":
        terms = policy.ExitTerms(**request["terms"])
        ad = ClassAd(request["ad"]) if request.get("ad") is not None else None
        verdict = policy.exit_verdict(terms, request["attrs"], ad)
        return [verdict.succeeded, verdict.retry, _action(verdict.hold)]
    raise InvalidInput(f"unknown request {op!r}")


def _read(stream: Any, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def main() -> int:
    if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    out.write(READY)
    out.flush()
    while True:
        try:
            size = int.from_bytes(_read(inp, 4), "big")
            if size > MAX_MESSAGE:
                return 2
            request = json.loads(_read(inp, size))
        except EOFError:
            return 0
        try:
            reply: dict[str, Any] = {"ok": answer(request)}
        except Exception as exc:  # an answer the caller turns into its own error
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        data = json.dumps(reply).encode()
        out.write(len(data).to_bytes(4, "big") + data)
        out.flush()


if __name__ == "__main__":
    sys.exit(main())
