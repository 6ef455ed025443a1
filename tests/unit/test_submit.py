"""Tests for jobstore.submit: submit descriptions and plain ClassAd files -> JobSpec."""

from __future__ import annotations

from pathlib import Path

import classad2
import pytest
from argsplit import split_v2
from examples import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobstore.core.jobs import JobSpec
from jobstore.submit import (
    MAX_PROCS,
    SubmitError,
    load_jobs,
    parse_classad_file,
    parse_submit_file,
    parse_submit_text,
)

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def to_v2_quoted(words: list[str]) -> str:
    """Write words as a submit-file new-syntax ``arguments`` value (outer double quotes)."""
    parts = []
    for w in words:
        if not w or " " in w or "'" in w:
            w = "'" + w.replace("'", "''") + "'"
        parts.append(w)
    return '"' + " ".join(parts).replace('"', '""') + '"'


def write(tmp_path: Path, text: str, name: str = "job.sub") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def one(tmp_path: Path, body: str) -> JobSpec:
    """Parse ``executable = /bin/true`` + body + ``queue`` and return the single job."""
    jobs = parse_submit_file(write(tmp_path, f"executable = /bin/true\n{body}\nqueue\n"))
    assert len(jobs) == 1
    return jobs[0]


def submit_error(tmp_path: Path, text: str) -> str:
    with pytest.raises(SubmitError) as info:
        parse_submit_file(write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message
    assert "job.sub" in message
    return message


# --------------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------------


def test_minimal_defaults(tmp_path: Path) -> None:
    job = one(tmp_path, "")
    assert job == JobSpec(cmd="/bin/true", iwd=str(tmp_path), proc_id=0)
    assert job.request_memory == 128 and job.request_disk == 1024 and job.custom == {}


def test_executable_relative_to_initialdir(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "run.sh").touch()
    jobs = parse_submit_file(write(tmp_path, "Executable = bin/run.sh\nqueue\n"))
    assert jobs[0].cmd == str(tmp_path / "bin" / "run.sh")
    (tmp_path / "work").mkdir()
    job = one(tmp_path, "initialdir = work\nexecutable = ../x/run\ntransfer_executable = false")
    assert job.iwd == str(tmp_path / "work")
    assert job.cmd == str(tmp_path / "x" / "run")


def test_initialdir_absolute_and_alias(tmp_path: Path) -> None:
    assert one(tmp_path, "initialdir = /srv/data").iwd == "/srv/data"
    assert one(tmp_path, "initial_dir = sub").iwd == str(tmp_path / "sub")


def test_arguments_new_syntax(tmp_path: Path) -> None:
    job = one(tmp_path, """arguments = "one 'two three' ""four"" 'it''s' ''" """)
    assert split_v2(job.args) == ["one", "two three", '"four"', "it's", ""]


def test_arguments_old_syntax(tmp_path: Path) -> None:
    job = one(tmp_path, r"arguments = a  b=c \"q\" it's x\y")
    assert split_v2(job.args) == ["a", "b=c", '"q"', "it's", "x\\y"]


def test_arguments_old_syntax_unescaped_quote(tmp_path: Path) -> None:
    message = submit_error(tmp_path, 'executable = /bin/true\narguments = a"b\nqueue\n')
    assert "arguments" in message and "double quote" in message


def test_arguments_bad_new_syntax(tmp_path: Path) -> None:
    message = submit_error(tmp_path, 'executable = /bin/true\narguments = "a \'b"\nqueue\n')
    assert "arguments" in message and "unterminated single quote" in message
    message = submit_error(tmp_path, 'executable = /bin/true\narguments = "a" b\nqueue\n')
    assert "arguments" in message and "after the closing double quote" in message


def test_arguments_trailing_backslash_is_quoted(tmp_path: Path) -> None:
    job = one(tmp_path, r'arguments = "a b\"')
    assert not job.args.endswith("\\")
    assert split_v2(job.args) == ["a", "b\\"]


def test_environment_new_syntax(tmp_path: Path) -> None:
    job = one(tmp_path, """environment = "A=1 B='x y' C=""q"" D=" """)
    assert split_v2(job.env) == ["A=1", "B=x y", 'C="q"', "D="]


def test_environment_old_syntax_and_alias(tmp_path: Path) -> None:
    assert split_v2(one(tmp_path, "environment = A=1;B=two words; C=3").env) == [
        "A=1",
        "B=two words",
        "C=3",
    ]
    assert one(tmp_path, "env = X=1").env == "X=1"


def test_environment_bad_entry(tmp_path: Path) -> None:
    message = submit_error(tmp_path, "executable = /bin/true\nenvironment = A=1;oops\nqueue\n")
    assert "environment" in message and "'oops'" in message
    message = submit_error(tmp_path, 'executable = /bin/true\nenvironment = "=1"\nqueue\n')
    assert "environment" in message and "NAME=value" in message


def test_input_output_error_kept_as_given(tmp_path: Path) -> None:
    job = one(tmp_path, "input = in.txt\noutput = out/$(Process).out\nerror = /abs/err")
    assert (job.input, job.output, job.error) == ("in.txt", "out/0.out", "/abs/err")


def test_request_cpus(tmp_path: Path) -> None:
    assert one(tmp_path, "request_cpus = 4").request_cpus == 4
    assert one(tmp_path, "RequestCpus = 2").request_cpus == 2
    for bad, words in [("0", "at least 1"), ("-2", "at least 1"), ("two", "not an integer")]:
        message = submit_error(tmp_path, f"executable = /bin/true\nrequest_cpus = {bad}\nqueue\n")
        assert "request_cpus" in message and words in message


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        ("100", 100),
        ("1.5", 2),
        ("512K", 1),
        ("1536 KB", 2),
        ("1m", 1),
        ("100MB", 100),
        ("1G", 1024),
        ("1.5gb", 1536),
        ("2T", 2 * 1024 * 1024),
        ("1tb", 1024 * 1024),
        ("0", 0),
    ],
)
def test_request_memory_units(tmp_path: Path, value: str, mib: int) -> None:
    assert one(tmp_path, f"request_memory = {value}").request_memory == mib


