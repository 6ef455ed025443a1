"""How jobs and events look to people and scripts: condor_q-like tables, ClassAds, JSON."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from classad2 import ClassAd, ExprTree, Value

from jobstore.core import fairshare
from jobstore.core.fairshare import Usage
from jobstore.core.jobs import Job, JobEvent
from jobstore.core.states import HANDED_OUT
from jobstore.errors import InvalidInput
from jobstore.formats.classads import Expr, sprint_ad
from jobstore.formats.jobads import ATTR_ATTEMPT, ATTR_TOKEN, job_attrs

# HTCondor's JobStatus numbers, so that `-l` output reads like condor_q -l.
JOB_STATUS = {
    "waiting": 1,  # a DAG node not released yet: idle, as condor_q would show it queued
    "idle": 1,
    "fetched": 1,
    "accepted": 2,
    "running": 2,
    "removed": 3,
    "completed": 4,
    "held": 5,
    "failed": 4,
}


# condor_q's ST column, by JobStatus.
STATUS_LETTER = {1: "I", 2: "R", 3: "X", 4: "C", 5: "H", 6: ">", 7: "S"}


def job_id(job: Job) -> str:
    return f"{job.cluster_id}.{job.proc_id}"


def wall_clock(job: Job, now: float | None = None) -> float:
    """RemoteWallClockTime: the seconds all the job's attempts ran, the running one so far."""
    total = job.wall_clock or 0.0
    if job.status == "running" and job.started_at is not None:
        total += max(0.0, (now if now is not None else time.time()) - job.started_at)
    return total


def counters(job: Job, now: float | None = None) -> dict[str, int | None]:
    """HTCondor's counters of a job, the same in `-l`, `--json` and the tables."""
    return {
        "NumJobStarts": job.num_starts or 0,
        "JobStartDate": _int(job.first_started_at),
        "JobCurrentStartDate": _int(job.started_at),
        "CompletionDate": _int(job.finished_at) if job.status == "completed" else None,
        "RemoteWallClockTime": int(wall_clock(job, now)),
    }


def _int(epoch: float | None) -> int | None:
    return None if epoch is None else int(epoch)


def run_time(seconds: float) -> str:
    """condor_q's RUN_TIME: D+HH:MM:SS."""
    s = int(seconds)
    return f"{s // 86400}+{s % 86400 // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def job_json(job: Job) -> dict[str, Any]:
    """The machine-readable form (`jobstore q --json`). Never includes the attempt token."""
    return {
        "id": job_id(job),
        "job_id": job.id,
        "cluster_id": job.cluster_id,
        "proc_id": job.proc_id,
        "status": job.status,
        "owner": job.owner,
        "queue": job.queue,
        "priority": job.priority,
        "attempts": job.attempts,
        "claims": job.claims,
        "exit_code": job.exit_code,
        "exit_signal": job.exit_signal,
        "exit_by_signal": job.exit_by_signal,
        "slot": job.slot,
        "host": job.host,
        "cmd": job.cmd,
        "request_cpus": job.request_cpus,
        "request_memory": job.request_memory,
        "request_disk": job.request_disk,
        "reason": job.reason,
        "hold_code": job.hold_code,
        "hold_subcode": job.hold_subcode,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        **counters(job),
    }


# The attributes of job_ad that come from the job's columns alone, never from its stored ad:
# a projection of these needs no `ad` column (projection in SQL, jobstore.api.query).
COLUMN_ATTRIBUTES = frozenset(n.lower() for n in (
    "Owner", "User", "JobUniverse", "ClusterId", "ProcId", "QDate", "JobPrio", "RequestCpus",
    "RequestMemory", "RequestDisk", "HookKeyword", "JobstoreJobId", "JobstoreQueue",
    "JobStatus", "JobstoreStatus", "JobstoreClaims", "EnteredCurrentStatus", "ExitCode",
    "ExitSignal", "ExitBySignal", "RemoteHost", "JobPid", "RemoteUserCpu", "RemoteSysCpu",
    "ImageSize", "MemoryUsage", "ResidentSetSize", "NumJobStarts", "JobStartDate",
    "JobCurrentStartDate", "CompletionDate", "RemoteWallClockTime",
    "JobCurrentStartExecutingDate", "ShadowBday", "HoldReason", "LastReason", "HoldReasonCode",
    "HoldReasonSubCode", "NumHolds",
))


