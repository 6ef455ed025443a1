"""A parsed submit description's jobs: each proc's JobSpec as condor_submit expands the
description for it, made one at a time as they are read (SubmitSpecs), or one ProcTemplate
for a description whose per-proc macros are plain text."""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import re
import secrets
import signal
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

import classad2
import htcondor2

from jobstore.core import limits
from jobstore.core.fairshare import check_group_name
from jobstore.core.jobs import (
    DEFAULT_REQUEST_DISK,
    DEFAULT_REQUEST_MEMORY,
    PLACEHOLDER_MARK,
    TEMPLATED_FIELDS,
    JobSpec,
    ProcTemplate,
)
from jobstore.core.policy import POLICY_COMMANDS
from jobstore.errors import FieldError, InvalidInput, SubmitError
from jobstore.submit import commands
from jobstore.submit.classadfile import AD_FIELDS
from jobstore.submit.limits import MAX_PROCS
from jobstore.submit.syntax import args_to_v2, env_to_v2, env_words_to_v2, split_args_v2
from jobstore.submit.transfer import read_transfer, sandbox_inputs, transfer_attrs
from jobstore.submit.values import (
    CONTROL,
    FALSE_WORDS,
    SUBMIT_NAMES,
    TRUE_WORDS,
    abspath,
    check_custom_name,
    check_spec,
    check_value,
    old_expr,
    parse_int,
    parse_retry_until,
    parse_size,
)

_CLUSTER_SENTINEL = "JOBSTORE_CLUSTER_ID_IS_NOT_KNOWN_AT_SUBMIT_TIME"
# The per-proc built-in macros and what each one counts (ProcTemplate.counters).
_COUNTERS = {"Process": "proc", "ProcId": "proc", "Step": "step", "Row": "row",
             "ItemIndex": "row"}
# A macro function ($INT(...), $ENV(...), $Fn(...), ...): its result is not the plain text of
# the macros it reads, so a description that uses one is expanded proc by proc.
_MACRO_FUNCTION = re.compile(r"\$[A-Za-z_]\w*\(")
# Item values a placeholder can stand for: the same text in a path, an argument list, an
# environment, JSON and a ClassAd string, whatever surrounds it.
_PLAIN = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")

# The commands the expansion reads, each under the names condor_submit takes for it.
_COMMANDS: dict[str, tuple[str, ...]] = {
    "executable": ("executable",),
    "arguments": ("arguments",),
    "environment": ("environment", "env"),
    "input": ("input", "stdin"),
    "output": ("output", "stdout"),
    "error": ("error", "stderr"),
    "initialdir": ("initialdir", "initial_dir", "job_iwd"),
    "request_cpus": ("request_cpus", "requestcpus"),
    "request_memory": ("request_memory", "requestmemory"),
    "request_disk": ("request_disk", "requestdisk"),
    "requirements": ("requirements",),
    "priority": ("priority", "prio"),
    "max_retries": ("max_retries",),
    "success_exit_code": ("success_exit_code",),
    "retry_until": ("retry_until",),
    "log": ("log",),
    "accounting_group": ("accounting_group",),
    "accounting_group_user": ("accounting_group_user",),
    "concurrency_limits": ("concurrency_limits",),
    **{command: (command,) for command in POLICY_COMMANDS},
    "kill_sig": ("kill_sig",),
    "job_max_vacate_time": ("job_max_vacate_time",),
    "universe": ("universe",),
    "transfer_executable": ("transfer_executable",),
    "transfer_input_files": ("transfer_input_files", "transferinputfiles"),
    "transfer_output_files": ("transfer_output_files", "transferoutputfiles"),
    "transfer_output_remaps": ("transfer_output_remaps",),
    "should_transfer_files": ("should_transfer_files",),
    "when_to_transfer_output": ("when_to_transfer_output",),
    "checkpoint_exit_code": ("checkpoint_exit_code",),
    "transfer_checkpoint_files": ("transfer_checkpoint_files",),
    "output_destination": ("output_destination",),
    "hold": ("hold",),
    "getenv": ("getenv", "get_env"),
    "skip_filechecks": ("skip_filechecks",),
}


