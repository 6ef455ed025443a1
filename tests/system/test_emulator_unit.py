"""Unit tests of the execute-node emulator, driven by tiny shell hooks."""

from __future__ import annotations

import os
import re
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from jobstore.emulator import Emulator, EmulatorConfig, EmulatorReport
from jobstore.emulator.classad_wire import parse_fetch_output, parse_job_ad, sprint_ad
from jobstore.emulator.jobproc import parse_args_v2, parse_env_v1, parse_env_v2
from jobstore.emulator.spawn import check_hook_path

# FETCH_WORK: hand out the files $QUEUE/*.ad in name order, one per call, atomically.
FETCH = r"""#!/bin/sh
for f in "$QUEUE"/*.ad; do
  [ -e "$f" ] || exit 0
  if mv "$f" "$f.taken" 2>/dev/null; then cat "$f.taken"; exit 0; fi
done
"""
# Records what the hook saw (blocked signals, open fds) into $PROBE/<hook>.<pid>.
PROBE = r"""#!/bin/sh
name=$(basename "$0")
s=""
for fd in 0 1 2; do
  if [ -e /proc/$$/fd/$fd ]; then s="$s fd$fd=open"; else s="$s fd$fd=closed"; fi
done
# read with builtins only: while dash waits for a child its mask is sigsuspend's
while read -r key value; do
  case "$key" in SigBlk:|SigIgn:) s="$s $key $value";; esac
done < /proc/$$/status
echo "$s" > "$PROBE/$name.$$" 2>/dev/null
cat > /dev/null
"""
PREPARE = PROBE + 'echo "HookPrepared = true"\n'


def write_hook(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, Path]:
    dirs = {name: tmp_path / name for name in ("hooks", "queue", "probe", "work", "iwd")}
    for d in dirs.values():
        d.mkdir()
        d.chmod(0o755)
    return dirs


def make_config(env: dict[str, Path], **overrides: object) -> EmulatorConfig:
    hooks_dir = env["hooks"]
    hooks = {
        "FETCH_WORK": write_hook(hooks_dir / "fetch_work", FETCH),
        "REPLY_FETCH": write_hook(hooks_dir / "reply_fetch", PROBE),
        "PREPARE_JOB": write_hook(hooks_dir / "prepare_job", PREPARE),
        "UPDATE_JOB_INFO": write_hook(hooks_dir / "update_job_info", PROBE),
        "JOB_EXIT": write_hook(hooks_dir / "job_exit", PROBE),
    }
    hooks.update(overrides.pop("hooks", {}))  # type: ignore[arg-type,call-overload]
    values: dict[str, object] = {
        "hooks": hooks,
        "work_dir": str(env["work"]),
        "static_slots": 1,
        "cpus": 1,
        "memory": 1024,
        "disk": 1_000_000,
        "min_rearm": 0.2,
        "initial_update_interval": 0.3,
        "update_interval": 0.3,
        "env": {"QUEUE": str(env["queue"]), "PROBE": str(env["probe"]), "PATH": "/usr/bin:/bin"},
    }
    values.update(overrides)
    return EmulatorConfig(**values)  # type: ignore[arg-type]


def job(env: dict[str, Path], name: str, script: str, cluster: int = 1, **extra: str) -> None:
    args = "-c '" + script.replace("'", "''") + "'"
    lines = [
        'Cmd = "/bin/sh"',
        f'Arguments = "{args}"',
        'Owner = "alice"',
        'User = "alice@localdomain"',
        "JobUniverse = 5",
        f'Iwd = "{env["iwd"]}"',
        "RequestCpus = 1",
        "RequestMemory = 64",
        "RequestDisk = 1024",
        f"ClusterId = {cluster}",
        "ProcId = 0",
    ]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    (env["queue"] / f"{name}.ad").write_text("\n".join(lines) + "\n")


def raw_job(env: dict[str, Path], name: str, text: str) -> None:
    (env["queue"] / f"{name}.ad").write_text(text)


def ad_of(data: bytes) -> dict[str, str]:
    out = {}
    for line in data.decode().splitlines():
        if line == "-----":
            break
        name, _, value = line.partition(" = ")
        out[name] = value
    return out


