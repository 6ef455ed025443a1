"""Who may ask the agent what: the peer's uid from SO_PEERCRED against the hook it asks for."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from jobstore.node.hooktable import STARTD_HOOKS
from jobstore.node.reports import SERVICE, Caller


@dataclass(frozen=True)
class Peer:
    pid: int
    uid: int
    gid: int


def peer_of(sock: socket.socket) -> Peer:
    """The credentials the kernel recorded for the other end of a unix socket."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def caller(peer: Peer, services: frozenset[int]) -> Caller:
    """The caller as the handlers know it: a service account, or an ordinary account."""
    return SERVICE if peer.uid in services else Caller(peer.uid)


def refusal(hook: str, peer: Peer, services: frozenset[int]) -> str | None:
    """Why `peer` may not run `hook` at all, or None.

    Startd hooks: service accounts only. Starter hooks: anyone; an ordinary account's report is
    applied only to a job it owns (checked by the store in the report's own transaction, for
    spooled reports too), and only with the attempt's token.
    """
    if peer.uid in services or hook not in STARTD_HOOKS:
        return None
    return f"{hook}: uid {peer.uid} is not a condor service account (JOBSTORE_AGENT_STARTD_USERS)"
