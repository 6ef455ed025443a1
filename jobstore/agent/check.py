"""`jobstore agent --check`: which mode each keyword's hooks are in, and why.

The hooks find the agent where the startd's environment says (STARTD_ENVIRONMENT, which the
condor_master gives the startd, and the startd its starters), else at the socket baked into
them by `install-hooks --agent-socket`, else at the default; they use it when it is served by
an account they trust. This reads the same configuration and hook files, and asks the socket.
"""

from __future__ import annotations

import ast
import re
import socket
import time
from dataclasses import dataclass

from jobstore.agent.client import DEFAULT_AGENT_UIDS, server_uid
from jobstore.node import config, directnote
from jobstore.node.hookproc import DEFAULT_SOCKET

ENVIRONMENT = "STARTD_ENVIRONMENT"
KEYWORD_PARAM = re.compile(r"^(?:SLOT\d+|SLOT_TYPE_\d+_STARTD|STARTD)_JOB_HOOK_KEYWORD$", re.I)
HOOK_CALL = re.compile(r"^main\((.*)\)\s*$", re.M)
MAX_HOOK_FILE = 16384


@dataclass(frozen=True)
class KeywordMode:
    keyword: str
    mode: str  # agent, direct, or none (no FETCH_WORK hook configured)
    line: str


def environment_socket(value: str | None) -> str | None:
    """JOBSTORE_AGENT_SOCKET in an HTCondor environment setting (`"A=1 B=2"` or `A=1;B=2`)."""
    if not value:
        return None
    text = value.strip()
    parts = text[1:-1].split() if text.startswith('"') and text.endswith('"') else text.split(";")
    for part in parts:
        name, sep, found = part.strip().partition("=")
        if sep and name == "JOBSTORE_AGENT_SOCKET":
            return found.strip("'") or None
    return None


def baked(path: str) -> tuple[str | None, tuple[int, ...]]:
    """The socket and trusted uids written into the hook at `path` by install-hooks."""
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_HOOK_FILE).decode("utf-8", "replace")
    except OSError:
        return None, DEFAULT_AGENT_UIDS
    calls = list(HOOK_CALL.finditer(text))
    found = calls[-1] if calls else None
    args: tuple[object, ...] = ()
    try:
        parsed = ast.literal_eval(f"({found.group(1)},)") if found else ()
        args = parsed if isinstance(parsed, tuple) else ()
    except (ValueError, SyntaxError):
        pass
    sock = args[1] if len(args) > 1 and isinstance(args[1], str) else None
    uids = args[2] if len(args) > 2 and isinstance(args[2], tuple) else DEFAULT_AGENT_UIDS
    return sock, tuple(u for u in uids if isinstance(u, int))


def served_by(path: str) -> int | None:
    """The uid that serves the unix socket `path` (None: nothing does)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(2)
        sock.connect(path)
        return server_uid(sock)
    except OSError:
        return None
    finally:
        sock.close()


def keywords() -> list[str]:
    import htcondor2

    found = {config.DEFAULT_KEYWORD}
    for name in htcondor2.param.keys():  # noqa: SIM118 - param is no dict
        if KEYWORD_PARAM.match(name):
            value = config.param(name)
            if value:
                found.add(value.upper())
    return sorted(found)


def keyword_mode(keyword: str, agent_socket: str) -> KeywordMode:
    hook = config.param(f"{keyword}_HOOK_FETCH_WORK")
    if not hook:
        return KeywordMode(keyword, "none", f"{keyword}: no {keyword}_HOOK_FETCH_WORK configured")
    from_env = environment_socket(config.param(ENVIRONMENT))
    in_hook, uids = baked(hook)
    path = from_env or in_hook or DEFAULT_SOCKET
    source = (ENVIRONMENT if from_env else "install-hooks --agent-socket" if in_hook
              else "the hooks' default")
    uid = served_by(path)
    where = f"{keyword}: hooks {hook} look for the agent at {path} ({source})"
    if uid is not None and uid in uids:
        return KeywordMode(keyword, "agent", f"{where}: agent mode (served by uid {uid})")
    why = ("nothing listens there" if uid is None
           else f"served by uid {uid}, which they do not trust")
    hint = ""
    if path != agent_socket:
        hint = (f"; the agent listens at {agent_socket}: set {ENVIRONMENT} as "
                "55-jobstore-agent.conf does, then condor_restart")
    return KeywordMode(keyword, "direct", f"{where}: direct mode, {why}{hint}")


def check() -> tuple[list[str], bool]:
    """Lines to print, and whether every keyword's hooks reach the agent."""
    settings = config.load_agent_settings()
    uid = served_by(settings.socket)
    lines = [f"agent: JOBSTORE_AGENT_SOCKET = {settings.socket}: "
             + (f"served by uid {uid}" if uid is not None else "nothing listens there")]
    modes = [keyword_mode(kw, settings.socket) for kw in keywords()]
    lines += [m.line for m in modes]
    noted = directnote.last(settings.hook_log)
    if noted:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(noted[0]))
        lines.append(f"hooks last fell back to direct mode at {when}: {noted[1]}")
    ok = uid is not None and all(m.mode != "direct" for m in modes) and any(
        m.mode == "agent" for m in modes)
    return lines, ok

