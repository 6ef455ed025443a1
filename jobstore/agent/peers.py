"""Who may ask the agent what: the peer's uid from SO_PEERCRED against the hook it asks for."""

from __future__ import annotations

import pwd
import socket
import struct
from dataclasses import dataclass

from .. import classads, config
from ..errors import DatabaseError, UnknownJob

# Hooks the startd runs, as the condor service account.
STARTD_HOOKS = frozenset({"fetch_job", "reply_fetch", "evict_claim"})
STARTER_HOOKS = frozenset({"prepare_job", "update_job_info", "job_exit"})


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


def service_uids(names: tuple[str, ...]) -> frozenset[int]:
    """The uids of the configured service accounts (unknown names are skipped)."""
    uids = set()
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            if name.isdigit():
                uids.add(int(name))
    return frozenset(uids)


def refusal(hook: str, peer: Peer, stdin: bytes, services: frozenset[int]) -> str | None:
    """Why `peer` may not run `hook` with this input, or None.

    Startd hooks: service accounts only. Starter hooks: a service account, or the account of
    the job's owner (as recorded in the job store, not as claimed by the ad). The attempt
    token is checked by the store either way; when the owner cannot be looked up now (database
    away) the report goes on to be spooled and the token decides later.
    """
    if peer.uid in services:
        return None
    if hook in STARTD_HOOKS:
        return (
            f"{hook}: uid {peer.uid} is not a condor service account"
            " (JOBSTORE_AGENT_STARTD_USERS)"
        )
    if hook not in STARTER_HOOKS:
        return None  # the handler answers "unknown hook"
    try:
        ad = classads.parse_ad(classads.decode(stdin))
    except Exception:
        return None  # the handler reports the bad input
    job_id = classads.get_int(ad, "JobstoreJobId")
    if job_id is None:
        return None  # not a job store job: the handler leaves it alone
    from ..handlers import store_for

    try:
        settings = config.load_settings(
            config.starter_keyword(classads.get_str(ad, "HookKeyword"))
        )
        owner = store_for(settings).get_job(job_id)["owner"]
    except (UnknownJob, DatabaseError, config.ConfigError):
        return None
    try:
        owner_uid = pwd.getpwnam(owner).pw_uid
    except KeyError:
        owner_uid = None
    if owner_uid != peer.uid:
        return f"{hook}: uid {peer.uid} may not report on job {job_id} (not its owner)"
    return None
