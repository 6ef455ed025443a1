"""Values from a submit file or from the database reach the job ad that FETCH_WORK prints exactly,
and can never add or change another attribute.

Every value kind (arguments, environment, paths, custom attributes, the user log) is submitted
with hostile text, fetched by the real fetch_job executable, read back with classad2 *and* with
the hooks' own reader, and compared with a clean submit of the same shape. Values that the old
ClassAd syntax cannot carry are refused at submit time with one line."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import classad2
import htcondor2
import pytest
import sqlalchemy as sa
from argsplit import split_v2
from examples import examples
from hookrun import hook_env, run_hook
from hookseq import ordinary_owner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from testdata import TRANSCRIPTS

from jobstore.api.submission import SubmitError, submit_path
from jobstore.db.engine import upgrade
from jobstore.db.schema import jobs
from jobstore.db.store import JobStore
from jobstore.formats import classads
from jobstore.formats.jobads import render_job
from jobstore.node import config
from jobstore.testing.factories import a_job

SLOT = TRANSCRIPTS
SLOT_AD = "01-normal-job/01-FETCH_WORK.stdin"
# Hostile values: quoting, escapes, separators, non-ASCII, and attribute-injection attempts.
TRICKY = [
    'say "hi" and \'bye\'',
    "back\\slash \\\" \\\\ C:\\new\\table",
    "a=b==c",
    "a;b; c;",
    "[x] ]] [[",
    "café 日本 😀",
    'x"\\nOwner = "root',
    '"; Owner = "root',
    '"]; [ Owner = "root"; ]',
    '" + Owner + "',
    "''",
    '""',
]
# Attributes that differ between two submits of the same shape whatever their values.
PER_JOB = {"clusterid", "qdate", "jobstorejobid", "jobstoretoken"}


# ---- helpers ----------------------------------------------------------------------------------


def v2_submit_value(words: list[str]) -> str:
    """Words as a submit-file new-syntax value: single quotes group, outer double quotes."""
    quoted = ["'" + w.replace("'", "''") + "'" for w in words]
    return '"' + " ".join(quoted).replace('"', '""') + '"'


def old_string(value: str) -> str:
    """`value` as an old-syntax ClassAd string literal, as HTCondor would write it."""
    return classads.render_line("X", value).split(" = ", 1)[1].rstrip("\n")


def submit_file(values: list[str], kind: str) -> tuple[str, dict[str, object]]:
    """A submit description carrying `values` as `kind`, and the job ad values it must give."""
    joined = "_".join(values)
    # the hostile executables exist only on (imaginary) execute nodes
    lines = ["executable = /opt/rt/run", "transfer_executable = false"]
    expect: dict[str, object] = {}
    if kind == "arguments":
        lines.append(f"arguments = {v2_submit_value(values)}")
        expect["Arguments"] = values
    elif kind == "environment":
        entries = [f"V{i}={v}" for i, v in enumerate(values)]
        lines.append(f"environment = {v2_submit_value(entries)}")
        expect["Environment"] = entries
    elif kind == "executable":
        lines[0] = f"executable = /opt/rt/{joined}"
        expect["Cmd"] = f"/opt/rt/{joined}"
    elif kind == "input-output-error":
        for cmd, attr in (("input", "In"), ("output", "Out"), ("error", "Err")):
            lines.append(f"{cmd} = {cmd}-{joined}")
            expect[attr] = f"{cmd}-{joined}"
    elif kind == "initialdir":
        lines.append(f"initialdir = /opt/rt/{joined}")
        expect["Iwd"] = f"/opt/rt/{joined}"
    elif kind == "custom":
        for i, v in enumerate(values):
            lines.append(f"+Plus{i} = {old_string(v)}")
            lines.append(f"MY.My{i} = {old_string(v)}")
            expect[f"Plus{i}"] = expect[f"My{i}"] = v
    elif kind == "log":
        lines.append(f"log = /opt/rt/{joined}.log")
        expect["UserLog"] = f"/opt/rt/{joined}.log"
    else:  # pragma: no cover
        raise AssertionError(kind)
    return "\n".join([*lines, "queue", ""]), expect


KINDS = ["arguments", "environment", "executable", "input-output-error", "initialdir", "custom",
         "log"]


class Node:
    """One job store and the fetch_job executable of one slot."""

    def __init__(self, db_url: str, hook_dir: Path, condor_config: Path, tmp_path: Path) -> None:
        upgrade(db_url)
        self.store = JobStore.from_url(db_url)
        self.settings = config.Settings(keyword="JOBSTORE", database_url=db_url)
        self.env = hook_env(db_url, condor_config)
        self.hook_dir = hook_dir
        self.tmp = tmp_path
        self.owner = ordinary_owner()
        self.count = 0

    def submit(self, text: str) -> None:
        self.count += 1
        path = self.tmp / f"job{self.count}.sub"
        path.write_text(text, encoding="utf-8")
        submit_path(self.store, path, self.settings, owner=self.owner)

    def fetch(self) -> tuple[bytes, classad2.ClassAd]:
        """Run fetch_job; return its stdout and the ad read back by classad2 (old syntax)."""
        slot = (SLOT / SLOT_AD).read_bytes()
        r = run_hook(self.hook_dir, "fetch_job", slot, env=self.env)
        assert r.returncode == 0 and b"Traceback" not in r.stderr, r
        assert r.stdout, r.stderr
        return r.stdout, classad2.parseOne(r.stdout.decode("utf-8"), classad2.ParserType.Old)

    def job_count(self) -> int:
        with self.store.db.engine.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(jobs)).scalar_one()


@pytest.fixture
def node(db_url: str, hook_dir: Path, condor_config: Path, tmp_path: Path):
    n = Node(db_url, hook_dir, condor_config, tmp_path)
    yield n
    n.store.db.engine.dispose()


def value_of(ad: classad2.ClassAd, name: str, expected: object) -> object:
    """The attribute as the test expects it: words for Arguments/Environment, else the value."""
    got = ad.eval(name)
    assert type(got) is str, (name, got)
    return split_v2(got) if isinstance(expected, list) else got


def check_exact(stdout: bytes, ad: classad2.ClassAd, expect: dict[str, object]) -> None:
    """Every expected value is in the ad exactly, the hooks' own reader agrees, and each
    attribute is on its own line for any reader that splits lines."""
    for name, want in expect.items():
        assert value_of(ad, name, want) == want, name
    text = stdout.decode("utf-8")
    assert len(text.splitlines()) == len(ad), "a value spans more than one line"
    ours = classads.parse_ad(text)
    assert set(ours.keys()) == set(ad.keys())
    for name in ad:
        assert str(ours.lookup(name)) == str(ad.lookup(name)), name


def check_nothing_else(clean: classad2.ClassAd, dirty: classad2.ClassAd, changed: set) -> None:
    """Same attribute names as a clean submit; every attribute not carrying a value is equal."""
    assert {k.lower() for k in dirty} == {k.lower() for k in clean}
    for name in clean:
        if name.lower() in PER_JOB or name.lower() in changed:
            continue
        assert str(dirty.lookup(name)) == str(clean.lookup(name)), name
    for name in ("Owner", "User", "Requirements", "HookKeyword", "JobUniverse"):
        assert name not in changed
    assert dirty.eval("Owner") == clean.eval("Owner")


# ---- one test per kind ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_hostile_values_round_trip(node: Node, kind: str) -> None:
    clean_text, _ = submit_file([f"plain{i}" for i in range(len(TRICKY))], kind)
    node.submit(clean_text)
    _, clean = node.fetch()
    text, expect = submit_file(TRICKY, kind)
    node.submit(text)
    stdout, ad = node.fetch()
    check_exact(stdout, ad, expect)
    check_nothing_else(clean, ad, {n.lower() for n in expect})
    assert ad.eval("Owner") == node.owner and ad.eval("User") == f"{node.owner}@localdomain"


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("arguments = \"'a\u2028b'\"", "Arguments"),
        ("environment = \"A=x\u0085y\"", "Environment"),
        ("output = out\u2029put", "Out"),
        ('+Note = "line\u2028Owner = 1"', "Note"),
        ("arguments = \"'a\tb'\"", "arguments"),
        ("+Note = a$CHR(10)b", "Note"),
        ("transfer_input_files = a,b", "transfer_input_files"),
    ],
    ids=["line-separator", "next-line", "paragraph-separator", "custom-line-separator", "tab",
         "chr-newline", "transfer-files"],
)
def test_unsendable_values_are_refused_at_submit(node: Node, line: str, what: str) -> None:
    """Values a line-based reader would split (or old syntax cannot hold): one line, no job."""
    with pytest.raises(SubmitError) as info:
        node.submit(f"executable = /bin/true\n{line}\nqueue\n")
    message = info.value.message
    assert "\n" not in message and what.lower() in message.lower(), message
    assert node.job_count() == 0


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[ Cmd = "/bin/true"; Arguments = "\'a\\nb\'" ]', "newline"),
        ('[ Cmd = "/bin/true"; Note = "x\\n Owner = \\"root\\"" ]',
         "Note: value cannot be written on one"),
        ('[ Cmd = "/bin/tr\\nue" ]', "newline"),
        ('Cmd = "/bin/true"\nOut = "out\\"', "ends in a backslash"),
    ],
    ids=["arguments", "custom", "cmd", "trailing-backslash"],
)
def test_unsendable_classad_file_values(node: Node, text: str, why: str) -> None:
    """A new-syntax ClassAd file can spell a newline ("\\n"), an old-syntax one a string that
    ends in a backslash: refused with one line."""
    path = node.tmp / "job.ad"
    path.write_text(text + "\n")
    with pytest.raises(SubmitError) as info:
        submit_path(node.store, path, node.settings, owner=node.owner)
    assert "\n" not in info.value.message and why in info.value.message, info.value.message
    assert node.job_count() == 0


# ---- values written straight into the database ----------------------------------------------


@pytest.mark.parametrize(
    "value",
    [*TRICKY[:3], 'x"\nOwner = "root', "a\u2028Owner = 1", "tail\\", "a\rb"],
    ids=["quotes", "backslashes", "equals", "newline-injection", "line-separator",
         "trailing-backslash", "carriage-return"],
)
def test_database_values(node: Node, value: str) -> None:
    """A value put into the job row by something other than `jobstore submit`: fetch_job prints
    it exactly, or prints nothing and holds the job with a reason; never a changed attribute."""
    node.submit('executable = /bin/true\n+Note = "x"\nqueue\n')
    with node.store.db.engine.begin() as conn:
        ad = conn.execute(sa.select(jobs.c.ad)).scalar_one()
        if conn.dialect.name == "postgresql":  # past the database's own checks (a row of old)
            conn.execute(sa.text("SET LOCAL jobstore.checked = 'on'"))
        conn.execute(sa.update(jobs).values(ad={**ad, "Note": value, "Arguments": value}))
    slot = (SLOT / SLOT_AD).read_bytes()
    r = run_hook(node.hook_dir, "fetch_job", slot, env=node.env)
    assert b"Traceback" not in r.stderr and r.returncode == 0
    if r.stdout:
        text = r.stdout.decode("utf-8")
        ad = classad2.parseOne(text, classad2.ParserType.Old)
        assert ad.eval("Note") == value and ad.eval("Arguments") == value
        assert ad.eval("Owner") == node.owner and len(text.splitlines()) == len(ad)
    else:
        assert r.stderr.count(b"\n") == 1 and b"put on hold" in r.stderr
        with node.store.db.engine.connect() as conn:
            status, reason = conn.execute(sa.select(jobs.c.status, jobs.c.reason)).one()
        assert status == "held" and reason


# ---- HTCondor's submit language ---------------------------------------------------------------

# (submit value, words HTCondor's manual gives for it) for `arguments`, new syntax.
MANUAL_ARGUMENTS = [
    ('"3 simple arguments"', ["3", "simple", "arguments"]),
    ("\"one 'two with spaces' 3\"", ["one", "two with spaces", "3"]),
    ("\"one \"\"two\"\" 'spacey ''quoted'' argument'\"",
     ["one", '"two"', "spacey 'quoted' argument"]),
    ("\"'a b' c\"", ["a b", "c"]),
    ("\"''\"", [""]),
    ("\"a''b\"", ["ab"]),
    ('"  padded   words  "', ["padded", "words"]),
]
MANUAL_ENVIRONMENT = [
    ("\"one=1 two=\"\"2\"\" three='spacey ''quoted'' value'\"",
     ["one=1", 'two="2"', "three=spacey 'quoted' value"]),
    ("\"A='x y' B=\"", ["A=x y", "B="]),
]


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_new_syntax_as_htcondor_manual(node: Node) -> None:
    """`arguments` and `environment` in the new syntax give the words HTCondor's manual gives."""
    cases = [("arguments", v, w) for v, w in MANUAL_ARGUMENTS]
    cases += [("environment", v, w) for v, w in MANUAL_ENVIRONMENT]
    for command, value, _ in cases:
        text = f"executable = /bin/echo\n{command} = {value}\nqueue\n"
        # htcondor2.Submit reads the same text and keeps the value as written (Submit.jobs(),
        # which would give its job ad, is not implemented in this htcondor version).
        assert htcondor2.Submit(text).expand(command) == value
        node.submit(text)
    for command, value, words in cases:
        _, ad = node.fetch()
        attr = "Arguments" if command == "arguments" else "Environment"
        assert split_v2(ad.eval(attr)) == words, value