@pytest.mark.parametrize(
    ("value", "kib"),
    [
        ("100", 100),
        ("1.2", 2),
        ("1K", 1),
        ("10KB", 10),
        ("1M", 1024),
        ("2mb", 2048),
        ("1G", 1024 * 1024),
        ("1GB", 1024 * 1024),
        ("1T", 1024**3),
        ("1TB", 1024**3),
    ],
)
def test_request_disk_units(tmp_path: Path, value: str, kib: int) -> None:
    assert one(tmp_path, f"request_disk = {value}").request_disk == kib


@pytest.mark.parametrize(
    ("command", "value", "words"),
    [
        ("request_memory", "1X", "unknown unit 'X'"),
        ("request_memory", "1 PB", "unknown unit 'PB'"),
        ("request_memory", "-5", "not a non-negative size"),
        ("request_disk", "lots", "not a non-negative size"),
        ("request_disk", "1.2.3G", "not a non-negative size"),
    ],
)
def test_bad_sizes(tmp_path: Path, command: str, value: str, words: str) -> None:
    message = submit_error(tmp_path, f"executable = /bin/true\n{command} = {value}\nqueue\n")
    assert command in message and words in message


def test_requirements(tmp_path: Path) -> None:
    job = one(tmp_path, 'requirements = TARGET.Memory > 1024 && OpSys == "LINUX"')
    assert job.requirements == 'TARGET.Memory > 1024 && OpSys == "LINUX"'
    classad2.ExprTree(job.requirements)
    message = submit_error(tmp_path, "executable = /bin/true\nrequirements = Memory >\nqueue\n")
    assert "requirements" in message and "not a valid ClassAd expression" in message


def test_old_syntax_backslash_in_expression_string(tmp_path: Path) -> None:
    job = one(tmp_path, r'requirements = Path == "C:\dir"')
    assert job.requirements is not None
    assert classad2.ExprTree(job.requirements.split("== ", 1)[1]).eval() == "C:\\dir"


def test_priority_retries_exit_code(tmp_path: Path) -> None:
    job = one(tmp_path, "priority = -5\nmax_retries = 3\nsuccess_exit_code = 2")
    assert (job.priority, job.max_retries, job.success_exit_code) == (-5, 3, 2)
    assert one(tmp_path, "max_retries = 0").max_retries == 0


