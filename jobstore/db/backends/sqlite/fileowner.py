"""Whose a SQLite job store is, as a root process must take it: the file's owner, who may
write any of its rows, unless the file and every directory above it are root's alone."""

from __future__ import annotations

import os
import pwd
import stat

from jobstore.core.accounts import ordinary_uid
from jobstore.errors import DatabaseError


def local_owner(database: str) -> str | None:
    """Backend.local_owner of the SQLite file `database`: None when it is root's and it, its
    directory and every directory above are root's alone (what is checked is what every later
    open finds: the path as written, with no link or `..` on the way); else its owner, an
    ordinary account; DatabaseError for anything else (a path root could be led astray by, a
    root file others could replace, a system account's file)."""
    if not database or database == ":memory:":
        return None  # this process's own
    if database != os.path.realpath(database):
        raise DatabaseError(f"the SQLite job store {database}: give root the file's own path "
                            "(absolute, with no link or `..` on the way)")
    try:
        fd = os.open(database, os.O_PATH | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise DatabaseError(f"the SQLite job store {database}: "
                            f"{exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise DatabaseError(f"the SQLite job store {database} is not a regular file")
    if st.st_uid == 0:
        if _roots_alone(database):
            return None
        raise DatabaseError(f"the SQLite job store {database} is root's, but others may replace "
                            "it or write its directory (where SQLite keeps its journal): keep "
                            "it where only root writes, e.g. /var/lib/jobstore")
    if not ordinary_uid(st.st_uid):
        raise DatabaseError(f"the SQLite job store {database} belongs to a system account "
                            f"(uid {st.st_uid})")
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        raise DatabaseError(f"the SQLite job store {database} belongs to uid {st.st_uid}, "
                            "no account") from None


def _roots_alone(path: str) -> bool:
    """Are `path`, its directory (where SQLite makes its journal) and every directory above
    root's and changed by nobody else? (Above its own directory, a sticky one others may write
    lets nobody but root replace what root made there.)"""
    try:
        for n, at in enumerate(_up(path)):
            st = os.lstat(at)
            shared = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0)
            if st.st_uid != 0 or (shared and (n < 2 or not st.st_mode & stat.S_ISVTX)):
                return False
    except OSError:
        return False
    return True


def _up(path: str) -> list[str]:
    """`path` and each directory above it, to /."""
    out = [path]
    while out[-1] != os.path.dirname(out[-1]):
        out.append(os.path.dirname(out[-1]))
    return out