# request_<tag> commands with an attribute and a column of their own
_OWN_REQUESTS = frozenset({"request_cpus", "requestcpus", "request_memory", "requestmemory",
                           "request_disk", "requestdisk"})


def kill_signal(value: str) -> str:
    """condor_submit's kill_sig: a signal name (SIGINT, INT) or number -> its name."""
    text = value.strip().upper()
    try:
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[
            text if text.startswith("SIG") else "SIG" + text]
    except (KeyError, ValueError):
        raise InvalidInput(f"{value.strip()!r} is not a signal") from None
    return sig.name


def _submit_bool(text: str) -> bool:
    """A submit file's boolean, strictly: true/false, yes/no, t/f, y/n, 1/0."""
    low = text.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise InvalidInput(f"{text.strip()!r} is not true or false")


def _getenv(value: str) -> dict[str, str]:
    """condor_submit's getenv: true (the whole environment of the submitting process) or a
    list of variable names and patterns (* and ?; a leading ! leaves names out)."""
    low = value.strip().lower()
    if low in FALSE_WORDS:
        return {}
    patterns = (["*"] if low in TRUE_WORDS
                else [p for p in re.split(r"[\s,]+", value.strip()) if p])
    wanted = [p for p in patterns if not p.startswith("!")]
    unwanted = [p[1:] for p in patterns if p.startswith("!")]
    return {name: text for name, text in os.environ.items()
            if any(fnmatch.fnmatchcase(name, p) for p in wanted)
            and not any(fnmatch.fnmatchcase(name, p) for p in unwanted)
            and not CONTROL.search(text) and "=" not in name}


def _with_getenv(inherited: dict[str, str], env: str) -> str:
    """The job's environment: what getenv took, then the environment command's (which wins)."""
    if not inherited:
        return env
    own = {word.partition("=")[0]: word for word in split_args_v2(env)}
    merged = [f"{k}={v}" for k, v in inherited.items() if k not in own] + list(own.values())
    return env_words_to_v2(merged)


def _args_v1(value: str, args: str) -> str | None:
    """The arguments (`value` as given, `args` in the new syntax) as the job ad's Args when
    given in the old syntax (not in quotes)."""
    return None if value.startswith('"') else " ".join(split_args_v2(args))


def _is_resource(key: str) -> bool:
    """request_<tag> of a custom resource (GPUs too), not of cpus, memory or disk."""
    low = key.lower()
    command = commands.lookup(low)
    return (low.startswith("request_") and low not in _OWN_REQUESTS and command is not None
            and command.kind == "handled")


def _resource_name(tag: str) -> str:
    """The resource a request_<tag> command asks for, as its attribute names it (GPUs)."""
    return "GPUs" if tag.lower() == "gpus" else tag


def _attribute_text(form: str, value: str) -> str:
    """A stored command's value as ClassAd expression text: a string, an expression, a
    boolean or an integer (ValueError for a value that is not one)."""
    if form == "string":
        text = value[1:-1] if len(value) > 1 and value[0] == value[-1] == '"' else value
        ad = classad2.ClassAd()
        ad["v"] = text
        return str(ad.lookup("v"))  # a ClassAd string literal
    if form == "bool":
        return "true" if _submit_bool(value) else "false"
    if form == "int":
        return str(parse_int(value))
    return old_expr(value)


def _is_true(text: str) -> bool:
    """A submit file's boolean, as condor_submit reads one (true/false, yes/no, 1/0)."""
    return text.strip().lower() not in FALSE_WORDS