def test_accounting_group_and_concurrency_limits(tmp_path: Path) -> None:
    job = one(tmp_path, "accounting_group = group_physics\naccounting_group_user = alice\n"
                        "concurrency_limits = XSW, small.db:2")
    assert (job.accounting_group, job.accounting_group_user) == ("group_physics", "alice")
    assert job.concurrency_limits == "small.db:2,xsw"
    assert one(tmp_path, "").concurrency_limits is None


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("concurrency_limits = xsw:0", "concurrency_limits: concurrency limit 'xsw:0'"),
        ("concurrency_limits = a b", "concurrency_limits: bad concurrency limit name"),
        ('accounting_group = a"b', "accounting_group: accounting_group 'a\"b' is not a valid name"),
        ("+AccountingGroup = \"x.y\"", "+AccountingGroup"),
        ("+ConcurrencyLimits = \"x\"", "+ConcurrencyLimits"),
    ],
)
def test_bad_accounting_and_limits(tmp_path: Path, body: str, words: str) -> None:
    assert words in submit_error(tmp_path, f"executable = /bin/true\n{body}\nqueue\n")


def test_policy_commands_set_htcondor_attributes(tmp_path: Path) -> None:
    job = one(tmp_path, "periodic_hold = NumJobStarts > 2\nperiodic_hold_reason = \"many\"\n"
                        "periodic_hold_subcode = 3\nperiodic_release = true\n"
                        "periodic_remove = JobStatus == 5\non_exit_hold = ExitCode != 0\n"
                        "on_exit_hold_reason = \"bad\"\non_exit_hold_subcode = 2\n"
                        "on_exit_remove = ExitCode == 0\nallowed_execute_duration = 60\n"
                        "allowed_job_duration = 3600")
    assert job.custom == {
        "PeriodicHold": "NumJobStarts > 2", "PeriodicHoldReason": '"many"',
        "PeriodicHoldSubCode": "3", "PeriodicRelease": "true", "PeriodicRemove": "JobStatus == 5",
        "OnExitHold": "ExitCode != 0", "OnExitHoldReason": '"bad"', "OnExitHoldSubCode": "2",
        "OnExitRemove": "ExitCode == 0", "AllowedExecuteDuration": "60",
        "AllowedJobDuration": "3600",
    }
    message = submit_error(tmp_path, "executable = /bin/true\nperiodic_remove = JobStatus >\n"
                                     "queue\n")
    assert "periodic_remove: 'JobStatus >' is not a valid ClassAd expression" in message


def test_classad_file_accounting_and_limits(tmp_path: Path) -> None:
    text = ('Cmd = "/bin/true"\nAccountingGroup = "physics.bob"\n'
            'ConcurrencyLimits = "Lic:3"\n\nCmd = "/bin/true"\nAcctGroup = "chem"\n')
    first, second = parse_classad_file(write(tmp_path, text, "jobs.ad"))
    assert (first.accounting_group, first.accounting_group_user) == ("physics", "bob")
    assert first.concurrency_limits == "lic:3"
    assert (second.accounting_group, second.accounting_group_user) == ("chem", None)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("priority = high", "priority: 'high' is not an integer"),
        ("max_retries = -1", "max_retries: must be at least 0"),
        ("max_retries = 1.5", "max_retries: '1.5' is not an integer"),
        ("success_exit_code = x", "success_exit_code: 'x' is not an integer"),
    ],
)
def test_bad_integers(tmp_path: Path, body: str, words: str) -> None:
    assert words in submit_error(tmp_path, f"executable = /bin/true\n{body}\nqueue\n")


def test_retry_until(tmp_path: Path) -> None:
    assert one(tmp_path, "retry_until = 3").retry_until == "ExitCode == 3"
    assert one(tmp_path, "retry_until = ExitCode > 10").retry_until == "ExitCode > 10"
    message = submit_error(tmp_path, "executable = /bin/true\nretry_until = ExitCode >\nqueue\n")
    assert "retry_until" in message and "ClassAd expression" in message


def test_log_absolute_against_iwd(tmp_path: Path) -> None:
    job = one(tmp_path, "initialdir = /data\nlog = logs/job.log")
    assert job.user_log == "/data/logs/job.log"
    assert one(tmp_path, "log = /var/log/x.log").user_log == "/var/log/x.log"