def job_ad(job: Job, *, keyword: str, uid_domain: str,
           only: frozenset[str] | None = None) -> ClassAd:
    """The job as condor_q shows it (`-l`, `-af`, constraints), without secrets; with `only`
    (lower-case names), just those attributes (a projection).

    Attributes that come from columns always reflect the column (absent when it is NULL), so a
    constraint evaluated in SQL (jobstore.db.constraint) and on this ad give the same answer.
    """
    attrs = job_attrs(
        job, keyword=job.keyword or keyword, uid_domain=uid_domain, job_lease_duration=0,
        strict=False,
    )
    attrs.pop(ATTR_TOKEN, None)
    attrs.pop(ATTR_ATTEMPT, None)
    attrs.pop("JobLeaseDuration", None)
    extra: dict[str, Value | None] = {
        "JobStatus": JOB_STATUS[job.status],
        "JobstoreStatus": job.status,
        "JobstoreClaims": job.claims,
        "EnteredCurrentStatus": int(job.updated_at),
        "ExitCode": job.exit_code,
        "ExitSignal": job.exit_signal,
        "ExitBySignal": job.exit_by_signal,
        "RemoteHost": job.slot,
        "JobPid": job.job_pid,
        "RemoteUserCpu": job.remote_user_cpu,
        "RemoteSysCpu": job.remote_sys_cpu,
        "ImageSize": job.image_size,
        "MemoryUsage": job.memory_usage,
        "ResidentSetSize": job.memory_usage,
        **counters(job),
        "JobCurrentStartExecutingDate": _int(job.started_at),
        "ShadowBday": (None if job.fetched_at is None or job.status not in HANDED_OUT
                       else int(job.fetched_at)),
        "HoldReason" if job.status == "held" else "LastReason": job.reason,
        "HoldReasonCode": job.hold_code if job.status == "held" else None,
        "HoldReasonSubCode": job.hold_subcode if job.status == "held" else None,
        "NumHolds": job.num_holds or 0,
    }
    ad = ClassAd()
    for name, value in attrs.items():
        if only is None or name.lower() in only:
            ad[name] = ExprTree(str(value)) if isinstance(value, Expr) else value
    for name, column in extra.items():
        if only is not None and name.lower() not in only:
            continue
        if column is not None:
            ad[name] = column
        elif name in ad:
            del ad[name]
    return ad


def policy_ad(job: Job, exit_attrs: Mapping[str, Any] | None = None) -> ClassAd:
    """The job ad its policy expressions see (jobstore.core.policy): condor_q's, with the exit
    attributes of a JOB_EXIT when given."""
    ad = job_ad(job, keyword=job.keyword or "JOBSTORE", uid_domain="localdomain")
    for name, value in (exit_attrs or {}).items():
        if name in ("ExitCode", "ExitBySignal", "ExitSignal") and value is not None:
            ad[name] = value
    return ad


def job_long(job: Job, *, keyword: str, uid_domain: str) -> str:
    """`-l`: the job as a ClassAd, sorted like condor_q -l, without secrets."""
    return sprint_ad(job_ad(job, keyword=keyword, uid_domain=uid_domain))


def autoformat(ad: ClassAd, exprs: Sequence[ExprTree]) -> str:
    """One `-af` line: each expression evaluated in the ad, strings bare, undefined as such."""
    return " ".join(_af_value(e.eval(ad)) for e in exprs)


AF_FLAGS = "jhltnr,"


def af_exprs(attrs: Sequence[str]) -> list[ExprTree]:
    """`-af`'s arguments as expressions (ValueError naming one that is not)."""
    if not attrs:
        raise InvalidInput("-af needs at least one attribute name")
    exprs = []
    for a in attrs:
        try:
            exprs.append(ExprTree(a))
        except Exception:  # classad2 raises ClassAdException
            raise InvalidInput(f"-af: not a ClassAd attribute or expression: {a}") from None
    return exprs