class SubmitSpecs(Sequence[JobSpec]):
    """The jobs of a submit description, made one at a time as they are read: a `queue 100000`
    never holds 100,000 specs. Proc 0 is made at once; with per-proc macros, each later proc is
    expanded when read (its SubmitError comes then: Submissions.submit rolls the whole cluster
    back)."""

    def __init__(self, expander: SubmitExpander, items: list[dict[str, str]], count: int):
        self._expander = expander
        self._items = items
        self._count = count
        # made now, so that a description's errors show at once (a later proc's, in a
        # description whose commands use per-proc macros, when that proc is read)
        self._first = expander.spec_at(items, count, 0)

    def __len__(self) -> int:
        return len(self._items) * self._count

    @overload
    def __getitem__(self, index: int) -> JobSpec: ...

    @overload
    def __getitem__(self, index: slice) -> list[JobSpec]: ...

    def __getitem__(self, index: int | slice) -> JobSpec | list[JobSpec]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        proc = index + len(self) if index < 0 else index
        if not 0 <= proc < len(self):
            raise IndexError(index)
        if proc and self._expander.dynamic:
            return self._expander.spec_at(self._items, self._count, proc)
        first = self._first
        if proc == 0 or self._expander.per_cluster:
            return first if proc == 0 else dataclasses.replace(first, custom=dict(first.custom))
        return dataclasses.replace(first, proc_id=proc, custom=dict(first.custom))

    def __iter__(self) -> Iterator[JobSpec]:
        for proc in range(len(self)):
            yield self[proc]

    def template(self) -> ProcTemplate | None:
        """All the procs as one ProcTemplate, when each per-proc macro the description uses
        is plain text in the fields a template may hold; None otherwise (each proc is then
        expanded when read)."""
        return self._expander.template(self._items, self._count, self._first)


