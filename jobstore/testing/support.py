"""Helpers the tests and the benchmarks share: database URLs, local accounts, hook environments
and the job store's identity lines in a recorded hook stdin."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

# The account that owns the recorded jobs of the transcripts (uid 1001 on the recording node).
RECORDED_OWNER = "alice"
RECORDED_UID = 1001


def libpq_url(sqlalchemy_url: str) -> str:
    """A SQLAlchemy URL (``postgresql+psycopg://...``) as a libpq connection URI."""
    url = make_url(sqlalchemy_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def with_database(sqlalchemy_url: str, name: str) -> str:
    """The same server and account, database `name` (password kept)."""
    return make_url(sqlalchemy_url).set(database=name).render_as_string(hide_password=False)


def sqlite_copy(sqlite_url: str, path: Path) -> str:
    """The URL of `path`, a copy of the SQLite store at `sqlite_url` (a migrated template's
    copy: the copy needs no migration), mode 0660 as `jobstore init` leaves a new file; none
    when that store has no file yet."""
    source = make_url(sqlite_url).database or ""
    if os.path.exists(source):
        shutil.copyfile(source, path)
        os.chmod(path, 0o660)
    return f"sqlite:///{path}"


def ensure_account(name: str, *, uid: int | None = None, home: bool = False) -> pwd.struct_passwd:
    """The local account `name`, created (as root) when missing; with `home`, its home
    directory too, also when another test made the account without one."""
    try:
        found = pwd.getpwnam(name)
    except KeyError:
        pass
    else:
        if home and not os.path.isdir(found.pw_dir) and os.geteuid() == 0:
            with contextlib.suppress(FileExistsError):  # another test process made it
                os.makedirs(found.pw_dir, mode=0o755)
                os.chown(found.pw_dir, found.pw_uid, found.pw_gid)
        return found
    if os.geteuid() != 0:
        raise PermissionError(f"the account {name} is missing and only root may create it")
    argv = ["useradd", "--create-home" if home else "--no-create-home"]
    if uid is not None:
        argv += ["--uid", str(uid)]
    else:  # clear of the uids tests give on purpose (RECORDED_UID)
        argv += ["-K", "UID_MIN=2000", "-K", "GID_MIN=2000"]
    made = subprocess.run([*argv, name], capture_output=True, text=True)
    try:
        return pwd.getpwnam(name)  # made now, or by another test process meanwhile
    except KeyError:
        raise RuntimeError(f"useradd {name}: {made.stderr.strip()}") from None


def own_node_dirs(condor_config: Path) -> Path:
    """Give the node of `condor_config` a spool and a sandbox root in a new directory of its
    own (one every account can traverse and none can write, wherever the configuration is),
    so that its agent and hooks share no journal, outbox, cache or report with another
    test's; returns that directory, for the caller to remove."""
    import tempfile

    from jobstore.node import spool

    directory = Path(tempfile.mkdtemp(prefix="jobstore-node-"))
    os.chmod(directory, 0o755)
    with open(condor_config, "a") as fh:
        fh.write(f"JOBSTORE_SPOOL = {directory / 'spool'}\n"
                 f"JOBSTORE_SANDBOX_ROOT = {directory / 'sandboxes'}\n")
    spool.ensure_dir(directory / "spool")
    return directory


def ordinary_owner() -> str:
    """An ordinary account (uid >= 1000) to own jobs: the invoking user, or as root the recorded
    owner (created if missing), since fetch_job never hands out root's or a system account's
    jobs."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid()).pw_name
    return ensure_account(RECORDED_OWNER, uid=RECORDED_UID, home=True).pw_name


def hook_env(
    db_url: str, condor_config: Path, *, spool: Path | None = None, hook_log: Path | None = None,
    **extra: str,
) -> dict[str, str]:
    """A hook's environment as the condor_master gives it (with a session key the hooks must
    never print), plus the job store's database URL, spool and hook log."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/root",
        "CONDOR_CONFIG": str(condor_config),
        # a fetch that finds nothing answers at once (tests of the waiting fetch say otherwise)
        "_CONDOR_JOBSTORE_FETCH_WAIT": "0",
        "_CONDOR_JOBSTORE_AGENT_NUDGE_COMMAND": "false",  # no startd to nudge
        # each report applied as it comes, so that a test sees it at once (tests of the reports
        # an agent keeps back say otherwise)
        "_CONDOR_JOBSTORE_AGENT_REPORT_DELAY": "0",
        "JOBSTORE_DATABASE_URL": db_url,
        "CONDOR_PRIVATE_INHERIT": "SessionKey:secret-session-key-not-for-logs",
        "JOBSTORE_SPOOL": str(spool or condor_config.parent / "spool"),
    }
    if hook_log is not None:
        env["JOBSTORE_HOOK_LOG"] = str(hook_log)
    env.update(extra)
    return env


def insert_identity(stdin: bytes, identity: list[bytes], *, reply_fetch: bool = False) -> bytes:
    """A recorded hook stdin with the job store's identity lines (`JobstoreJobId = 7`, ...) in
    their sorted place in the job ad part (before the `-----` of REPLY_FETCH's stdin); every
    recorded byte is kept."""
    lines = stdin.split(b"\n")
    end = lines.index(b"-----") if reply_fetch else len(lines)
    for new in sorted(identity, key=lambda b: b.lower()):
        name = new.split(b" = ", 1)[0].lower()
        pos = next(
            (i for i in range(end) if lines[i] and lines[i].split(b" = ", 1)[0].lower() > name),
            end,
        )
        lines.insert(pos, new)
        end += 1
    return b"\n".join(lines)


def first(cursor: Any) -> Any:
    """The first column of the one row a psycopg query returned."""
    row = cursor.fetchone()
    if row is None:
        raise RuntimeError("the query returned no row")
    return row[0]
