"""Whose a SQLite job store is, as a root process must take it: the file's owner, who may
write any of its rows, unless the file and every directory above it are root's alone."""

from __future__ import annotations

import os
import pwd
import stat

from jobstore.errors import DatabaseError


def local_owner(database: str) -> str | None:
    """Backend.local_owner of the SQLite file `database`: None when it and every directory
    above it are root's and nobody else may replace them (no link on the way: what is checked
    is what every later open finds), else its owner's account; DatabaseError when the file
    cannot be looked at, or is root's where others could swap it."""
    if not database or database == ":memory:":
        return None  # in memory: this process's own
    path = os.path.abspath(database)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise DatabaseError(f"the SQLite job store {database}: "
                            f"{exc.strerror or exc}") from None
    if st.st_uid != 0:
        try:
            return pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            raise DatabaseError(f"the SQLite job store {database} belongs to uid {st.st_uid}, "
                                "no account") from None
    if os.path.realpath(path) == path and _roots_alone(path):
        return None
    raise DatabaseError(f"the SQLite job store {database} is root's, but others may replace it "
                        "or a directory on its path (or the path has a link): keep it where "
                        "only root writes, e.g. /var/lib/jobstore")


def _roots_alone(path: str) -> bool:
    """Are `path` and each directory above it root's, changed by nobody else? (A sticky
    directory others may write lets nobody but root replace what root made in it.)"""
    try:
        st = os.lstat(path)
        if st.st_uid != 0 or st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0):
            return False
        parent = os.path.dirname(path)
        while True:
            st = os.lstat(parent)
            shared = st.st_mode & 0o002 or (st.st_mode & 0o020 and st.st_gid != 0)
            if st.st_uid != 0 or (shared and not st.st_mode & stat.S_ISVTX):
                return False
            if parent == os.path.dirname(parent):
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False
