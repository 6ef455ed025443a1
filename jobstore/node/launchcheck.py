"""What PREPARE_JOB can see before the starter runs the job: can this account run it at all?

HTCondor's starter reports a missing executable as a plain `evict` (no reason in any ad a hook
is given), so only PREPARE_JOB, which runs as the job's user just before the exec, can find out.
`annotate` adds what it finds to the job ad as JobstoreLaunchError* attributes, which the
handler turns into a hold with HTCondor's HoldReasonCode. Standard library only: it runs in the
hook process (as the job's user), before the call reaches the agent (as root).
"""

from __future__ import annotations

import errno
import os
import stat

ATTR_ERROR = b"JobstoreLaunchError"
ATTR_CODE = b"JobstoreLaunchErrorCode"
ATTR_SUBCODE = b"JobstoreLaunchErrorSubCode"
# HTCondor's HoldReasonCode values (jobstore.core.holds, which the hot path does not import).
FAILED_TO_CREATE_PROCESS = 6
UNABLE_TO_OPEN_INPUT = 8
IWD_ERROR = 14


def annotate(stdin: bytes) -> bytes:
    """The PREPARE_JOB stdin with the first launch problem appended as attributes (unchanged
    when there is none, when one is there already, or when the ad cannot be read well enough
    to tell)."""
    attrs = string_attrs(stdin, (b"cmd", b"iwd", b"in", ATTR_ERROR.lower()))
    if ATTR_ERROR.lower() in attrs:  # found already (the sandbox could not be filled)
        return stdin
    cmd, iwd = attrs.get(b"cmd"), attrs.get(b"iwd")
    if not cmd or not iwd:
        return stdin
    problem = launch_problem(cmd, iwd, attrs.get(b"in"))
    if problem is None:
        return stdin
    reason, code, sub = problem
    text = reason.encode("utf-8", "surrogateescape").replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    extra = (ATTR_ERROR + b' = "' + text + b'"\n' + ATTR_CODE + b" = %d\n" % code
             + ATTR_SUBCODE + b" = %d\n" % sub)
    return stdin.rstrip(b"\n") + b"\n" + extra


def launch_problem(cmd: str, iwd: str, input_path: str | None) -> tuple[str, int, int] | None:
    """(reason, HoldReasonCode, errno) of the first thing that keeps this account from starting
    the job: its initial directory, its executable, its standard input; None if all is well."""
    err = _access(iwd, os.X_OK, directory=True)
    if err:
        return (f"Failed to enter the job's initial directory '{iwd}': (errno={err}: "
                f"'{os.strerror(err)}')", IWD_ERROR, err)
    path = cmd if os.path.isabs(cmd) else os.path.join(iwd, cmd)
    err = _access(path, os.X_OK, directory=False)
    if err:
        return (f"Failed to execute '{path}': (errno={err}: '{os.strerror(err)}')",
                FAILED_TO_CREATE_PROCESS, err)
    if input_path and input_path != "/dev/null":
        path = input_path if os.path.isabs(input_path) else os.path.join(iwd, input_path)
        err = _access(path, os.R_OK, directory=False)
        if err:
            return (f"Failed to open '{path}' as standard input: (errno={err}: "
                    f"'{os.strerror(err)}')", UNABLE_TO_OPEN_INPUT, err)
    return None


def _access(path: str, mode: int, *, directory: bool) -> int:
    """0, or the errno of why this account cannot use `path` as asked."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return exc.errno or errno.ENOENT
    if directory and not stat.S_ISDIR(st.st_mode):
        return errno.ENOTDIR
    if not directory and stat.S_ISDIR(st.st_mode):
        return errno.EISDIR
    if not os.access(path, mode):
        return errno.EACCES
    return 0


def string_attrs(ad: bytes, wanted: tuple[bytes, ...]) -> dict[bytes, str]:
    """The string values of `wanted` (lower-case names) in an old-syntax ClassAd; an attribute
    whose value is not a plain string literal is left out."""
    found: dict[bytes, str] = {}
    for line in ad.split(b"\n"):
        name, sep, value = line.partition(b" = ")
        key = name.strip().lower()
        if not sep or key not in wanted:
            continue
        value = value.strip()
        if len(value) < 2 or value[:1] != b'"' or value[-1:] != b'"':
            continue
        text = _unquote(value[1:-1])
        if text is not None:
            found[key] = text
    return found


def _unquote(body: bytes) -> str | None:
    """A ClassAd string literal's body: `\\"` and `\\\\` unescaped; None if it is not simple."""
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i : i + 1]
        if c == b"\\":
            nxt = body[i + 1 : i + 2]
            if nxt not in (b'"', b"\\"):
                return None
            out += nxt
            i += 2
            continue
        if c == b'"':
            return None
        out += c
        i += 1
    return out.decode("utf-8", "surrogateescape")
