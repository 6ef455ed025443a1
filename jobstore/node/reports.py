"""A hook's report about one attempt: built by a handler, kept in the spool, applied by the store.

A report is untrusted input wherever it comes from: a spooled file belongs to the account that
wrote it, which may be a job's user who rewrote it. `Report.parse` accepts only what a genuine
report can carry (the fields below, with their types and bounds); what it may say depends on who
wrote it (`Caller`): a job's user may only send the starter's events about her own jobs, with
usage, pid and exit information, never an owner, a command, a queue, a log path or any other
column the job store decides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jobstore.core.jobs import CHANGE_COLUMNS, INT32, INT64
from jobstore.core.states import HOOK_REPORTS, STARTD_EVENTS, STARTER_EVENTS, Event
from jobstore.errors import BadReport

__all__ = ["STARTD_EVENTS", "STARTER_EVENTS", "BadReport", "Caller", "Report", "check_changes"]

# The job-ad attributes a report may carry into its event (usage and exit information).
REPORT_ATTRS = (
    "JobPid",
    "NumPids",
    "JobStartDate",
    "RemoteSysCpu",
    "RemoteUserCpu",
    "ImageSize",
    "ResidentSetSize",
    "MemoryUsage",
    "JobState",
    "JobDuration",
    "ExitCode",
    "ExitBySignal",
    "ExitSignal",
    "ExitReason",
    "JobCoreDumped",
    "VacateReason",
    "VacateReasonCode",
    "VacateReasonSubCode",
    "HoldReason",
    "HoldReasonCode",
    "HoldReasonSubCode",
)
MAX_TEXT = 1024  # any string in a report: slot, host, token, attribute values
MAX_RECORD = 64 * 1024  # bytes of one spooled report
_KEYWORD = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_STORE = re.compile(r"^[0-9a-f]{16}$")
_FIELDS = frozenset(
    {
        "keyword",
        "job_id",
        "event",
        "token",
        "attempt",
        "changes",
        "attrs",
        "slot",
        "host",
        "time",
        "store",
        "caller_uid",
    }
)


@dataclass(frozen=True)
class Caller:
    """Who a report comes from: a service account (root, condor: may report any event on any
    job), or the uid of an ordinary account (starter events about its own jobs only)."""

    uid: int | None = None  # None: a service account

    @property
    def trusted(self) -> bool:
        return self.uid is None


SERVICE = Caller()


@dataclass(frozen=True)
class Report:
    """One report, checked. `caller_uid` names the ordinary account a service (the agent) took
    it from, so that a report the agent spooled keeps its author."""

    keyword: str
    job_id: int
    event: Event
    token: str = field(repr=False)  # the attempt's secret
    attempt: int | None
    store: str
    time: float
    changes: Mapping[str, Any] = field(default_factory=dict)
    attrs: Mapping[str, Any] = field(default_factory=dict)
    slot: str | None = None
    host: str | None = None
    caller_uid: int | None = None

    def record(self) -> dict[str, Any]:
        """The JSON-able form kept in the spool."""
        out = {
            "keyword": self.keyword,
            "job_id": self.job_id,
            "event": str(self.event),
            "token": self.token,
            "attempt": self.attempt,
            "changes": dict(self.changes),
            "attrs": dict(self.attrs),
            "slot": self.slot,
            "host": self.host,
            "time": self.time,
            "store": self.store,
        }
        if self.caller_uid is not None:
            out["caller_uid"] = self.caller_uid
        return out

    def author(self, writer: Caller) -> Caller:
        """Who the report is from, when `writer` handed it over (or owns its spool file)."""
        if writer.trusted and self.caller_uid is not None:
            return Caller(self.caller_uid)
        return writer

    @classmethod
    def parse(cls, record: object, writer: Caller = SERVICE) -> Report:
        """Check `record` (as read from the spool, or built by a handler); BadReport if it is
        not what a genuine hook of `writer`'s could have written."""
        if not isinstance(record, dict):
            raise BadReport("a report is a JSON object")
        unknown = set(record) - _FIELDS
        if unknown:
            raise BadReport(f"unknown field {sorted(unknown)[0][:64]!r}")
        keyword = _text(record, "keyword", required=True)
        if not _KEYWORD.match(keyword):
            raise BadReport("keyword is not a configuration name")
        try:
            event = Event(_text(record, "event", required=True))
        except ValueError:
            raise BadReport("unknown event") from None
        if event not in HOOK_REPORTS:
            raise BadReport(f"{event} is not a hook's report")
        caller_uid = _int(record, "caller_uid", 0, INT32)
        if caller_uid is not None and not writer.trusted:
            raise BadReport("caller_uid may only be set by a service account")
        report = cls(
            keyword=keyword,
            job_id=_int(record, "job_id", 1, INT64, required=True),
            event=event,
            token=_text(record, "token", required=True),
            attempt=_int(record, "attempt", 0, INT32),
            store=_text(record, "store", required=True),
            time=_number(record, "time", 0, 1e11, required=True),
            changes=check_changes(record.get("changes")),
            attrs=_attrs(record.get("attrs")),
            slot=_text(record, "slot"),
            host=_text(record, "host"),
            caller_uid=caller_uid,
        )
        if not _STORE.match(report.store):
            raise BadReport("store is not a fingerprint")
        if not report.author(writer).trusted and event not in STARTER_EVENTS:
            raise BadReport(f"{event} comes only from the startd's service account")
        return report


def _text(record: Mapping[str, Any], name: str, *, required: bool = False) -> Any:
    value = record.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_TEXT:
        raise BadReport(f"{name} must be a string of 1 to {MAX_TEXT} characters")
    return value


def _int(record: Mapping[str, Any], name: str, low: int, high: int, *,
         required: bool = False) -> Any:
    value = record.get(name)
    if value is None and not required:
        return None
    if type(value) is not int or not low <= value <= high:
        raise BadReport(f"{name} must be an integer from {low} to {high}")
    return value


def _number(record: Mapping[str, Any], name: str, low: float, high: float, *,
            required: bool = False) -> Any:
    value = record.get(name)
    if value is None and not required:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise BadReport(f"{name} must be a number from {low:g} to {high:g}")
    return float(value)


def check_changes(raw: object) -> dict[str, Any]:
    """Job columns and values a report may set; BadReport for anything else."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadReport("changes must be an object")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        spec = CHANGE_COLUMNS.get(name)
        if spec is None:
            raise BadReport(f"a report may not change {str(name)[:64]!r}")
        kind, low, high = spec
        if value is None:
            out[name] = None
            continue
        if kind is bool:
            ok = type(value) is bool
        elif kind is int:
            ok = type(value) is int and low <= value <= high
        else:
            ok = type(value) in (int, float) and math.isfinite(value) and low <= value <= high
        if not ok:
            raise BadReport(f"changes.{name} is not a {kind.__name__} from {low:g} to {high:g}")
        out[name] = float(value) if kind is float else value
    return out


def _attrs(raw: object) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadReport("attrs must be an object")
    out: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in REPORT_ATTRS:
            raise BadReport(f"a report may not carry attribute {str(name)[:64]!r}")
        if isinstance(value, str):
            ok = len(value) <= MAX_TEXT
        elif isinstance(value, bool):
            ok = True
        elif isinstance(value, int):
            ok = -INT64 <= value <= INT64
        elif isinstance(value, float):
            ok = math.isfinite(value)
        else:
            ok = False
        if not ok:
            raise BadReport(f"attrs.{name} is not a bounded string, number or boolean")
        out[name] = value
    return out
