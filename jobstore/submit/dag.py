"""DAGMan's input file, read as HTCondor 25's DAGMan reads it: the nodes (with the
nodes of its splices, named after them), their dependencies and what each node asks for,
checked as a whole (unknown or duplicate names, a cycle, a missing submit file) before anything
is queued.

What the job store does itself (dependencies in the database, no DAGMan process) is read here;
every command it cannot honour is refused with the file, the line and the command, never
skipped. Keywords are case-insensitive, as DAGMan's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from jobstore.errors import DagError

ALL_NODES = "ALL_NODES"
# DAGMan's commands the job store does not run, with why (each refused where it appears).
REFUSED = {
    "PROVISIONER": "(a node that provisions resources) is not supported",
    "SERVICE": "(a node that runs beside the DAG) is not supported",
    "ENV": "sets the DAGMan process's environment; the job store has no DAGMan process",
    "JOBSTATE_LOG": "is written by no process here: `jobstore dag jobstate-log DAGID` prints "
                    "it, in DAGMan's format, when asked",
    "DOT": "is not supported",
    "SAVE_POINT_FILE": "is not supported",
    "CONNECT": "(splice pins) is not supported",
    "PIN_IN": "(splice pins) is not supported",
    "PIN_OUT": "(splice pins) is not supported",
}
# What a CONFIG file may set; anything else it sets is refused.
CONFIG_KNOBS = ("DAGMAN_MAX_JOBS_IDLE", "DAGMAN_MAX_JOBS_SUBMITTED", "DAGMAN_DEFAULT_APPEND_VARS",
                "DAGMAN_MAX_PRE_SCRIPTS", "DAGMAN_MAX_POST_SCRIPTS")
MAX_SCRIPT = 4096  # characters of a SCRIPT's command line
MAX_DEFER = 86400 * 30  # seconds a SCRIPT DEFER may put its script off
DEBUG_STREAMS = ("STDOUT", "STDERR", "ALL")  # what SCRIPT DEBUG keeps of a script's output
STATUS_EVERY = 60  # DAGMan's least seconds between two writes of the node status file
_NAME = re.compile(r"[^\s+{}]+")
_MACRO = re.compile(r"[A-Za-z0-9_.+]+")
_VAR = re.compile(r'\s*([^\s=]+)\s*=\s*"((?:[^"\\]|\\.)*)"')
_KEYWORDS = {"PARENT", "CHILD", ALL_NODES}


def _check_subdag(inner: Dag, name: str, where: str) -> None:
    """Refuse what would run a sub-DAG differently from its nodes run in place: what DAGMan
    would apply to the sub-DAG alone (its CONFIG, SET_JOB_ATTR, ABORT-DAG-ON, global
    categories)."""
    why = ("CONFIG" if inner.config else "SET_JOB_ATTR" if inner.job_attrs else
           "ABORT-DAG-ON" if any(n.abort_exit is not None for n in inner.nodes.values()) else
           "a global (+) CATEGORY" if any((n.category or "").startswith("+")
                                           for n in inner.nodes.values()) else None)
    if why is not None:
        raise DagError(f"{where}: the sub-DAG {name} has {why}, which would apply to the "
                       "sub-DAG alone; its nodes run in this DAG here (use SPLICE, or drop it)")


@dataclass
class Var:
    name: str
    value: str
    prepend: bool | None  # None: as DAGMAN_DEFAULT_APPEND_VARS says


@dataclass
class Node:
    """One node of a DAG, as its file describes it."""

    name: str
    where: str  # FILE:LINE of its JOB (or FINAL) line
    submit_file: str | None  # the node's submit description file (absolute)
    inline: str | None  # or its inline description (JOB N { ... }, SUBMIT-DESCRIPTION)
    directory: str  # DIR, absolute: where its submit file's relative paths point
    noop: bool = False
    done: bool = False
    final: bool = False
    vars: list[Var] = field(default_factory=list)
    retry: int = 0
    unless_exit: int | None = None
    priority: int = 0
    category: str | None = None
    abort_exit: int | None = None  # ABORT-DAG-ON: this exit code stops the DAG
    abort_return: int | None = None  # and the DAG's own exit code then (None: the node's)
    parents: list[str] = field(default_factory=list)
    pre_script: str | None = None  # SCRIPT PRE: its command line, as the DAG file gives it
    post_script: str | None = None  # SCRIPT POST
    hold_script: str | None = None  # SCRIPT HOLD: run each time a job of the node is held
    pre_skip: int | None = None  # PRE_SKIP: this exit of the PRE script skips the node
    script_where: str | None = None  # FILE:LINE of its first SCRIPT
    # SCRIPT DEFER and DEBUG, by kind: {"pre": {"defer": [status, seconds], "debug": [file,
    # "STDOUT" | "STDERR" | "ALL"]}, "post": {...}}
    script_options: dict[str, dict[str, list[int | str]]] = field(default_factory=dict)


@dataclass
class Dag:
    """A DAG file read whole: its nodes in order, the category throttles and its settings."""

    path: str
    nodes: dict[str, Node] = field(default_factory=dict)
    maxjobs: dict[str, int] = field(default_factory=dict)  # MAXJOBS per category
    config: dict[str, str] = field(default_factory=dict)  # CONFIG's DAGMAN_* knobs
    job_attrs: dict[str, str] = field(default_factory=dict)  # SET_JOB_ATTR: the DAG's own ad
    status_file: str | None = None  # NODE_STATUS_FILE, kept current on the access point
    status_every: int = STATUS_EVERY  # its minimumUpdateTime

    @property
    def final(self) -> Node | None:
        return next((n for n in self.nodes.values() if n.final), None)

    def children(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {name: [] for name in self.nodes}
        for node in self.nodes.values():
            for parent in node.parents:
                out[parent].append(node.name)
        return out


def read_dag(path: str) -> Dag:
    """Read a DAG file (and what it INCLUDEs and CONFIGs); DagError names what is wrong."""
    path = os.path.abspath(path)
    dag = Dag(path)
    _Reader(dag).read(path)
    _check(dag)
    return dag


@dataclass
class _Line:
    """One command of a DAG file (with an inline description's text), after INCLUDEs."""

    where: str
    words: list[str]
    text: str
    here: str  # the directory of its file
    block: str | None = None


_DEFINES = ("JOB", "FINAL", "SUBMIT-DESCRIPTION", "SPLICE", "SUBDAG")


class _Reader:
    """DAGMan reads a DAG in two passes: the nodes first, then what refers to them (so that
    PARENT may come before the JOB it names, as htcondor2.dags writes it)."""

    def __init__(self, dag: Dag) -> None:
        self.dag = dag
        self.descriptions: dict[str, str] = {}  # SUBMIT-DESCRIPTION name -> text
        self.including: list[str] = []
        self.splices: dict[str, tuple[list[str], list[str]]] = {}  # its first and last nodes
        self.subdags: set[str] = set()  # the splices that are a SUBDAG's
        self.own: list[str] = []  # the nodes this file defines (ALL_NODES: not a splice's)
        self.splicing: list[str] = []  # the DAG files splicing this one
        self.files: dict[str, bool] = {}  # submit file -> it exists (nodes share a few)

    def read(self, path: str) -> None:
        lines = self._collect(path)
        for line in lines:
            command = line.words[0].upper()
            if command in REFUSED:
                raise DagError(f"{line.where}: {line.words[0]} {REFUSED[command]}")
            if command in _DEFINES:
                self._define(line)
        for line in lines:
            if line.words[0].upper() not in _DEFINES:
                self._command(line)

    def _collect(self, path: str) -> list[_Line]:
        if path in self.including:
            raise DagError(f"{path}: INCLUDEs itself")
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read().splitlines()
        except OSError as exc:
            raise DagError(f"{path}: cannot read the DAG file: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise DagError(f"{path}: not a text file") from None
        self.including.append(path)
        out: list[_Line] = []
        here = os.path.dirname(path)
        numbered = iter(enumerate(text, 1))
        for number, raw in numbered:
            words = raw.split()
            if not words or words[0].startswith("#"):
                continue
            line = _Line(f"{path}:{number}", words, raw, here)
            if words[0].upper() in ("JOB", "FINAL", "SUBMIT-DESCRIPTION") and (
                    len(words) > 2 and words[2] == "{"):
                line.block = _block(numbered, line.where)
            if words[0].upper() == "INCLUDE":
                if len(words) != 2:
                    raise DagError(f"{line.where}: INCLUDE needs one file name")
                out.extend(self._collect(os.path.join(here, words[1])))
                continue
            out.append(line)
        self.including.pop()
        return out

    def _define(self, line: _Line) -> None:
        words, where = line.words, line.where
        if words[0].upper() == "SPLICE":
            self._splice(words, where, line.here)
            return
        if words[0].upper() == "SUBDAG":
            self._subdag(words, where, line.here)
            return
        if words[0].upper() == "SUBMIT-DESCRIPTION":
            if len(words) != 3 or line.block is None:
                raise DagError(f"{where}: SUBMIT-DESCRIPTION needs a name and {{")
            self.descriptions[words[1]] = line.block
            return
        self._job(words, where, line.here, line.block, final=words[0].upper() == "FINAL")

    def _command(self, line: _Line) -> None:
        words, where, here = line.words, line.where, line.here
        command = words[0].upper()
        if command == "PARENT":
            self._parent(words, where)
        elif command == "VARS":
            self._vars(line.text, words, where)
        elif command == "RETRY":
            self._retry(words, where)
        elif command == "ABORT-DAG-ON":
            self._abort(words, where)
        elif command == "SCRIPT":
            self._script(line.text, words, where)
        elif command == "PRE_SKIP":
            value = _int(words, 2, where, "PRE_SKIP <node> non-zero-exit-code", size=3)
            if value == 0:
                raise DagError(f"{where}: PRE_SKIP's exit code is not 0 (PRE_SKIP <node> "
                               "non-zero-exit-code)")
            for node in self._targets(words[1], where):
                node.pre_skip = value
        elif command == "PRIORITY":
            value = _int(words, 2, where, "PRIORITY <node> value", size=3)
            for node in self._targets(words[1], where):
                node.priority = value
        elif command == "CATEGORY":
            if len(words) != 3:
                raise DagError(f"{where}: CATEGORY needs a node and a category name")
            for node in self._targets(words[1], where):
                node.category = words[2]
        elif command == "MAXJOBS":
            self.dag.maxjobs[words[1] if len(words) > 1 else ""] = _int(
                words, 2, where, "MAXJOBS <category> value", size=3, least=0)
        elif command == "DONE":
            if len(words) != 2:
                raise DagError(f"{where}: DONE needs one node name")
            self._node(words[1], where).done = True
        elif command == "CONFIG":
            if len(words) != 2:
                raise DagError(f"{where}: CONFIG needs one file name")
            self._config(os.path.join(here, words[1]), where)
        elif command == "SET_JOB_ATTR":
            attr, sep, text = line.text.strip()[len(words[0]):].partition("=")
            if not sep or not attr.strip() or not text.strip():
                raise DagError(f"{where}: SET_JOB_ATTR needs Name = Value")
            self.dag.job_attrs[attr.strip()] = text.strip()
        elif command == "NODE_STATUS_FILE":
            usage = "NODE_STATUS_FILE <file> [minimumUpdateTime] [ALWAYS-UPDATE]"
            if not 2 <= len(words) <= 4 or (len(words) == 4
                                             and words[3].upper() != "ALWAYS-UPDATE"):
                raise DagError(f"{where}: {usage}")
            self.dag.status_file = os.path.join(here, words[1])
            if len(words) > 2:
                self.dag.status_every = min(_int(words, 2, where, usage, least=0), 86400)
        elif command == "REJECT":
            raise DagError(f"{where}: REJECT: the DAG file says it must not run")
        else:
            raise DagError(f"{where}: unknown command {words[0]!r}")

    def _job(self, words: list[str], where: str, here: str, block: str | None, *,
             final: bool) -> None:
        what = "FINAL" if final else "JOB"
        if len(words) < 3:
            raise DagError(f"{where}: {what} needs a node name and a submit description")
        name, description = words[1], words[2]
        if not _NAME.fullmatch(name) or name.upper() in _KEYWORDS:
            raise DagError(f"{where}: {name!r} may not be a node name")
        if name in self.dag.nodes:
            raise DagError(f"{where}: duplicate node name {name!r} (first at "
                           f"{self.dag.nodes[name].where})")
        inline = None
        rest = words[3:]
        if description == "{":
            inline = block
        elif description in self.descriptions:
            inline = self.descriptions[description]
        directory = here
        node_flags: set[str] = set()
        while rest:
            word = rest.pop(0).upper()
            if word == "DIR" and rest:
                directory = os.path.join(here, rest.pop(0))
            elif word in ("NOOP", "DONE") and not (final and word == "DONE"):
                node_flags.add(word)
            else:
                raise DagError(f"{where}: {what} {name}: unexpected {word!r}")
        submit_file = None
        if inline is None:
            submit_file = os.path.join(directory, description)
            if submit_file not in self.files:
                self.files[submit_file] = os.path.isfile(submit_file)
            if not self.files[submit_file] and "NOOP" not in node_flags:
                raise DagError(f"{where}: node {name}: no such submit file {submit_file}")
        if final and self.dag.final is not None:
            raise DagError(f"{where}: a second FINAL node ({self.dag.final.name} is one)")
        self.own.append(name)
        self.dag.nodes[name] = Node(name, where, submit_file, inline, directory,
                                    noop="NOOP" in node_flags, done="DONE" in node_flags,
                                    final=final)

    def _subdag(self, words: list[str], where: str, here: str) -> None:
        """SUBDAG EXTERNAL name file [DIR dir] [NOOP] [DONE]: a DAG run as one node. Its nodes
        run in this DAG, named `name+node` as a splice's are, which ends as DAGMan's sub-DAG
        node would (done once all of them are, failing its descendants otherwise); what would
        make a sub-DAG run differently from its nodes in place is refused."""
        usage = DagError(f"{where}: SUBDAG needs EXTERNAL, a node name and a DAG file "
                         "[DIR directory] [NOOP] [DONE]")
        if len(words) < 4 or words[1].upper() != "EXTERNAL":
            raise usage
        rest, directory, flags = iter(words[4:]), [], set()
        for word in rest:
            if word.upper() == "DIR":
                directory = ["DIR", next(rest, "")]
            elif word.upper() in ("NOOP", "DONE"):
                flags.add(word.upper())
            else:
                raise usage
        if directory[1:] == [""]:
            raise usage
        name = words[2]
        inner = self._splice(["SPLICE", name, words[3], *directory], where, here,
                             kind="sub-DAG")
        self.subdags.add(name)
        for node in inner.nodes.values():
            node.noop = node.noop or "NOOP" in flags
            node.done = node.done or "DONE" in flags

    def _splice(self, words: list[str], where: str, here: str, kind: str = "splice") -> Dag:
        """SPLICE name file [DIR dir]: the file's nodes, named `name+node`, in this DAG; its
        categories too (`+cat` stays global); `name` in PARENT/CHILD stands for its first or
        last nodes."""
        if len(words) not in (3, 5) or (len(words) == 5 and words[3].upper() != "DIR"):
            raise DagError(f"{where}: SPLICE needs a name and a DAG file [DIR directory]")
        name = words[1]
        if name in self.splices or name in self.dag.nodes or not _NAME.fullmatch(name):
            raise DagError(f"{where}: {name!r} may not name a splice (a duplicate name?)")
        directory = os.path.join(here, words[4]) if len(words) == 5 else here
        path = os.path.join(directory, words[2])
        if path in self.splicing or path == self.dag.path:
            raise DagError(f"{where}: the splice {name} includes itself")
        inner = Dag(path)
        reader = _Reader(inner)
        reader.splicing = [*self.splicing, self.dag.path]
        try:
            reader.read(path)
        except DagError as exc:
            raise DagError(f"{exc} (in the splice {name} of {where})") from None
        if inner.final is not None:
            raise DagError(f"{where}: the {kind} {name} has a FINAL node ({inner.final.name})"
                           f", which a {kind} may not have here")
        if kind == "sub-DAG":
            _check_subdag(inner, name, where)

        def scoped(category: str | None) -> str | None:
            if category is None:
                return None
            return category[1:] if category.startswith("+") else f"{name}+{category}"

        children = inner.children()
        for node in inner.nodes.values():
            full = f"{name}+{node.name}"
            if full in self.dag.nodes:
                raise DagError(f"{where}: duplicate node name {full!r}")
            node.name, node.category = full, scoped(node.category)
            node.parents = [f"{name}+{p}" for p in node.parents]
            self.dag.nodes[full] = node
        for category, limit in inner.maxjobs.items():
            self.dag.maxjobs[scoped(category) or ""] = limit
        self.splices[name] = ([n.name for n in inner.nodes.values() if not n.parents],
                              [f"{name}+{k}" for k, kids in children.items() if not kids])
        return inner

    def _node(self, name: str, where: str) -> Node:
        node = self.dag.nodes.get(name)
        if node is None and name in self.subdags:
            raise DagError(f"{where}: {name} is a SUBDAG, whose nodes run in this DAG: a "
                           "command for the sub-DAG as one node (RETRY, VARS, PRIORITY, "
                           "CATEGORY, ABORT-DAG-ON) is not supported")
        if node is None:
            raise DagError(f"{where}: unknown node {name!r}")
        return node

    def _targets(self, name: str, where: str) -> list[Node]:
        if name.upper() == ALL_NODES:
            return [self.dag.nodes[n] for n in self.own if not self.dag.nodes[n].final]
        return [self._node(name, where)]

    def _parent(self, words: list[str], where: str) -> None:
        upper = [w.upper() for w in words]
        if "CHILD" not in upper:
            raise DagError(f"{where}: PARENT needs CHILD")
        split = upper.index("CHILD")
        parents, children = words[1:split], words[split + 1:]
        if not parents or not children:
            raise DagError(f"{where}: PARENT needs at least one parent and one child")
        parents = [n for name in parents for n in self.splices.get(name, ([], [name]))[1]]
        children = [n for name in children for n in self.splices.get(name, ([name], []))[0]]
        for name in parents + children:
            if self._node(name, where).final:
                raise DagError(f"{where}: the FINAL node {name} may not have parents or "
                               "children")
        for child in children:
            node = self._node(child, where)
            known = set(node.parents)
            for parent in parents:
                if parent not in known:
                    known.add(parent)
                    node.parents.append(parent)

    def _vars(self, line: str, words: list[str], where: str) -> None:
        if len(words) < 3:
            raise DagError(f'{where}: VARS needs a node and name="value"')
        rest = line.strip()[len(words[0]):].lstrip()[len(words[1]):]
        prepend: bool | None = None
        mode = rest.split(None, 1)[0].upper() if rest.strip() else ""
        if mode in ("PREPEND", "APPEND"):
            prepend = mode == "PREPEND"
            rest = rest.lstrip()[len(mode):]
        found: list[Var] = []
        pos = 0
        while rest[pos:].strip():
            match = _VAR.match(rest, pos)
            if match is None:
                raise DagError(f'{where}: VARS: {rest[pos:].strip()!r} is not name="value"')
            name = match.group(1)
            if not _MACRO.fullmatch(name) or name.lower().startswith("queue"):
                raise DagError(f"{where}: VARS: {name!r} may not be a macro name")
            value = re.sub(r"\\(.)", r"\1", match.group(2))
            found.append(Var(name, value, prepend))
            pos = match.end()
        for node in self._targets(words[1], where):
            node.vars.extend(found)

    def _retry(self, words: list[str], where: str) -> None:
        count, unless = _int_and_option(words, where, "UNLESS-EXIT", "RETRY <node> count "
                                        "[UNLESS-EXIT value]", least=0)
        for node in self._targets(words[1], where):
            node.retry, node.unless_exit = count, unless

    def _script(self, text: str, words: list[str], where: str) -> None:
        """SCRIPT [DEFER status time] [DEBUG file STDOUT|STDERR|ALL] PRE|POST|HOLD <node>
        executable [arguments]: run on the access point, as the node's owner, in its
        directory (a HOLD script each time a job of the node is held)."""
        usage = (f"{where}: SCRIPT needs [DEFER status time] [DEBUG file STDOUT|STDERR|ALL] "
                 "PRE, POST or HOLD, a node and an executable [arguments]")
        at, options = 1, dict[str, list[int | str]]()
        if len(words) > at and words[at].upper() == "DEFER":
            status = _int(words, at + 1, where, "SCRIPT DEFER status time", least=1)
            seconds = _int(words, at + 2, where, "SCRIPT DEFER status time", least=0)
            if status > 255 or seconds > MAX_DEFER:
                raise DagError(f"{where}: SCRIPT DEFER: a status of 1 to 255 and at most "
                               f"{MAX_DEFER} seconds")
            options["defer"] = [status, seconds]
            at += 3
        if len(words) > at and words[at].upper() == "DEBUG":
            if len(words) <= at + 2 or words[at + 2].upper() not in DEBUG_STREAMS:
                raise DagError(f"{where}: SCRIPT DEBUG needs a file and STDOUT, STDERR or ALL")
            file = words[at + 1]
            if len(file) > MAX_SCRIPT or any(ord(c) < 32 or c == "\x7f" for c in file):
                raise DagError(f"{where}: SCRIPT DEBUG: {file!r} is not a file's name")
            options["debug"] = [file, words[at + 2].upper()]
            at += 3
        if len(words) > at and words[at].upper() == "HOLD" and "defer" in options:
            raise DagError(f"{where}: SCRIPT DEFER of a HOLD script is not supported")
        if len(words) < at + 3 or words[at].upper() not in ("PRE", "POST", "HOLD"):
            raise DagError(usage)
        rest = text.strip()
        for word in words[:at + 2]:
            rest = rest[len(word):].lstrip()
        command = " ".join(rest.split())
        if len(command) > MAX_SCRIPT or "\0" in command:
            raise DagError(f"{where}: SCRIPT: a command line of at most {MAX_SCRIPT} "
                           "characters")
        kind = words[at].lower()
        for node in self._targets(words[at + 1], where):
            if kind == "pre":
                node.pre_script = command
            elif kind == "post":
                node.post_script = command
            else:
                node.hold_script = command
            node.script_options.pop(kind, None)
            if options:
                node.script_options[kind] = options
            node.script_where = node.script_where or where

    def _abort(self, words: list[str], where: str) -> None:
        value, back = _int_and_option(words, where, "RETURN", "ABORT-DAG-ON <node> exit-value "
                                      "[RETURN dag-return-value]")
        for node in self._targets(words[1], where):
            node.abort_exit, node.abort_return = value, back

    def _config(self, path: str, where: str) -> None:
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except OSError as exc:
            raise DagError(f"{where}: CONFIG {path}: {exc.strerror}") from None
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            name, sep, value = text.partition("=")
            knob = name.strip().upper()
            if not sep or knob not in CONFIG_KNOBS:
                raise DagError(f"{path}:{number}: {name.strip()} is not a setting the job "
                               f"store's DAGs take (only {', '.join(CONFIG_KNOBS)})")
            self.dag.config[knob] = value.strip()


def _block(numbered: Iterator[tuple[int, str]], where: str) -> str:
    """The lines of an inline submit description, up to its closing `}`."""
    body: list[str] = []
    for _number, line in numbered:
        if line.strip() == "}":
            return "\n".join(body) + "\n"
        body.append(line)
    raise DagError(f"{where}: the inline submit description has no closing }}")


def _int_and_option(words: list[str], where: str, keyword: str, usage: str, *,
                    least: int | None = None) -> tuple[int, int | None]:
    """`COMMAND <node> N [KEYWORD M]`: N, and M or None."""
    value = _int(words, 2, where, usage, least=least)
    if len(words) == 3:
        return value, None
    if len(words) < 4 or words[3].upper() != keyword:
        raise DagError(f"{where}: {usage}")
    return value, _int(words, 4, where, usage, size=5)


def _int(words: list[str], index: int, where: str, usage: str, *, size: int | None = None,
         least: int | None = None) -> int:
    if len(words) <= index or (size is not None and len(words) != size):
        raise DagError(f"{where}: {usage}")
    try:
        value = int(words[index])
    except ValueError:
        raise DagError(f"{where}: {words[index]!r} is not an integer ({usage})") from None
    if least is not None and value < least:
        raise DagError(f"{where}: {value} is less than {least} ({usage})")
    return value


def _check(dag: Dag) -> None:
    """DAGMan's checks of the whole: nodes, and no cycle."""
    if not dag.nodes:
        raise DagError(f"{dag.path}: the DAG has no nodes")
    for node in dag.nodes.values():
        if node.retry and (node.pre_script or node.post_script):
            raise DagError(f"{node.script_where}: node {node.name} has a SCRIPT and a RETRY: "
                           "DAGMan retries such a node with its scripts, which is not "
                           "supported yet (drop the RETRY, or the SCRIPT)")
    children = dag.children()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for start in dag.nodes:
        if state.get(start):
            continue
        stack = [(start, iter(children[start]))]
        state[start] = 1
        path = [start]
        while stack:
            name, todo = stack[-1]
            nxt = next(todo, None)
            if nxt is None:
                state[name] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                loop = path[path.index(nxt):] + [nxt]
                raise DagError(f"{dag.path}: the DAG has a cycle: {' -> '.join(loop)}")
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(children[nxt])))
                path.append(nxt)