def autoformat_lines(ads: Iterable[ClassAd], attrs: Sequence[str], exprs: Sequence[ExprTree],
                     flags: str = "") -> Iterator[str]:
    """condor_q -af:FLAGS: j the job id first, h a header of the names, l each value labelled
    Name=value, t tabs and `,` commas between values, n a line per value, r the expressions
    unevaluated (ValueError for a flag it does not know)."""
    unknown = sorted(set(flags) - set(AF_FLAGS))
    if unknown:
        raise InvalidInput(f"-af:{flags}: unknown option {unknown[0]!r} (known: {AF_FLAGS})")
    sep = "\n" if "n" in flags else "\t" if "t" in flags else ", " if "," in flags else " "
    names = (["ID"] if "j" in flags else []) + list(attrs)
    if "h" in flags:
        yield sep.join(names)
    for ad in ads:
        values = [str(e) if "r" in flags else _af_value(e.eval(ad)) for e in exprs]
        if "j" in flags:
            values.insert(0, f"{ad.get('ClusterId')}.{ad.get('ProcId')}")
        if "l" in flags:
            values = [f"{n} = {v}" for n, v in zip(names, values, strict=True)]
        yield sep.join(values)


def printf(fmt: str, expr: ExprTree, ad: ClassAd) -> str:
    """condor_q -format: `fmt` (one printf conversion: %d %i %s %f %g %e %x %c %v) applied to
    the value of `expr` in `ad`; ValueError for a format it cannot take."""
    try:
        value = expr.eval(ad)
    except Exception:
        value = None
    conv = re.search(r"%[-+ #0]*\d*(?:\.\d+)?([a-zA-Z%])", fmt)
    kind = conv.group(1) if conv else ""
    if kind in ("", "%"):
        return fmt.replace("%%", "%")
    if value is None or isinstance(value, Value):
        value = "undefined"
    try:
        if kind in "dixXoc":
            number = int(value) if not isinstance(value, str) else 0
            return fmt % number
        if kind in "fFeEgG":
            return fmt % (float(value) if not isinstance(value, str) else 0.0)
        if kind == "v":
            fmt = fmt.replace("%v", "%s", 1)
        return fmt % (_af_value(value) if not isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise InvalidInput(f"-format: {fmt!r} cannot format {value!r}") from None


def _af_value(value: Any) -> str:
    if isinstance(value, Value):
        return "undefined" if value == Value.Undefined else "error"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    return str(value).strip()  # lists and nested ads, in ClassAd syntax


def group_jobs(jobs: Iterable[Job], key: Sequence[str]) -> list[dict[str, Any]]:
    """Autoclusters of jobs already fetched, in the form of JobReads.autoclusters (used when a
    constraint could not be done entirely in the database)."""
    groups: dict[tuple[Any, ...], dict[str, int]] = {}
    for job in jobs:
        counts = groups.setdefault(tuple(getattr(job, k) for k in key), {})
        counts[job.status] = counts.get(job.status, 0) + 1
    order = sorted(groups, key=lambda t: tuple((v is not None, v) for v in t))
    found = [dict(zip(key, k, strict=True)) for k in order]
    return [
        {"id": f.get("autocluster_id", n), **f, "jobs": sum(groups[k].values()),
         "status": dict(sorted(groups[k].items()))}
        for n, (f, k) in enumerate(zip(found, order, strict=True), 1)
    ]


# condor_q's summary words for HTCondor's JobStatus numbers
_STATUS_WORDS = {1: "idle", 2: "running", 3: "removed", 4: "completed", 5: "held"}


def autocluster_rows(clusters: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """`q -autocluster`: one row per autocluster (the jobs the claim matches as one).

    `clusters` come from JobReads.autoclusters: counts by our status in `status`; the table
    adds them up by HTCondor JobStatus (fetched counts as idle, accepted as running, ...).
    """
    words = list(_STATUS_WORDS.values())
    header = ["ID", "JOBS", *(w.upper() for w in words)]
    header += ["SUBMITTER", "QUEUE", "CPUS", "MEMORY", "DISK", "LIMITS", "REQUIREMENTS"]
    rows = []
    for c in clusters:
        by_word = dict.fromkeys(words, 0)
        for status, n in c["status"].items():
            by_word[_STATUS_WORDS[JOB_STATUS[status]]] += n
        rows.append(
            [
                str(c["id"]),
                str(c["jobs"]),
                *(str(by_word[w]) for w in words),
                c.get("submitter") or c["owner"],
                c["queue"],
                str(c["request_cpus"]),
                str(c["request_memory"]),
                str(c["request_disk"]),
                c.get("concurrency_limits") or "-",
                _short(c["requirements"] or "", 60),
            ]
        )
    return header, rows


def _when(epoch: float | None) -> str:
    return "" if epoch is None else time.strftime("%m/%d %H:%M", time.localtime(epoch))


def job_rows(jobs: Iterable[Job], *, run: bool = False, finished: bool = False,
             wide: bool = False) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of `jobstore q` as condor_q -nobatch shows them (ID OWNER SUBMITTED
    RUN_TIME ST PRI SIZE CMD); with `run` (condor_q -run) the slot instead of ST PRI SIZE
    CMD; with `finished` (condor_history) COMPLETED instead of PRI SIZE; `wide`: CMD whole."""
    now = time.time()
    if run:
        header = ["ID", "OWNER", "SUBMITTED", "RUN_TIME", "HOST(S)"]
    elif finished:
        header = ["ID", "OWNER", "SUBMITTED", "RUN_TIME", "ST", "COMPLETED", "CMD"]
    else:
        header = ["ID", "OWNER", "SUBMITTED", "RUN_TIME", "ST", "PRI", "SIZE", "CMD"]
    rows = []
    for job in jobs:
        head = [job_id(job), job.owner, _when(job.submitted_at), run_time(wall_clock(job, now))]
        letter = STATUS_LETTER[JOB_STATUS[job.status]]
        if run:
            rows.append([*head, job.slot or ""])
        elif finished:
            rows.append([*head, letter, _when(job.finished_at), _command(job, wide)])
        else:
            size = (job.image_size or 0) / 1024
            rows.append([*head, letter, str(job.priority), f"{size:.1f}",
                         _command(job, wide)])
    return header, rows


BATCH_HEADER = ["OWNER", "BATCH_NAME", "SUBMITTED", "DONE", "RUN", "IDLE", "HOLD", "TOTAL",
                "JOB_IDS"]


def batch_rows(dag_batches: Iterable[Any], jobs: Iterable[Job]) -> list[list[str]]:
    """condor_q's default batch view: a row per DAG (its nodes: DONE and TOTAL; its jobs:
    RUN, IDLE, HOLD) and per cluster of the other jobs (by JobBatchName, else "ID: N")."""
    rows = []
    for dag in dag_batches:
        running = sum(n for s, n in dag.jobs.items() if JOB_STATUS[s] == 2)
        idle = sum(n for s, n in dag.jobs.items() if s in ("idle", "waiting", "fetched"))
        ids = "" if dag.clusters is None else (
            f"{dag.clusters[0]}.0" if dag.clusters[0] == dag.clusters[1]
            else f"{dag.clusters[0]}.0 ... {dag.clusters[1]}.0")
        rows.append([dag.owner, dag.batch_name, _when(dag.submitted),
                     _count(dag.nodes.get("done", 0)), _count(running), _count(idle),
                     _count(dag.jobs.get("held", 0)), str(sum(dag.nodes.values())), ids])
    clusters: dict[int, list[Job]] = {}
    for job in jobs:
        if "DAGNodeName" not in job.ad:
            clusters.setdefault(job.cluster_id, []).append(job)
    for cluster, members in sorted(clusters.items()):
        codes = [JOB_STATUS[j.status] for j in members]
        name = members[0].ad.get("JobBatchName")
        procs = sorted(j.proc_id for j in members)
        ids = f"{cluster}.{procs[0]}" + (f"-{procs[-1]}" if len(procs) > 1 else "")
        rows.append([members[0].owner,
                     str(name) if isinstance(name, str) else f"ID: {cluster}",
                     _when(min(j.submitted_at for j in members)),
                     _count(codes.count(4)), _count(codes.count(2)), _count(codes.count(1)),
                     _count(codes.count(5)), str(len(members)), ids])
    return rows


def dag_job_rows(dag_batches: Iterable[Any], jobs: Iterable[Job]) -> tuple[list[str],
                                                                          list[list[str]]]:
    """condor_q -dag -nobatch: each DAG's line, its nodes' jobs under it as " |-NODE"."""
    header, rows = job_rows([j for j in jobs if "DAGNodeName" not in j.ad])
    by_dag: dict[str, list[Job]] = {}
    for job in jobs:
        if "DAGNodeName" in job.ad:
            by_dag.setdefault(_expr_text(job.ad.get("DAGManJobId")), []).append(job)
    for dag in dag_batches:
        rows.append([f"{dag.dag_id}.0", dag.owner, _when(dag.submitted), "", "R"
                     if dag.status == "running" else "H" if dag.status == "held" else "X",
                     "0", "0.0", f"DAG {dag.batch_name}"])
        _h, node_rows = job_rows(by_dag.get(str(dag.dag_id), []))
        for job, row in zip(by_dag.get(str(dag.dag_id), []), node_rows, strict=True):
            row[1] = " |-" + _expr_text(job.ad.get("DAGNodeName")).strip('"')
            rows.append(row)
    return header, rows


def _expr_text(value: Any) -> str:
    return str(value.get("expr", "")) if isinstance(value, dict) else str(value or "")


def _count(n: int) -> str:
    """condor_q's batch view shows a zero as `_`."""
    return str(n) if n else "_"


def totals_line(jobs: Iterable[Job]) -> str:
    """condor_q's closing line: Total for query: N jobs; N completed, N removed, ..."""
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job.status] = counts.get(job.status, 0) + 1
    return totals_line_of(counts)