class SubmitExpander:
    """Expands the commands of a parsed submit description once per proc."""

    def __init__(self, source: str, base: str, submit: htcondor2.Submit, keys: dict[str, str],
                 *, per_cluster: bool = False, late_inputs: bool = False):
        self.source = source
        self.per_cluster = per_cluster  # each item a cluster of one proc (a DAG's nodes)
        self.late_inputs = late_inputs  # transfer_input_files read later (JobSpec.late_inputs)
        self.base = base
        self.submit = submit
        self.commands = self._command_keys(keys)
        self.custom_keys = {k[3:]: k for low, k in keys.items() if low.startswith("my.")}
        self.stored = {k: c for k in keys.values()
                       if (c := commands.lookup(k)) is not None and c.kind == "stored"}
        self.resources = {k: _resource_name(k[len("request_"):]) for k in keys.values()
                          if _is_resource(k)}
        self._refuse(keys)
        self.dynamic = any("$" in submit[k] for k in self._used_keys())
        submit["Cluster"] = submit["ClusterId"] = _CLUSTER_SENTINEL

    @staticmethod
    def _command_keys(keys: dict[str, str]) -> dict[str, str]:
        """Canonical command -> the key the file used for it (first alias present)."""
        found: dict[str, str] = {}
        for command, aliases in _COMMANDS.items():
            for alias in aliases:
                if alias in keys:
                    found[command] = keys[alias]
                    break
        return found

    def _used_keys(self) -> list[str]:
        return [*self.commands.values(), *self.custom_keys.values(), *self.stored,
                *self.resources]

    def _refuse(self, keys: dict[str, str]) -> None:
        """A refused command (jobstore.submit.commands) fails the submit, naming it, unless
        its value asks for nothing."""
        for key in keys.values():
            command = commands.lookup(key)
            if command is None or command.kind != "refused":
                continue
            value = self._expand(key, key, 0).strip().strip('"').lower()
            if value and value not in command.harmless:
                raise SubmitError(f"{self.source}: {key}: {command.why}")

    def specs(self, items: list[dict[str, str]], count: int) -> SubmitSpecs:
        """One JobSpec per (item, step), each made when it is read."""
        total = len(items) * count
        if total > MAX_PROCS:
            raise SubmitError(
                f"{self.source}: queue: {total} procs is more than the limit of {MAX_PROCS}"
            )
        if total == 0:
            raise SubmitError(f"{self.source}: the queue statement produces no jobs")
        return SubmitSpecs(self, items, count)

    def template(self, items: list[dict[str, str]], count: int,
                 first: JobSpec) -> ProcTemplate | None:
        """The procs of `items` x `count` as one ProcTemplate whose proc 0 is `first`, or None
        when the description's per-proc macros are not plain text substitutions (a macro
        function anywhere, an item value that is not plain, a placeholder outside
        TEMPLATED_FIELDS, or a proc the template would make differently)."""
        procs = len(items) * count
        if not self.dynamic:
            return ProcTemplate(first, procs, count, {}, {})
        if any(_MACRO_FUNCTION.search(self.submit[key]) for key in self.submit):
            return None
        names = sorted({name for row in items for name in row})
        if {n.lower() for n in names} & {n.lower() for n in _COUNTERS} or not all(
                _PLAIN.fullmatch(value := row.get(name, "")) and PLACEHOLDER_MARK not in value
                for row in items for name in names):
            return None
        nonce = secrets.token_hex(6)
        kinds = sorted(set(_COUNTERS.values()))
        placeholders = [f"JOBSTOREPROC{i:03d}X{nonce}" for i in range(len(kinds) + len(names))]
        counters = {} if self.per_cluster else dict(zip(kinds, placeholders, strict=False))
        variables = dict(zip(names, placeholders[len(kinds):], strict=True))
        self._set_proc_vars(variables, counters or dict.fromkeys(kinds, "0"))
        try:
            spec = self._spec(0)
        except SubmitError:
            return None
        if any(nonce in repr(getattr(spec, f.name)) for f in dataclasses.fields(spec)
               if f.name not in TEMPLATED_FIELDS):
            return None
        template = ProcTemplate(
            spec, procs, count,
            counters={placeholder: kind for kind, placeholder in counters.items()},
            items={variables[name]: [row[name] for row in items] for name in names},
        )
        last = self.spec_at(items, count, procs - 1)
        if template.spec_of(0) != first or (procs > 1 and dataclasses.replace(
                template.spec_of(procs - 1), proc_id=last.proc_id) != last):
            return None
        return template

    def spec_at(self, items: list[dict[str, str]], count: int, proc: int) -> JobSpec:
        """The JobSpec of proc `proc` (item proc // count, step proc % count)."""
        row, step = divmod(proc, count)
        if self.per_cluster:
            self._set_proc_vars(items[row], {"proc": "0", "step": "0", "row": "0"})
            return self._spec(0)
        self._set_proc_vars(items[row], {"proc": str(proc), "step": str(step), "row": str(row)})
        return self._spec(proc)

    def _set_proc_vars(self, item: Mapping[str, str], numbers: Mapping[str, str]) -> None:
        """Set item variables and the per-proc built-in macros (`numbers`: the text of each
        kind of _COUNTERS)."""
        for name, value in item.items():
            self.submit[name] = value
        for name, kind in _COUNTERS.items():
            self.submit[name] = numbers[kind]
        if not item:
            self.submit["Item"] = ""

    def _expand(self, key: str, what: str, proc: int) -> str:
        """Expand one command for the current proc (an empty value counts as unset)."""
        raw = self.submit.get(key, "").strip()
        if not raw:
            return ""
        try:
            value = self.submit.expand(key).strip()
        except Exception:
            raise self._error(what, f"cannot expand the macros in {raw!r}", proc) from None
        if _CLUSTER_SENTINEL in value:
            message = "$(Cluster)/$(ClusterId) is not known when jobs are read for the job store"
            raise self._error(what, message, proc)
        return value

    def _error(self, what: str, message: str, proc: int) -> SubmitError:
        where = f" (proc {proc})" if self.dynamic else ""
        return SubmitError(f"{self.source}{where}: {what}: {message}")

    def _spec(self, proc: int) -> JobSpec:
        """Build the JobSpec of one proc."""
        values = {
            command: self._expand(key, command, proc) for command, key in self.commands.items()
        }
        values = {k: v for k, v in values.items() if v != ""}
        custom = {}
        for name, key in self.custom_keys.items():
            value = self._expand(key, f"+{name}", proc)
            if value != "":
                custom[name] = value
        spec = self._build(values, custom, proc)
        extra = self._stored_attrs(proc)
        extra.update(self._resources(spec, proc))
        given = {n.lower() for n in spec.custom}  # +Attr wins
        spec.custom.update((n, t) for n, t in extra.items() if n.lower() not in given)
        return spec

    def _stored_attrs(self, proc: int) -> dict[str, str]:
        """The stored commands' attributes (ClassAd expression text)."""
        out: dict[str, str] = {}
        for key, command in self.stored.items():
            value = self._expand(key, key, proc)
            if value == "":
                continue
            try:
                out[command.attribute or key] = _attribute_text(command.form, value)
            except ValueError as exc:
                raise self._error(key, str(exc), proc) from None
        return out

    def _resources(self, spec: JobSpec, proc: int) -> dict[str, str]:
        """request_<tag>: Request<Tag>, and the clause condor_submit adds to Requirements,
        TARGET.<Tag> >= Request<Tag> (unless Requirements names <Tag>)."""
        out: dict[str, str] = {}
        clauses = []
        for key, tag in self.resources.items():
            value = self._expand(key, key, proc)
            if value == "":
                continue
            try:
                text = old_expr(value)
            except ValueError as exc:
                raise self._error(key, str(exc), proc) from None
            out[f"Request{tag}"] = text
            if not re.search(rf"(?i)\b{re.escape(tag)}\b", spec.requirements or ""):
                clauses.append(f"(TARGET.{tag} >= Request{tag})")
        if clauses:
            spec.requirements = " && ".join(
                ([f"({spec.requirements})"] if spec.requirements else []) + clauses)
        return out

    def _build(self, values: dict[str, str], custom: dict[str, str], proc: int) -> JobSpec:
        """Convert expanded command values, naming the command in any error."""
        current = "executable"

        def conv(command: str, func: Callable[[str], Any], default: Any = None) -> Any:
            nonlocal current
            current = command
            return func(values[command]) if command in values else default

        try:
            self._check_unsupported(values)
            iwd = conv("initialdir", lambda v: abspath(self.base, v), self.base)
            cmd = conv("executable", lambda v: abspath(iwd, v))
            if cmd is None:
                raise InvalidInput("missing: every job needs an executable")
            if (not os.path.exists(cmd) and _is_true(values.get("transfer_executable", "true"))
                    and not _is_true(values.get("skip_filechecks", "false"))):
                raise InvalidInput(
                    f"{cmd} does not exist here (when it exists only on the execute nodes, "
                    "say transfer_executable = false)"
                )
            args = conv("arguments", args_to_v2, "")
            spec = JobSpec(
                cmd=cmd,
                args=args,
                args_v1=conv("arguments", lambda v: _args_v1(v, args)),
                env=_with_getenv(conv("getenv", _getenv, {}),
                                 conv("environment", env_to_v2, "")),
                hold=conv("hold", _submit_bool, False),
                iwd=iwd,
                input=conv("input", str),
                output=conv("output", str),
                error=conv("error", str),
                request_cpus=conv("request_cpus", lambda v: parse_int(v, 1), 1),
                request_memory=conv(
                    "request_memory", lambda v: parse_size(v, 1 << 20), DEFAULT_REQUEST_MEMORY
                ),
                request_disk=conv(
                    "request_disk", lambda v: parse_size(v, 1 << 10), DEFAULT_REQUEST_DISK
                ),
                requirements=conv("requirements", old_expr),
                priority=conv("priority", parse_int, 0),
                max_retries=conv("max_retries", lambda v: parse_int(v, 0)),
                success_exit_code=conv("success_exit_code", parse_int, 0),
                retry_until=conv("retry_until", parse_retry_until),
                user_log=conv("log", lambda v: abspath(iwd, v)),
                accounting_group=conv(
                    "accounting_group", lambda v: check_group_name("accounting_group", v)
                ),
                accounting_group_user=conv(
                    "accounting_group_user",
                    lambda v: check_group_name("accounting_group_user", v),
                ),
                concurrency_limits=conv(
                    "concurrency_limits", lambda v: limits.render(limits.parse(v))
                ),
                proc_id=proc,
            )
            check_spec(spec, SUBMIT_NAMES)
        except ValueError as exc:
            raise self._error(getattr(exc, "what", current), str(exc), proc) from None
        # the policy commands set their HTCondor attributes, as +PeriodicHold = ... would
        policy = {POLICY_COMMANDS[c]: values[c] for c in POLICY_COMMANDS if c in values}
        if "job_max_vacate_time" in values:
            policy["JobMaxVacateTime"] = values["job_max_vacate_time"]
        if "kill_sig" in values:
            try:
                policy["KillSig"] = f'"{kill_signal(values["kill_sig"])}"'
            except ValueError as exc:
                raise self._error("kill_sig", str(exc), proc) from None
        spec.custom = self._custom({**policy, **custom}, proc)
        self._transfer(spec, values, proc)
        return spec

    def _transfer(self, spec: JobSpec, values: dict[str, str], proc: int) -> None:
        """condor_submit's file transfer: the files the sandbox starts with, and the
        attributes it sets (jobstore.submit.transfer)."""
        try:
            transfer = read_transfer(values, spec.iwd, check=not self.late_inputs)
            if transfer is None:
                for command in ("checkpoint_exit_code", "transfer_checkpoint_files"):
                    if values.get(command, "").strip():
                        raise FieldError(command, "needs file transfer (should_transfer_files"
                                         " = YES): the checkpoint travels in the sandbox")
                return
            stdin = abspath(spec.iwd, spec.input) if spec.input else None
            if self.late_inputs:
                spec.late_inputs = tuple((e.source, e.name) for e in transfer.inputs
                                         if not e.is_url)
                transfer = dataclasses.replace(
                    transfer, inputs=tuple(e for e in transfer.inputs if e.is_url))
            spec.inputs = sandbox_inputs(transfer, spec.cmd, stdin)
            spec.custom.update(transfer_attrs(transfer, values, spec.inputs))
        except ValueError as exc:
            raise self._error(getattr(exc, "what", "transfer_input_files"), str(exc),
                              proc) from None

    @staticmethod
    def _check_unsupported(values: dict[str, str]) -> None:
        """A universe other than vanilla cannot be honoured."""
        universe = values.get("universe", "vanilla")
        if universe.lower() != "vanilla":
            raise FieldError(
                "universe",
                f"{universe!r} is not supported; jobs fetched from the job store run in the "
                "vanilla universe",
            )

    def _custom(self, custom: dict[str, str], proc: int) -> dict[str, str]:
        """Validate ``+Attr`` / ``MY.Attr`` values."""
        result: dict[str, str] = {}
        commands = {attr: command for command, attr in POLICY_COMMANDS.items()}
        commands.update(JobMaxVacateTime="job_max_vacate_time", KillSig="kill_sig")
        for name, value in custom.items():
            what = commands.get(name, f"+{name}")
            try:
                check_custom_name(name)
                if name.lower() in AD_FIELDS:
                    raise InvalidInput(
                        f"{name} is set by a submit command; use the command instead")
                check_value(what, value, is_string=False)
                result[name] = old_expr(value)
            except ValueError as exc:
                raise self._error(getattr(exc, "what", what), str(exc), proc) from None
        return result