def jobs_done(report: EmulatorReport, n: int) -> bool:
    return sum(1 for j in report.jobs if j.done.is_set()) >= n


def names(report: EmulatorReport, skip_empty_fetch: bool = True) -> list[str]:
    out = []
    for c in report.hook_calls:
        if skip_empty_fetch and c.hook == "FETCH_WORK" and not c.stdout:
            continue
        out.append(c.hook + ("(" + c.argv[1] + ")" if len(c.argv) > 1 else ""))
    return out


# -- wire format and parsing ------------------------------------------------------------------


def test_fetch_output_parsing() -> None:
    assert parse_fetch_output(b"") == ("none", None)
    kind, ad = parse_fetch_output(b"\n")
    assert kind == "job" and ad is not None and len(ad) == 0
    assert parse_fetch_output(b"Cmd = /bin/true\n")[0] == "invalid"
    assert parse_fetch_output(b"A = 1\nthis is not a classad\n")[0] == "invalid"
    kind, ad = parse_fetch_output(b'  Cmd = "/bin/x" junk \r\n\nRequestMemory = 512 MB\n')
    assert kind == "job" and ad is not None
    assert ad["Cmd"] == "/bin/x" and ad["RequestMemory"] == 512


def test_sprint_ad_sorted_and_private_dropped() -> None:
    ad = parse_job_ad('b = 1\nClaimId = "x"\nCOLLECTOR = 2\nCan = "a\\b"\n_condor_privX = 1\n')
    assert sprint_ad(ad) == 'COLLECTOR = 2\nCan = "a\\b"\nb = 1\n'


def test_args_and_env_syntax() -> None:
    assert parse_args_v2("a  'b c' 'it''s' x'y z'") == ["a", "b c", "it's", "xy z"]
    assert parse_env_v2("A=1 B='x y' C=") == {"A": "1", "B": "x y", "C": ""}
    assert parse_env_v1("A=1;B=2") == {"A": "1", "B": "2"}