def test_custom_attributes(tmp_path: Path) -> None:
    job = one(tmp_path, '+Project = "physics"\nMY.Weight = 2 * 3\n+Flag = true\nmy.lower = 1')
    assert job.custom == {"Project": '"physics"', "Weight": "2 * 3", "Flag": "true", "lower": "1"}


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("+Foo = 1 +", "+Foo: '1 +' is not a valid ClassAd expression"),
        ("+Foo.Bar = 1", "not a valid identifier"),
        ("+1abc = 1", "not a valid identifier"),
        ('+JobstoreToken = "x"', "reserved for the job store"),
        ("+RequestMemory = 5", "use the command instead"),
    ],
)
def test_bad_custom_attributes(tmp_path: Path, body: str, words: str) -> None:
    assert words in submit_error(tmp_path, f"executable = /bin/true\n{body}\nqueue\n")


def test_macros_and_commands_that_ask_for_nothing_are_accepted(tmp_path: Path) -> None:
    job = one(tmp_path, "notification = never\nshould_transfer_files = IF_NEEDED\nfoo = bar")
    assert job.cmd == "/bin/true" and job.inputs == ()  # IF_NEEDED: the shared file system


def test_universe(tmp_path: Path) -> None:
    assert one(tmp_path, "universe = Vanilla").cmd == "/bin/true"
    message = submit_error(tmp_path, "executable = /bin/true\nuniverse = docker\nqueue\n")
    assert "universe" in message and "'docker' is not supported" in message


def test_file_transfer_fills_the_sandbox(tmp_path: Path) -> None:
    """The inputs (files, a directory's files, the executable, the standard input)
    are what the sandbox starts with; condor_submit's attributes say what travels."""
    message = submit_error(tmp_path, "executable = /bin/true\ntransfer_input_files = a\nqueue\n")
    assert "transfer_input_files: a: no such file or directory" in message
    assert one(tmp_path, "transfer_input_files =").inputs == ()
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.csv").write_text("x")
    (tmp_path / "in.dat").write_text("stdin")
    job = one(tmp_path, "should_transfer_files = YES\ntransfer_input_files = a.txt, d, d/\n"
                        "input = in.dat\ntransfer_output_files = out.txt")
    assert [(f.name, f.source) for f in job.inputs] == [
        ("a.txt", f"{tmp_path}/a.txt"), ("d/x.csv", f"{tmp_path}/d/x.csv"),
        ("x.csv", f"{tmp_path}/d/x.csv"), ("true", "/bin/true"), ("in.dat", f"{tmp_path}/in.dat")]
    assert job.inputs[3].mode & 0o100
    assert job.custom["ShouldTransferFiles"] == '"YES"'
    assert job.custom["TransferInput"] == '"a.txt, d, d/"'
    assert job.custom["TransferOutput"] == '"out.txt"'
    job = one(tmp_path, "should_transfer_files = YES\nwhen_to_transfer_output = ON_EXIT_OR_EVICT\n"
                        "checkpoint_exit_code = 85\ntransfer_checkpoint_files = ckpt/a.dat")
    assert job.custom["WhenToTransferOutput"] == '"ON_EXIT_OR_EVICT"'
    assert (job.custom["CheckpointExitCode"], job.custom["TransferCheckpoint"]) == (
        "85", '"ckpt/a.dat"')
    message = submit_error(tmp_path, "executable = /bin/true\ncheckpoint_exit_code = 85\nqueue\n")
    assert "checkpoint_exit_code: needs file transfer" in message
    message = submit_error(tmp_path, "executable = /bin/true\nshould_transfer_files = YES\n"
                           "transfer_checkpoint_files = ../x\nqueue\n")
    assert "transfer_checkpoint_files: ../x: an output may not leave the sandbox" in message


def test_extra_vars(tmp_path: Path) -> None:
    path = write(tmp_path, "executable = /bin/$(prog)\narguments = $(n)\nqueue $(n)\n")
    jobs = parse_submit_file(path, extra_vars={"prog": "echo", "n": "2"})
    assert [j.cmd for j in jobs] == ["/bin/echo", "/bin/echo"]
    with pytest.raises(SubmitError, match="not a valid identifier"):
        parse_submit_file(path, extra_vars={"bad name": "1"})


def test_missing_executable_is_refused_unless_not_transferred(tmp_path: Path) -> None:
    """As condor_submit: an executable that is not on the submit machine is an error, unless
    the submit file says it exists only on the execute nodes."""
    message = submit_error(tmp_path, "executable = /no/such/run\nqueue\n")
    assert "executable: /no/such/run does not exist here" in message
    assert "transfer_executable = false" in message
    for no in ("false", "False", "no", "0"):
        assert one(tmp_path, f"executable = /x/run\ntransfer_executable = {no}").cmd == "/x/run"