def totals_line_of(counts: Mapping[str, int]) -> str:
    """condor_q's closing line from the number of jobs in each of the store's statuses."""
    by = dict.fromkeys((4, 3, 1, 2, 5, 7), 0)
    for status, n in counts.items():
        by[JOB_STATUS[status]] = by.get(JOB_STATUS[status], 0) + n
    return (f"Total for query: {sum(counts.values())} jobs; {by[4]} completed, {by[3]} removed,"
            f" {by[1]} idle, {by[2]} running, {by[5]} held, {by[7]} suspended")


def _command(job: Job, wide: bool = False) -> str:
    """condor_q's CMD: the executable and its arguments (old syntax Args or new Arguments)."""
    ad = job.ad or {}
    args = ad.get("Arguments", ad.get("Args"))
    text = f"{job.cmd} {args}" if isinstance(args, str) and args else job.cmd
    return text if wide else _short(text)


def hold_rows(jobs: Iterable[Job]) -> tuple[list[str], list[list[str]]]:
    """`q -hold`: the held jobs with why, like condor_q -hold (plus HoldReasonCode/SubCode)."""
    header = ["ID", "OWNER", "HELD_SINCE", "CODE", "SUB", "HOLD_REASON"]
    rows = [
        [job_id(job), job.owner, _when(job.updated_at),
         str(job.hold_code if job.hold_code is not None else 0), str(job.hold_subcode or 0),
         job.reason or ""]
        for job in jobs
        if job.status == "held"
    ]
    return header, rows