def test_hook_path_validation(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir(mode=0o755)
    hook = Path(write_hook(d / "h", "#!/bin/sh\n"))
    assert check_hook_path(str(hook)) is None
    hook.chmod(0o757)
    assert "world-writable" in (check_hook_path(str(hook)) or "")
    hook.chmod(0o644)
    assert "executable" in (check_hook_path(str(hook)) or "")
    hook.chmod(0o755)
    d.chmod(0o777)
    assert "parent" in (check_hook_path(str(hook)) or "")
    d.chmod(0o755)
    assert check_hook_path(f"{hook} --x") is not None


# -- the full life cycle ----------------------------------------------------------------------


def test_normal_job_order(env: dict[str, Path]) -> None:
    job(env, "a", "sleep 0.8; exit 0")
    emu = Emulator(make_config(env))
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    seq = names(report)
    assert seq[:4] == ["FETCH_WORK", "REPLY_FETCH(accept)", "UPDATE_JOB_INFO", "PREPARE_JOB"]
    assert seq[-2:] == ["UPDATE_JOB_INFO", "JOB_EXIT(exit)"]
    assert seq.count("UPDATE_JOB_INFO") >= 3  # bare one, periodic one(s), final one
    fetch = report.calls("FETCH_WORK")[0]
    assert fetch.argv == [emu.config.hooks["FETCH_WORK"]]
    assert fetch.cwd == emu.log_dir and "_CONDOR_SLOT" not in fetch.env
    assert fetch.env["CONDOR_PRIVATE_INHERIT"] == emu.private_inherit
    slot_ad = ad_of(fetch.stdin)
    assert slot_ad["Name"] == '"slot1@node01.example.org"' and slot_ad["State"] == '"Unclaimed"'
    lines = fetch.stdin.decode().splitlines()
    assert lines == sorted(lines, key=str.encode)
    reply = report.calls("REPLY_FETCH")[0]
    assert ad_of(reply.stdin)["HookKeyword"] == '"JOBSTORE"'
    claim_line = reply.stdin.decode().splitlines()[-1]
    assert re.fullmatch(r'ClaimId = "<[^>]+>#\d+#\d+#\[.*"NO".*\][0-9a-f]+"', claim_line)
    first_update = ad_of(report.calls("UPDATE_JOB_INFO")[0].stdin)
    assert "JobPid" not in first_update and first_update["OrigCmd"] == '"/bin/sh"'
    final_update = ad_of(report.calls("UPDATE_JOB_INFO")[-1].stdin)
    assert final_update["JobState"] == '"Running"' and "JobPid" in final_update
    assert final_update["MemoryUsage"] == "((ResidentSetSize + 1023) / 1024)"
    exit_call = report.calls("JOB_EXIT")[0]
    exit_ad = ad_of(exit_call.stdin)
    assert exit_ad["JobState"] == '"Exited"' and exit_ad["ExitCode"] == "0"
    assert exit_ad["ExitBySignal"] == "false" and exit_ad["HookPrepared"] == "true"
    assert exit_call.env["_CONDOR_MAINJOB_EXIT_CODE"] == "0"
    assert exit_call.env["_CONDOR_SLOT"] == "slot1" and exit_call.env["BATCH_SYSTEM"] == "HTCondor"
    assert exit_call.cwd == exit_call.env["_CONDOR_SCRATCH_DIR"]
    assert exit_call.env["TMPDIR"] == str(env["iwd"])
    prepare = report.calls("PREPARE_JOB")[0]
    assert prepare.env["TMPDIR"] == prepare.env["_CONDOR_SCRATCH_DIR"]
    assert report.jobs[0].outcome == "exited" and report.jobs[0].exit_code == 0


def test_exit_code_and_signal(env: dict[str, Path]) -> None:
    job(env, "a", "exit 3", cluster=1)
    job(env, "b", "kill -9 $$", cluster=2)
    emu = Emulator(make_config(env, static_slots=2, cpus=2))
    report = emu.run(until=lambda: jobs_done(emu.report, 2), timeout=20)
    exits = {ad_of(c.stdin)["ClusterId"]: c for c in report.calls("JOB_EXIT")}
    a, b = ad_of(exits["1"].stdin), ad_of(exits["2"].stdin)
    assert a["ExitCode"] == "3" and "ExitSignal" not in a and "ExitReason" not in a
    assert b["ExitBySignal"] == "true" and b["ExitSignal"] == "9" and "ExitCode" not in b
    assert b["ExitReason"] == '"died on signal 9 (Killed)"'
    assert exits["2"].env["_CONDOR_MAINJOB_EXIT_SIGNAL"] == "9"
    assert all(c.argv[1:] == ["exit"] for c in exits.values())


def test_no_work_bad_line_and_empty_job(env: dict[str, Path]) -> None:
    raw_job(env, "a", "this is not a classad\n")
    emu = Emulator(make_config(env))
    report = emu.run(timeout=0.6)
    assert report.dropped_replies == 1 and not report.calls("REPLY_FETCH")

    raw_job(env, "b", "\n")
    emu = Emulator(make_config(env))
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=5)
    reply = report.calls("REPLY_FETCH")
    assert [c.argv[1] for c in reply] == ["accept"]
    assert ad_of(reply[0].stdin)["RequestCpus"] == "1"  # static-slot defaults
    assert report.jobs[0].outcome == "starter_failed"
    starter_hooks = ("PREPARE_JOB", "UPDATE_JOB_INFO", "JOB_EXIT")
    assert not any(c.hook in starter_hooks for c in report.hook_calls)


def test_zero_bytes_means_no_reply(env: dict[str, Path]) -> None:
    emu = Emulator(make_config(env, fetch_work_delay="0"))
    report = emu.run(timeout=0.7)
    assert len(report.calls("FETCH_WORK")) >= 2  # re-armed after min_rearm
    assert not report.calls("REPLY_FETCH") and report.dropped_replies == 0