def test_parse_submit_text(tmp_path: Path) -> None:
    jobs = parse_submit_text("executable = run\ntransfer_executable = false\nqueue 2\n",
                             base_dir=tmp_path)
    assert [(j.cmd, j.proc_id) for j in jobs] == [
        (str(tmp_path / "run"), 0),
        ((str(tmp_path / "run")), 1),
    ]
    with pytest.raises(SubmitError, match="does not exist"):
        parse_submit_text("executable = run\nqueue\n", base_dir=tmp_path / "nope")


# --------------------------------------------------------------------------------------------
# queue statements and macros
# --------------------------------------------------------------------------------------------


def procs(tmp_path: Path, queue: str, body: str = "arguments = $(Process)") -> list[JobSpec]:
    return list(parse_submit_file(
        write(tmp_path, f"executable = /bin/echo\n{body}\n{queue}\n")))


def test_queue_plain_and_count(tmp_path: Path) -> None:
    assert len(procs(tmp_path, "queue")) == 1
    jobs = procs(tmp_path, "Queue 3")
    assert [j.proc_id for j in jobs] == [0, 1, 2]
    assert [j.args for j in jobs] == ["0", "1", "2"]
    assert len(procs(tmp_path, "queue 2*3")) == 6


def test_queue_in(tmp_path: Path) -> None:
    jobs = procs(tmp_path, "queue x in (a, b, c)", "arguments = $(x) $(Process)")
    assert [j.args for j in jobs] == ["a 0", "b 1", "c 2"]


def test_queue_in_multiline(tmp_path: Path) -> None:
    jobs = procs(tmp_path, "queue name in (\n  alpha\n  beta\n)", "output = $(name).out")
    assert [j.output for j in jobs] == ["alpha.out", "beta.out"]


def test_queue_default_item(tmp_path: Path) -> None:
    jobs = procs(tmp_path, "queue in (p, q)", "arguments = $(Item)")
    assert [j.args for j in jobs] == ["p", "q"]


def test_queue_count_with_items(tmp_path: Path) -> None:
    jobs = procs(tmp_path, "queue 2 x in (a, b)", "arguments = $(x) $(Process) $(Step) $(Row)")
    assert [j.args for j in jobs] == ["a 0 0 0", "a 1 1 0", "b 2 0 1", "b 3 1 1"]
    assert [j.proc_id for j in jobs] == [0, 1, 2, 3]


def test_queue_from_file(tmp_path: Path) -> None:
    (tmp_path / "items.txt").write_text("a 1\nb 2\n")
    jobs = procs(tmp_path, "queue x,y from items.txt", "arguments = $(y) $(x)")
    assert [j.args for j in jobs] == ["1 a", "2 b"]


def test_queue_from_inline(tmp_path: Path) -> None:
    jobs = procs(tmp_path, "queue x,y from (\n a 1\n b 2\n)", "arguments = $(x)$(y)")
    assert [j.args for j in jobs] == ["a1", "b2"]


def test_queue_matching(tmp_path: Path) -> None:
    for name in ("one.txt", "two.txt", "other.dat"):
        (tmp_path / name).write_text("")
    jobs = procs(tmp_path, "queue f matching *.txt", "input = $(f)")
    assert sorted(j.input or "" for j in jobs) == ["one.txt", "two.txt"]


def test_macros(tmp_path: Path) -> None:
    body = (
        "base = /data\nprog = sim\n"
        "arguments = $(prog) $(base)/$(ProcId)\noutput = $(prog).$(Process)"
    )
    jobs = procs(tmp_path, "queue 2", body)
    assert [(j.args, j.output) for j in jobs] == [
        ("sim /data/0", "sim.0"),
        ("sim /data/1", "sim.1"),
    ]


def test_bad_macro(tmp_path: Path) -> None:
    message = submit_error(tmp_path, "executable = /bin/true\narguments = $INT(zz)\nqueue\n")
    assert "arguments" in message and "cannot expand the macros in '$INT(zz)'" in message


def test_cluster_macro_rejected(tmp_path: Path) -> None:
    message = submit_error(tmp_path, "executable = /bin/true\noutput = o.$(Cluster)\nqueue\n")
    assert "output" in message and "$(Cluster)" in message