def event_rows(events: Iterable[JobEvent]) -> tuple[list[str], list[list[str]]]:
    header = ["TIME", "EVENT", "FROM", "TO", "ATTEMPT", "SLOT", "REASON"]
    rows = [
        [
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.time)),
            e.event,
            e.from_status or "",
            e.to_status or "-",
            "" if e.attempt is None else str(e.attempt),
            e.slot or "",
            e.reason or "",
        ]
        for e in events
    ]
    return header, rows


def is_repeat(to_status: str | None, reason: str | None) -> bool:
    """A recorded report that changed nothing because it came late or twice (a stale report of
    an ended attempt, an accept of a job already accepted): harmless, kept in the history."""
    return to_status is None and bool(reason) and (
        str(reason).startswith("stale:") or " ignored in state " in str(reason))


def event_json(e: JobEvent) -> dict[str, Any]:
    return {
        k: getattr(e, k)
        for k in (
            "id",
            "job_id",
            "time",
            "event",
            "from_status",
            "to_status",
            "attempt",
            "slot",
            "host",
            "reason",
            "attrs",
        )
    }


def watch_line(r: Mapping[str, Any]) -> str:
    """One `jobstore watch` line from a record's JSON form (watch.JobEvent/JobFinished)."""
    when = "" if r["time"] is None else time.strftime("%m/%d %H:%M:%S", time.localtime(r["time"]))
    if r["event"] == "finished":
        if r["exit_signal"] is not None:
            outcome = f"signal {r['exit_signal']}"
        else:
            outcome = "" if r["exit_code"] is None else f"exit {r['exit_code']}"
        verdict = "ok" if r["succeeded"] else "not ok"
        parts = [when, r["job"], "finished", r["status"], outcome, verdict, r["reason"] or ""]
    else:
        change = f"{r['from_status'] or '-'} -> {r['to_status'] or '(unchanged)'}"
        parts = [when, r["job"], r["event"], change, r["slot"] or "", r["reason"] or ""]
    return shown("  ".join(p for p in parts if p))


