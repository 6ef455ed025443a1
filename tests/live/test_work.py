"""What a job brings and leaves, on the real startd: file transfer in and out (a directory and
a remap), a self-checkpointing job across a condor_vacate, an expression bomb among ordinary
jobs, a DAG of 50 nodes, a DAG's PRE and POST scripts."""

from __future__ import annotations

import os
import re

from jobstore.testing.livepool import wait_for

from .conftest import MEASURED, SUBMITTER, Live


def _write(live: Live, name: str, text: str, mode: int = 0o644) -> None:
    from jobstore.testing.support import ensure_account

    path = live.work / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    user = ensure_account(SUBMITTER)
    for p in (path, path.parent):
        os.chown(p, user.pw_uid, user.pw_gid)


def test_files_go_in_and_come_out_with_a_directory_and_a_remap(live: Live) -> None:
    _write(live, "xfer/in.txt", "input one\n")
    _write(live, "xfer/indir/a.txt", "input two\n")
    _write(live, "xfer/make.sh", "#!/bin/sh\ncat in.txt a.txt > out.txt\nmkdir outdir\n"
           "echo made > outdir/b.txt\npwd\n", 0o755)
    (job,) = live.submit("executable = make.sh\ninitialdir = xfer\nshould_transfer_files = YES\n"
                         "transfer_input_files = in.txt, indir/\n"
                         "transfer_output_files = out.txt, outdir\n"
                         "transfer_output_remaps = \"out.txt = renamed.txt\"\n"
                         "output = job.out\nqueue\n")
    done = live.wait_status(job, "completed")
    assert done["exit_code"] == 0
    got = live.jobstore("transfer-data", job)
    assert got.returncode == 0, got.stderr
    xfer = live.work / "xfer"
    assert (xfer / "renamed.txt").read_text() == "input one\ninput two\n"
    assert (xfer / "outdir" / "b.txt").read_text() == "made\n"
    sandbox = (xfer / "job.out").read_text().strip()
    assert sandbox != str(xfer) and not os.path.exists(sandbox), sandbox  # its own, removed


def _submit_dag(live: Live, directory: str, dag: str) -> int:
    """`jobstore submit-dag DAG` as alice in her `directory`: the DAG's id."""
    done = live.jobstore("submit-dag", dag, cwd=live.work / directory)
    assert done.returncode == 0, done.stderr
    found = re.search(r"submitted as (\d+)", done.stdout)
    assert found, done.stdout
    return int(found.group(1))


def test_outputs_come_home_as_the_job_completes(live: Live) -> None:
    """`jobstore schedd` as root on the access point: a completed job's outputs are in its
    initialdir, and every event of its run in its job event log (which the real startd's
    node never writes), written as its owner, with no command of hers (reported: how long
    after its JOB_EXIT began)."""
    import pwd
    import signal

    import htcondor2

    _write(live, "home/in.txt", "came home\n")
    service = live.start("schedd", account="root", log=live.work.parent / "schedd.log")
    try:
        (job,) = live.submit("executable = /bin/cat\ntransfer_executable = false\n"
                             "arguments = in.txt\ninitialdir = home\nshould_transfer_files = YES\n"
                             "transfer_input_files = in.txt\noutput = cat.out\n"
                             "log = cat.log\nqueue\n")
        done = live.wait_status(job, "completed")
        out = live.work / "home" / "cat.out"
        wait_for("cat.out written home", lambda: out.exists() or None, 30, 0.05)
        MEASURED.append(f"JOB_EXIT's start (the job's recorded end; it then sends the outputs "
                        f"into the store) -> its output written in its initialdir by jobstore "
                        f"schedd: {(out.stat().st_mtime - done['finished_at']) * 1000:.0f} ms")
        assert out.read_text() == "came home\n"
        assert out.stat().st_uid == pwd.getpwnam(SUBMITTER).pw_uid
        log = live.work / "home" / "cat.log"

        def terminated() -> list[htcondor2.JobEventType] | None:
            kinds = [e.type for e in htcondor2.JobEventLog(str(log)).events(0)
                     if e.type != htcondor2.JobEventType.IMAGE_SIZE] if log.exists() else []
            return kinds if htcondor2.JobEventType.JOB_TERMINATED in kinds else None

        kinds = wait_for("cat.log's JOB_TERMINATED", terminated, 30, 0.05)
        MEASURED.append(f"JOB_EXIT's start -> JOB_TERMINATED in the job event log on the access "
                        f"point: {(log.stat().st_mtime - done['finished_at']) * 1000:.0f} ms")
        assert kinds == [htcondor2.JobEventType.SUBMIT, htcondor2.JobEventType.EXECUTE,
                         htcondor2.JobEventType.JOB_TERMINATED]
        assert log.stat().st_uid == pwd.getpwnam(SUBMITTER).pw_uid
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=20) == 0