def test_busy_slot_rejects(env: dict[str, Path]) -> None:
    job(env, "a", "sleep 1.5", cluster=1)
    job(env, "b", "exit 0", cluster=2)
    emu = Emulator(make_config(env, fetch_work_delay="0"))
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    replies = report.calls("REPLY_FETCH")
    assert [c.argv[1] for c in replies[:2]] == ["accept", "reject"]
    busy = ad_of(report.calls("FETCH_WORK")[1].stdin)
    assert busy["State"] == '"Claimed"' and busy["Activity"] == '"Busy"'
    assert "PublicClaimId" in busy
    assert not replies[1].stdin.decode().splitlines()[-1].startswith("ClaimId")
    assert len(report.jobs) == 1


def test_pslot(env: dict[str, Path]) -> None:
    raw_job(
        env,
        "a",
        'Cmd = "/bin/true"\nUser = "alice@localdomain"\nIwd = "/tmp"\nClusterId = 1\n',
    )
    job(env, "b", "exit 0", cluster=2)
    cfg = make_config(env, partitionable=True, cpus=2, memory=2048, fetch_work_delay="0")
    emu = Emulator(cfg)
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    replies = report.calls("REPLY_FETCH")
    assert [c.argv[1] for c in replies[:2]] == ["reject", "accept"]
    accept = ad_of(replies[1].stdin)
    assert accept["RequestMemory"] == "64"
    assert '"slot1@node01.example.org"' in replies[1].stdin.decode().split("-----")[1]
    prepare = report.calls("PREPARE_JOB")[0]
    assert prepare.env["_CONDOR_SLOT"] == "slot1_1"
    assert ad_of(prepare.stdin)["RequestMemory"] == "128"
    assert report.jobs[0].slot == "slot1_1@node01.example.org"


def test_fds_signals_and_output_cap(env: dict[str, Path]) -> None:
    big = write_hook(
        env["hooks"] / "big_fetch",
        "#!/bin/sh\ncat >/dev/null\nprintf 'A = \"%020000d\"\\n' 0\n",
    )
    emu = Emulator(make_config(env, hooks={"FETCH_WORK": big}))
    report = emu.run(timeout=0.5)
    assert len(report.calls("FETCH_WORK")[0].stdout) == 10240
    assert report.dropped_replies == 1

    job(env, "a", "sleep 0.5")
    emu = Emulator(make_config(env))
    emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    probes = {p.name.split(".")[0]: p.read_text() for p in env["probe"].iterdir()}
    for hook in ("reply_fetch", "update_job_info"):
        assert "fd1=closed" in probes[hook] and "fd2=closed" in probes[hook]
    for hook in ("prepare_job", "job_exit"):
        assert "fd1=open" in probes[hook] and "fd2=open" in probes[hook]
    for text in probes.values():
        blocked = int(re.search(r"SigBlk:\s*([0-9a-f]+)", text).group(1), 16)  # type: ignore[union-attr]
        ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", text).group(1), 16)  # type: ignore[union-attr]
        for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD, signal.SIGINT):
            assert blocked & (1 << (sig - 1))
        assert ignored & (1 << (signal.SIGPIPE - 1))


def test_prepare_job_failure(env: dict[str, Path]) -> None:
    prep = write_hook(
        env["hooks"] / "prep_fail",
        "#!/bin/sh\ncat >/dev/null\necho 'HookStatusCode = 190'\n"
        "echo 'HookStatusMessage = \"hold\"'\nexit 1\n",
    )
    job(env, "a", "exit 0")
    emu = Emulator(make_config(env, hooks={"PREPARE_JOB": prep}))
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    exit_call = report.calls("JOB_EXIT")[0]
    assert exit_call.argv[1:] == ["evict"]
    exit_ad = ad_of(exit_call.stdin)
    for attr in ("JobPid", "HookStatusCode", "ExitCode", "JobState"):
        assert attr not in exit_ad
    assert "_CONDOR_MAINJOB_EXIT_CODE" not in exit_call.env
    assert report.jobs[0].outcome == "prepare_failed"