def shown(text: str) -> str:
    """`text` as a terminal may show it: what is not printable (control characters, escape
    sequences, line and bidirectional marks anyone could have stored) as `?`."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3) :]


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Plain aligned columns, like condor_q: easy to read and to grep (what is not printable
    shown as `?`)."""
    header = [shown(h) for h in header]
    rows = [[shown(c) for c in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)


def userprio_rows(
    table: Iterable[tuple[Usage, float | None]], now: float
) -> tuple[list[str], list[list[str]]]:
    """`jobstore userprio`: condor_userprio's columns, best effective priority first; the
    priorities and usage as the accountant last wrote them, the slots in use as of now."""
    header = ["SUBMITTER", "EFFECTIVE PRIORITY", "REAL PRIORITY", "FACTOR", "RES IN USE",
              "USAGE (WGHTED-HRS)", "USAGE START", "LAST USAGE"]
    rows = []
    for u, first in sorted(table, key=lambda t: fairshare.effective_priority(t[0])):
        real = fairshare.real_priority(u)
        rows.append([
            u.name, f"{real * u.factor:.2f}", f"{real:.2f}", f"{u.factor:.2f}",
            f"{u.in_use:g}", f"{u.usage / 3600:.2f}", _when(first) or "-",
            "<now" if u.in_use > 0 else _since(u.last_usage, now),
        ])
    return header, rows


def userprio_json(table: Iterable[tuple[Usage, float | None]], now: float) -> list[dict[str, Any]]:
    """`jobstore userprio --json`: one object per submitter, HTCondor's Accounting ad names."""
    out = []
    for u, first in table:
        real = fairshare.real_priority(u)
        out.append({
            "Name": u.name, "Priority": real * u.factor, "RealPriority": real,
            "PriorityFactor": u.factor, "WeightedResourcesUsed": u.in_use,
            "WeightedAccumulatedUsage": u.usage, "BeginUsageTime": first,
            "LastUsageTime": now if u.in_use > 0 else u.last_usage,
            "LastUpdate": u.updated_at,
        })
    return out


def _since(t: float | None, now: float) -> str:
    """condor_userprio's `d+hh:mm` since a time."""
    if t is None:
        return "-"
    minutes = int(max(0.0, now - t) // 60)
    return f"{minutes // 1440}+{minutes % 1440 // 60:02d}:{minutes % 60:02d}"