def test_a_self_checkpointing_job_resumes_from_its_checkpoint_after_condor_vacate(live: Live
                                                                                  ) -> None:
    marker = live.marker(3600)
    seen = live.work / "ckpt" / "seen"
    _write(live, "ckpt/step.sh", f"""#!/bin/sh
n=$(cat count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > count
echo $n >> {seen}
[ $n -eq 1 ] && exit 85
[ -f {live.work}/ckpt/go ] && exit 0
exec sleep {marker}
""", 0o755)
    (job,) = live.submit("executable = step.sh\ninitialdir = ckpt\nshould_transfer_files = YES\n"
                         "checkpoint_exit_code = 85\ntransfer_checkpoint_files = count\n"
                         "transfer_output_files = count\nqueue\n")
    live.wait_process(marker)
    _write(live, "ckpt/go", "")
    slot = live.job(job)["slot"]
    assert live.pool.tool("condor_vacate", "-fast", slot).returncode == 0
    done = live.wait_status(job, "completed", timeout=120)
    assert done["exit_code"] == 0
    # one run from nothing, then each attempt from the checkpoint (count 1): never from scratch
    assert seen.read_text().split() == ["1", "2", "2"], seen.read_text()
    assert live.jobstore("transfer-data", job).returncode == 0
    assert (live.work / "ckpt" / "count").read_text().strip() == "2"


def test_an_expression_bomb_is_held_and_the_other_jobs_run(live: Live) -> None:
    levels = "".join(f"+A{n} = (A{n + 1} =?= A{n + 1})\n" for n in range(6))
    bomb = levels + '+A6 = regexp("^(a|a)*$", "' + "a" * 28 + 'b")\n'
    (held,) = live.submit(f"executable = /bin/true\nrequirements = A0\n{bomb}queue\n",
                          name="bomb.sub")
    others = live.submit("executable = /bin/true\nqueue 3\n", name="others.sub")
    for job in others:
        live.wait_status(job, "completed")
    h = live.wait_status(held, "held")
    assert h["hold_code"] == 5, h["reason"]  # JobPolicyUndefined, as HTCondor's
    assert live.pool.child_pid("condor_startd")


def test_a_dag_of_fifty_nodes_runs_in_order(live: Live) -> None:
    """Each node after its parents; DAGMan's own log, written by root's `jobstore schedd` on
    the access point, ends with the DAG's JOB_TERMINATED."""
    import signal

    import htcondor2

    _write(live, "dag/node.sub", "executable = /bin/sh\n"
           "arguments = \"-c 'date +%s.%N > $(node).t'\"\nqueue\n")
    middle = [f"M{i}" for i in range(48)]
    lines = ["JOB A node.sub", *(f"JOB {m} node.sub" for m in middle), "JOB Z node.sub",
             *(f"VARS {n} node=\"{n}\"" for n in ["A", *middle, "Z"]),
             f"PARENT A CHILD {' '.join(middle)}", f"PARENT {' '.join(middle)} CHILD Z"]
    _write(live, "dag/fifty.dag", "\n".join(lines) + "\n")
    service = live.start("schedd", account="root", log=live.work.parent / "schedd-dag.log")
    try:
        dag = _submit_dag(live, "dag", "fifty.dag")
        status: list[str] = []

        def finished() -> bool:  # DAGMan's node status file
            status[:] = [live.jobstore("dag", "node-status", str(dag)).stdout]
            return "NodesDone = 50;" in status[0]

        try:
            wait_for("the DAG's 50 nodes done", finished, 240, 1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{status[0][:2000]}") from None
        log = live.work / "dag" / "fifty.dag.dagman.log"

        def ended() -> list[htcondor2.JobEvent] | None:  # as the DAG tutorial waits on it
            events = list(htcondor2.JobEventLog(str(log)).events(0)) if log.exists() else []
            return events if events and events[-1].type == htcondor2.JobEventType.JOB_TERMINATED \
                else None

        dagman = wait_for("DAGMan's log's JOB_TERMINATED", ended, 30, 0.05)
        assert [e.type for e in dagman] == [htcondor2.JobEventType.SUBMIT,
                                            htcondor2.JobEventType.EXECUTE,
                                            htcondor2.JobEventType.JOB_TERMINATED]
        assert {e.cluster for e in dagman} == {dag}
        assert dagman[-1]["ReturnValue"] == 0
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=20) == 0
    times = {p.stem: float(p.read_text()) for p in (live.work / "dag").glob("*.t")}
    assert len(times) == 50
    assert all(times["A"] < times[m] < times["Z"] for m in middle)