def test_vacate(env: dict[str, Path]) -> None:
    job(env, "a", "sleep 30")
    emu = Emulator(make_config(env))

    def vacate_when_running() -> None:
        while not any(j.started for j in emu.report.jobs):
            time.sleep(0.05)
        time.sleep(0.5)
        emu.vacate("slot1@node01.example.org")

    threading.Thread(target=vacate_when_running, daemon=True).start()
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    exit_call = report.calls("JOB_EXIT")[0]
    exit_ad = ad_of(exit_call.stdin)
    assert exit_call.argv[1:] == ["evict"]
    assert exit_ad["ExitSignal"] == "15" and exit_ad["ExitBySignal"] == "true"
    assert exit_ad["VacateReason"] == '"Claim vacated by the administrator"'
    assert exit_ad["VacateReasonCode"] == "1010"
    assert "VacateReason" in ad_of(report.calls("UPDATE_JOB_INFO")[-1].stdin)
    assert report.jobs[0].evicted and not report.calls("EVICT_CLAIM")


def test_auto_vacate_fast_and_shutdown(env: dict[str, Path]) -> None:
    job(env, "a", "sleep 30", cluster=7)
    job(env, "b", "sleep 30", cluster=8)
    cfg = make_config(env, static_slots=2, cpus=2, vacate_after={7: 0.3}, vacate_fast=True)
    emu = Emulator(cfg)
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    exits = {ad_of(c.stdin)["ClusterId"]: ad_of(c.stdin) for c in report.calls("JOB_EXIT")}
    assert exits["7"]["ExitSignal"] == "9" and exits["7"]["VacateReasonCode"] == "1010"
    assert exits["8"]["VacateReason"] == '"Startd was shutdown"'
    assert exits["8"]["VacateReasonCode"] == "1013" and exits["8"]["ExitSignal"] == "15"


def test_job_exit_timeout(env: dict[str, Path]) -> None:
    hang = write_hook(env["hooks"] / "hang_exit", "#!/bin/sh\ncat >/dev/null\nsleep 30\n")
    job(env, "a", "exit 0")
    emu = Emulator(make_config(env, hooks={"JOB_EXIT": hang}, job_exit_timeout=0.5))
    start = time.monotonic()
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    assert time.monotonic() - start < 10
    assert report.calls("JOB_EXIT")[0].timed_out


def test_refused_hook_and_stdout_file(env: dict[str, Path]) -> None:
    bad = env["hooks"] / "job_exit_bad"
    write_hook(bad, PROBE)
    bad.chmod(stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO)
    job(env, "a", "echo hi")
    emu = Emulator(make_config(env, hooks={"JOB_EXIT": str(bad)}))
    report = emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    assert "JOB_EXIT" in report.refused_hooks
    assert report.jobs[0].outcome == "starter_failed"
    assert not report.calls("PREPARE_JOB")

    job(env, "b", "echo hi $FOO", Out='"out.txt"', Environment="\"FOO='a b'\"")
    emu = Emulator(make_config(env))
    emu.run(until=lambda: jobs_done(emu.report, 1), timeout=20)
    assert (env["iwd"] / "out.txt").read_text() == "hi a b\n"
    assert os.path.isdir(emu.execute_dir)


def test_a_started_startd_fetches_at_its_first_update_or_when_nudged(env: dict[str, Path],
                                                                     tmp_path: Path) -> None:
    """As a real startd (docs/live-startd.md): no FETCH_WORK before the first UPDATE_INTERVAL,
    unless an UPDATE_MACHINE_AD comes; then at once."""
    job(env, "a", "exit 0")
    control = tmp_path / "control"
    control.mkdir()
    emu = Emulator(make_config(env, first_fetch_after=60.0, control_dir=str(control)))
    started, wall = time.monotonic(), time.time()

    def nudge_later() -> bool:
        if time.monotonic() - started > 1.5 and not (control / ".nudged").exists():
            assert not emu.report.calls("FETCH_WORK"), "fetched before the first update"
            (control / ".nudged").write_text("")
            (control / "update-machine-ad").write_text("")
        return jobs_done(emu.report, 1)

    report = emu.run(until=nudge_later, timeout=20)
    assert jobs_done(report, 1)
    first = report.calls("FETCH_WORK")[0]
    assert first.started - wall < 10