@pytest.mark.parametrize(
    ("queue", "words"),
    [
        ("queue abc", "count 'abc' is not an integer"),
        ("queue 1.5", "count '1.5' is not an integer"),
        ("queue -1", "queue"),
        ("queue 0", "produces no jobs"),
        ("queue x matching *.nothing", "produces no jobs"),
        (f"queue {MAX_PROCS + 1}", f"limit of {MAX_PROCS}"),
        ("queue 50001 x in (a, b)", f"limit of {MAX_PROCS}"),
        ("queue x from missing.txt", "missing.txt"),
        ("queue x from seq 1 3 |", "command"),
        ("queue x in (\na\n", "closing"),
        ("queue\nqueue 2", "only one queue statement"),
    ],
)
def test_bad_queue(tmp_path: Path, queue: str, words: str) -> None:
    assert words in submit_error(tmp_path, f"executable = /bin/true\n{queue}\n")


def test_max_procs_allowed(tmp_path: Path) -> None:
    assert len(procs(tmp_path, f"queue {MAX_PROCS}", "")) == MAX_PROCS


# --------------------------------------------------------------------------------------------
# bad input files and values
# --------------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="no such file"):
        parse_submit_file(tmp_path / "missing.sub")
    with pytest.raises(SubmitError, match="is a directory"):
        parse_submit_file(tmp_path)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "job.sub"
    path.write_bytes(b"executable = /bin/\xff\nqueue\n")
    with pytest.raises(SubmitError, match="not UTF-8"):
        parse_submit_file(path)


def test_unreadable(tmp_path: Path) -> None:
    path = write(tmp_path, "executable = /bin/true\nqueue\n")
    path.chmod(0)
    try:
        if path.open("rb"):  # root can read anything
            pytest.skip("running as root")
    except PermissionError:
        with pytest.raises(SubmitError, match="cannot read"):
            parse_submit_file(path)
    finally:
        path.chmod(0o644)


def test_syntax_error_names_line(tmp_path: Path) -> None:
    message = submit_error(tmp_path, "executable = /bin/true\nthis is junk\nqueue\n")
    assert "syntax error" in message and "line 2" in message


def test_missing_executable(tmp_path: Path) -> None:
    message = submit_error(tmp_path, "arguments = x\nqueue\n")
    assert "executable" in message and "missing" in message


def test_missing_queue(tmp_path: Path) -> None:
    assert "no queue statement" in submit_error(tmp_path, "executable = /bin/true\n")


def test_control_character(tmp_path: Path) -> None:
    message = submit_error(tmp_path, "executable = /bin/true\narguments = a\x01b\nqueue\n")
    assert "line 2" in message and "control character" in message


def test_control_character_from_items(tmp_path: Path) -> None:
    (tmp_path / "items.txt").write_text("a\tb\n")
    body = "executable = /bin/true\noutput = $(x)\nqueue x from items.txt\n"
    message = submit_error(tmp_path, body)
    assert "output" in message and "control character" in message


def test_tab_in_new_syntax_argument(tmp_path: Path) -> None:
    message = submit_error(tmp_path, "executable = /bin/true\narguments = \"'a\tb'\"\nqueue\n")
    assert "arguments" in message and "control character" in message


def test_trailing_backslash(tmp_path: Path) -> None:
    path = write(tmp_path, "executable = /bin/true\nlog = $(d)\nqueue\n")
    with pytest.raises(SubmitError, match="log: ends in a backslash"):
        parse_submit_file(path, extra_vars={"d": "x\\"})


def test_line_continuation(tmp_path: Path) -> None:
    job = one(tmp_path, "arguments = a \\\n  b\nrequirements = true && \\\n queue")
    assert (job.args, job.requirements) == ("a b", "true && queue")


def test_include_command_rejected(tmp_path: Path) -> None:
    message = submit_error(
        tmp_path, "include command : echo x=1 |\nexecutable = /bin/true\nqueue\n"
    )
    assert "include" in message


def test_crlf_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "job.sub"
    path.write_bytes(b"\xef\xbb\xbfexecutable = /bin/true\r\narguments = a b\r\nqueue\r\n")
    assert parse_submit_file(path)[0].args == "a b"


# --------------------------------------------------------------------------------------------
# plain ClassAd files
# --------------------------------------------------------------------------------------------