def test_a_dags_pre_and_post_scripts_run_on_the_access_point(live: Live) -> None:
    """Root's `jobstore schedd` runs a node's PRE script before its job and its POST script
    after its output is home, as the DAG's owner; the POST script turns the job's exit 3 into
    the node's success, so its child runs, and takes the parent's output as its input
    (reported: from the job's JOB_EXIT to the POST script's start, and to the child's job's
    start)."""
    import signal

    script = ("#!/bin/sh\necho \"$(date +%s.%N) $0 $* $(id -un)\" >> scripts.txt\n")
    files = "should_transfer_files = YES\ntransfer_executable = false\nexecutable = /bin/sh\n"
    _write(live, "scripts/fail.sub", files + "arguments = \"-c 'echo made by A > a.out; "
           "exit 3'\"\ntransfer_output_files = a.out\nqueue\n")
    _write(live, "scripts/ok.sub", files + "arguments = \"-c 'cat a.out > b.out'\"\n"
           "transfer_input_files = a.out\ntransfer_output_files = b.out\nqueue\n")
    _write(live, "scripts/pre.sh", script, 0o755)
    _write(live, "scripts/post.sh", script + "test -s a.out\n", 0o755)
    _write(live, "scripts/s.dag", "JOB A fail.sub\nJOB B ok.sub\nPARENT A CHILD B\n"
           "SCRIPT PRE A pre.sh $JOB\nSCRIPT POST A post.sh $JOB $RETURN\n")
    service = live.start("schedd", account="root", log=live.work.parent / "schedd-scripts.log")
    try:
        dag = _submit_dag(live, "scripts", "s.dag")
        wait_for("the DAG's 2 nodes done", lambda: "NodesDone = 2;" in live.jobstore(
            "dag", "node-status", str(dag)).stdout, 120, 0.5)
        lines = (live.work / "scripts" / "scripts.txt").read_text().split("\n")
        assert [line.split(" ", 1)[1] for line in lines if line] == [
            f"pre.sh A {SUBMITTER}", f"post.sh A 3 {SUBMITTER}"]
        job_a = live.job(f"{dag + 1}.0")  # the DAG's first node's cluster
        assert (job_a["status"], job_a["exit_code"]) == ("completed", 3)
        ran = float(lines[1].split()[0])
        MEASURED.append(f"a DAG node's JOB_EXIT start -> its POST script started on the access "
                        f"point: {(ran - job_a['finished_at']) * 1000:.0f} ms")
        job_b = live.job(f"{dag + 2}.0")
        MEASURED.append(f"a DAG node's JOB_EXIT start -> its child's job started with the "
                        f"node's output as its input: "
                        f"{(job_b['started_at'] - job_a['finished_at']) * 1000:.0f} ms")
        b_out = live.work / "scripts" / "b.out"
        wait_for("the child's output home", lambda: b_out.exists() or None, 30, 0.05)
        assert b_out.read_text() == "made by A\n"
    finally:
        service.send_signal(signal.SIGTERM)
        assert service.wait(timeout=20) == 0
