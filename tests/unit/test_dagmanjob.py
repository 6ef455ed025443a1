"""DAGMan's job as htcondor2.Submit.from_dag describes it, read back as its DAG: HTCondor's
arguments syntax, and what is refused with one line."""

from __future__ import annotations

import pytest

from jobstore.api.dagmanjob import arguments, dagman_dag
from jobstore.errors import DagError

FROM_DAG = {  # what htcondor2 25.14's Submit.from_dag("x.dag", {"maxjobs": 3, ...}) wrote
    "universe": "scheduler", "executable": "/usr/bin/condor_dagman",
    "getenv": "CONDOR_CONFIG,_CONDOR_*,PATH", "output": "x.dag.lib.out",
    "error": "x.dag.lib.err", "log": "x.dag.dagman.log", "My.JobBatchName": '"b"',
    "remove_kill_sig": "SIGUSR1", "My.OtherJobRemoveRequirements": '"DAGManJobId =?= $(cluster)"',
    "My.IsDaemonCore": "True",
    "on_exit_remove": "(ExitSignal =?= 11 || (ExitCode =!= UNDEFINED && ExitCode >=0))",
    "arguments": "\"-f -l . -Lockfile x.dag.lock -Dag x.dag -MaxJobs 3 -CsdVersion "
                 "$CondorVersion:' '25.14.1' '2026-09-24' '$ -dagman /usr/bin/condor_dagman "
                 "-AutoRescue 1\"",
    "environment": "\"_CONDOR_DAGMAN_LOG=x.dag.dagman.out _CONDOR_MAX_DAGMAN_LOG=0\"",
}


def test_arguments_as_htcondor_splits_them() -> None:
    assert arguments('"-a \'b c\' d\'\'e \'it\'\'s\'"') == ["-a", "b c", "de", "it's"]
    assert arguments("-x  y") == ["-x", "y"]
    assert arguments("\"''\"") == [""]
    with pytest.raises(DagError, match="unclosed quote"):
        arguments("\"-a 'b\"")


def test_dagmans_job_is_its_dag(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    dag = dagman_dag(FROM_DAG)
    assert dag is not None
    assert (dag.path, dict(dag.options)) == (str(tmp_path / "x.dag"),
                                             {"maxjobs": "3", "batch_name": "b"})
    assert dagman_dag({"executable": "/bin/true"}) is None


@pytest.mark.parametrize(("change", "message"), [
    ({"arguments": '"-Dag x.dag -MaxHold 2"'}, "-MaxHold is not supported"),
    ({"arguments": '"-Dag x.dag -Dag y.dag"'}, "one DAG file"),
    ({"arguments": '"-f"'}, "one DAG file"),
    ({"universe": "vanilla"}, "scheduler universe"),
    ({"notification": "Always"}, "notification is not supported"),
    ({"log": "elsewhere.log"}, "the DAG's own log is x.dag.dagman.log"),
    ({"My.JobBatchName": "1 +"}, "JobBatchName is not a string"),
])
def test_what_dagman_would_do_and_the_job_store_does_not_is_refused(
        change: dict[str, str], message: str) -> None:
    with pytest.raises(DagError, match=message):
        dagman_dag({**FROM_DAG, **change})