OLD_ADS = """\
# two jobs
Cmd = "/bin/echo"
Arguments = "hello 'big world'"
Environment = "A=1 B='x y'"
Iwd = "/data"
In = "in.txt"
Out = "out.txt"
Err = "err.txt"
RequestCpus = 2
RequestMemory = 512
RequestDisk = 2048
Requirements = TARGET.Memory >= 512
JobPrio = 5
MaxRetries = 2
SuccessExitCode = 1
RetryUntil = 7
UserLog = "job.log"
Project = "physics"
Weight = 2 * 3

Cmd = "run"
Args = "a b"
Env = "X=1;Y=2"
WinPath = "C:\\dir"
"""


def test_classad_old_syntax(tmp_path: Path) -> None:
    first, second = parse_classad_file(write(tmp_path, OLD_ADS, "jobs.ad"))
    assert first == JobSpec(
        cmd="/bin/echo",
        args="hello 'big world'",
        env="A=1 'B=x y'",
        iwd="/data",
        input="in.txt",
        output="out.txt",
        error="err.txt",
        request_cpus=2,
        request_memory=512,
        request_disk=2048,
        requirements="TARGET.Memory >= 512",
        priority=5,
        max_retries=2,
        success_exit_code=1,
        retry_until="ExitCode == 7",
        user_log="/data/job.log",
        custom={"Project": '"physics"', "Weight": "2 * 3"},
        proc_id=0,
    )
    assert second.cmd == str(tmp_path / "run") and second.iwd == str(tmp_path)
    assert (second.args, second.env, second.proc_id) == ("a b", "X=1 Y=2", 1)
    assert classad2.ExprTree(second.custom["WinPath"]).eval() == "C:\\dir"


def test_classad_new_syntax(tmp_path: Path) -> None:
    text = """
    // comment
    [ Cmd = "/bin/echo"; Arguments = "x"; RequestMemory = 64; Tags = { "a", "b" };
      Nested = [ a = 1 ]; Requirements = Memory > 10 ]
    [ Cmd = "/bin/true"; JobPrio = -1 ]
    """
    first, second = parse_classad_file(write(tmp_path, text, "jobs.ad"))
    assert (first.cmd, first.args, first.request_memory) == ("/bin/echo", "x", 64)
    assert first.requirements == "Memory > 10"
    assert set(first.custom) == {"Tags", "Nested"}
    assert "\n" not in first.custom["Tags"] and "\n" not in first.custom["Nested"]
    assert classad2.ExprTree(first.custom["Tags"]).eval() == ["a", "b"]
    assert (second.cmd, second.priority, second.proc_id) == ("/bin/true", -1, 1)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('Args = "x"\n', "Cmd: missing"),
        ('Cmd = "/bin/x"\nthis is junk\n', "line 2"),
        ('Cmd = "/bin/x"\nFoo = 1 +\n', "line 2"),
        ("Cmd = 3\n", "Cmd: must be a string"),
        ('Cmd = "/bin/x"\nRequestCpus = "many"\n', "RequestCpus: must be an integer"),
        ('Cmd = "/bin/x"\nRequestCpus = 0\n', "RequestCpus: must be at least 1"),
        ('Cmd = "/bin/x"\nRequestCpus = Foo\n', "RequestCpus: must be an integer"),
        ('Cmd = "/bin/x"\nMaxRetries = -1\n', "MaxRetries: must not be negative"),
        ('Cmd = "/bin/x"\nRequestDisk = -1\n', "RequestDisk: must not be negative"),
        ('Cmd = "/bin/x"\nRequestMemory = true\n', "RequestMemory: must be an integer"),
        ('Cmd = "/bin/x"\nOut = "dir\\\\"\n', "Out: ends in a backslash"),
        ('Cmd = "/bin/x"\nJobstoreJobId = 3\n', "reserved for the job store"),
        ('[ Cmd = "/bin/x"; ', "missing ']'"),
        ('[ Cmd = "/bin/x"; Foo = 1 + ]', "invalid new-syntax ClassAd"),
        ('[ Cmd = "/bin/x" ] junk', "unexpected text"),
        ("[ Cmd = \"/bin/x\"; 'a b' = 1 ]", "not a valid identifier"),
        ("", "no ClassAds"),
    ],
)
def test_bad_classad_files(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(SubmitError) as info:
        parse_classad_file(write(tmp_path, text, "jobs.ad"))
    assert words in str(info.value)
    assert "jobs.ad" in str(info.value)


# --------------------------------------------------------------------------------------------
# load_jobs
# --------------------------------------------------------------------------------------------


def test_load_jobs_picks_format(tmp_path: Path) -> None:
    old = write(tmp_path, '# c\nCmd = "/bin/echo"\nArgs = "a"\n', "old.ad")
    new = write(tmp_path, '\n# c\n[ Cmd = "/bin/echo" ]\n', "new.ad")
    sub = write(tmp_path, "executable = /bin/echo\nqueue 2\n", "job.sub")
    assert [j.cmd for j in load_jobs(old)] == ["/bin/echo"]
    assert [j.cmd for j in load_jobs(new)] == ["/bin/echo"]
    assert len(load_jobs(sub)) == 2


def test_load_jobs_name_value_without_cmd_is_submit(tmp_path: Path) -> None:
    path = write(tmp_path, 'executable = "x"\nrequest_cpus = 2\n', "job.sub")
    with pytest.raises(SubmitError, match="no queue statement"):
        load_jobs(path)


def test_load_jobs_broken_classad_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'Cmd = "/bin/echo"\nFoo = 1 +\n', "jobs.ad")
    with pytest.raises(SubmitError, match="line 2"):
        load_jobs(path)


