"""What the pool's admin sets in the store: condor_userprio's factors and usage, and the rules
on job attributes (IMMUTABLE_JOB_ATTRS, PROTECTED_JOB_ATTRS)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sqlalchemy import delete, insert, select

from jobstore.db.backends import Door
from jobstore.db.schema import job_attr_rules
from jobstore.db.transactions import Transactions
from jobstore.errors import InvalidInput


class AdminSettings:
    """The admin's writes (the door decides who may: condor_userprio's through its checks)."""

    def __init__(self, db: Transactions, door: Door) -> None:
        self.db = db
        self.door = door

    def set_factor(self, name: str, factor: float) -> bool:
        """condor_userprio -setfactor (the admin's); False when the submitter is unknown."""
        if not factor >= 1.0:
            raise InvalidInput("a priority factor must be at least 1")
        with self.db.transaction() as conn:
            return self.door.set_factor(conn, name, factor)

    def reset_usage(self, name: str | None = None, *, now: float | None = None) -> int:
        """condor_userprio -resetusage (one submitter) or -resetall: accumulated usage to 0 and
        real priority to its lowest value (the admin's). Returns the rows reset."""
        with self.db.transaction() as conn:
            return self.door.reset_usage(conn, name, time.time() if now is None else now)

    def set_attr_rules(self, *, immutable: Sequence[str], protected: Sequence[str]) -> None:
        """The admin's rules on job attributes (HTCondor's IMMUTABLE_JOB_ATTRS and
        SECURE_JOB_ATTRS: never submitted nor edited; PROTECTED_JOB_ATTRS: edited by a queue
        super user only), over the job store's own, which stay (as `jobstore init` sets them)."""
        rows = {n.lower(): "protected" for n in protected}
        rows.update({n.lower(): "immutable" for n in immutable})
        with self.db.transaction() as conn:
            conn.execute(delete(job_attr_rules).where(job_attr_rules.c.origin == "config"))
            system = set(conn.execute(select(job_attr_rules.c.name)).scalars())
            new = [{"name": n, "rule": r, "origin": "config"} for n, r in rows.items()
                   if n not in system]
            if new:
                conn.execute(insert(job_attr_rules), new)