# ---- arbitrary strings ----------------------------------------------------------------------

# Any text a submit file can hold on one line: no control characters, no `$` (macro syntax).
SUBMITTABLE = st.text(
    st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="$"), max_size=16
)


@settings(max_examples=examples(300), deadline=None)
@given(values=st.lists(st.text(max_size=20), min_size=1, max_size=6))
def test_render_any_database_string(values: list[str]) -> None:
    """In-process: any string from the database is printed exactly on one line, or refused."""
    row = a_job(ad={"Cmd": "/bin/true", **{f"S{i}": v for i, v in enumerate(values)}},
                owner="alice", claims=1, token="0" * 32)
    try:
        text = render_job(row, keyword="JOBSTORE", uid_domain="d", job_lease_duration=60)
    except classads.AdError as exc:
        assert "\n" not in str(exc)
        return
    ad = classad2.parseOne(text, classad2.ParserType.Old)
    assert len(text.splitlines()) == len(ad)
    assert [ad.eval(f"S{i}") for i in range(len(values))] == values
    assert ad.eval("Owner") == "alice" and ad.eval("Cmd") == "/bin/true"


@settings(max_examples=4, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(SUBMITTABLE.filter(lambda s: s == s.strip() and s), min_size=1,
                       max_size=8))
def test_arbitrary_submitted_strings(node: Node, values: list[str]) -> None:
    """Arbitrary text in arguments, environment and custom attributes, through fetch_job."""
    lines = ["executable = /bin/echo", f"arguments = {v2_submit_value(values)}",
             f"environment = {v2_submit_value([f'V{i}={v}' for i, v in enumerate(values)])}"]
    lines += [f"+S{i} = {old_string(v)}" for i, v in enumerate(values)]
    before = node.job_count()
    try:
        node.submit("\n".join([*lines, "queue", ""]))
    except SubmitError as exc:  # only what a line-based reader would split
        assert "\n" not in exc.message and node.job_count() == before
        assert any(len(f"a{v}b".splitlines()) > 1 for v in values), exc.message
        return
    stdout, ad = node.fetch()
    expect: dict[str, object] = {"Arguments": values,
                                 "Environment": [f"V{i}={v}" for i, v in enumerate(values)]}
    expect.update({f"S{i}": v for i, v in enumerate(values)})
    check_exact(stdout, ad, expect)
    assert ad.eval("Cmd") == "/bin/echo" and ad.eval("Owner") == node.owner
    assert os.path.basename(ad.eval("Cmd")) == "echo"


@given(st.text(alphabet=st.characters(max_codepoint=0x2030), max_size=40))
@settings(max_examples=examples(400), deadline=None)
def test_the_fast_and_the_remembered_render_line_say_what_classad2_says(value: str) -> None:
    """render_line's shortcuts (plain strings written directly, short lines remembered) give
    exactly the line, or the refusal, that asking classad2 gives."""
    from jobstore.formats import classads

    def outcome(fn: Any, *args: Any) -> str:
        try:
            return fn(*args)
        except classads.AdError:
            return "refused"

    slow = outcome(classads._render_line, "Arguments", "str", value)
    assert outcome(classads.render_line, "Arguments", value) == slow
    assert outcome(classads.render_line, "Arguments", value) == slow  # now from the cache
    number = (-1) ** len(value) * 7 ** len(value)  # up to 7**40: past the 64-bit range
    if -(2**63) <= number < 2**63:
        assert classads.render_line("ProcId", number) == classads._render_line(
            "ProcId", "int", number)
    else:
        assert outcome(classads.render_line, "ProcId", number) == "refused"
    expr = outcome(classads._render_line, "Requirements", "Expr", classads.Expr(value))
    assert outcome(classads.render_line, "Requirements", classads.Expr(value)) == expr