def test_load_jobs_missing(tmp_path: Path) -> None:
    with pytest.raises(SubmitError, match="no such file"):
        load_jobs(tmp_path / "nope")


# --------------------------------------------------------------------------------------------
# property: new-syntax arguments round-trip
# --------------------------------------------------------------------------------------------

WORD_CHARS = st.characters(
    blacklist_categories=("Cc", "Cs"),
    blacklist_characters="$",
)
WORDS = st.lists(
    st.one_of(
        st.text(WORD_CHARS, max_size=12),
        st.sampled_from(["'", '"', "\\", "=", " ", "a=b", "x\\y", "''", '""', "é", "日本"]),
    ),
    max_size=8,
)


@settings(
    max_examples=examples(200), deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(words=WORDS)
def test_arguments_round_trip(tmp_path: Path, words: list[str]) -> None:
    text = f"executable = /bin/echo\narguments = {to_v2_quoted(words)}\nqueue\n"
    (job,) = parse_submit_text(text, base_dir=tmp_path)
    assert split_v2(job.args) == words
    assert not job.args.endswith("\\")


@pytest.mark.slow  # (make test's time: runs with make test-slow)
def test_a_big_queue_is_made_one_job_at_a_time(tmp_path: Path) -> None:
    """`queue 100000` parses at once and holds no 100,000 specs: reading them all keeps the
    memory of a few (tracemalloc's peak), and each is the proc it should be."""
    import tracemalloc

    path = write(tmp_path, "executable = /bin/echo\narguments = job $(Process)\nqueue 100000\n")
    tracemalloc.start()
    try:
        jobs = parse_submit_file(path)
        assert len(jobs) == 100_000
        seen = 0
        for proc, job in enumerate(jobs):
            if proc in (0, 99_999):
                assert (job.proc_id, job.args) == (proc, f"job {proc}")
            seen += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seen == 100_000
    assert peak < 20 * 1024 * 1024, peak  # a list of them all took 48 MB
    assert jobs[-1].proc_id == 99_999 and [j.proc_id for j in jobs[5:8]] == [5, 6, 7]


def test_a_late_bad_proc_rolls_the_whole_submit_back(tmp_path: Path, store) -> None:  # type: ignore[no-untyped-def]
    """A proc whose expansion fails far into the queue: nothing of the cluster is queued."""
    from sqlalchemy import func, select

    from jobstore.db.schema import clusters, jobs

    rows = "\n".join(["64"] * 2500 + ["lots"])
    path = write(tmp_path, "executable = /bin/true\nrequest_memory = $(m)\n"
                           f"queue m from (\n{rows}\n)\n")
    specs = parse_submit_file(path)
    assert len(specs) == 2501
    with pytest.raises(SubmitError, match=r"proc 2500\).*request_memory"):
        store.submissions.submit(specs, owner="alice", queue="default", max_attempts=3)
    with store.db.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(jobs)).scalar_one() == 0
        assert conn.execute(select(func.count()).select_from(clusters)).scalar_one() == 0
