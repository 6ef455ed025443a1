"""Every condor_submit command (HTCondor 25's keyword table) is handled, stored under
condor_submit's attribute, or refused with one line naming it: none is silently dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import classad2
import htcondor2
import pytest
from scheddapi import schedd  # noqa: F401 - the fixture

from jobstore.formats.jobads import submitted_ad
from jobstore.formats.matching import matches
from jobstore.submit import SubmitError
from jobstore.submit.commands import COMMANDS, PREFIXES, lookup
from jobstore.submit.description import parse_submit_text
from jobstore.testing.factories import claim, claim_request

# The submit keywords of HTCondor 25's condor_submit (SUBMIT_KEY_* and SUBMIT_CMD_*).
HTCONDOR_25 = """
skip_filechecks allow_arguments_v1 allow_environment_v1 getenv get_env send_credential Cluster
Process batch_name batch_id hold priority prio notification executable interactive_executable
description arguments arguments2 interactive_args environment env environment2 input shell
stdin output stdout error stderr initialdir initial_dir job_iwd remote_initialdir requirements
preferences rank image_size disk_usage memory_usage request_cpus request_memory request_disk
request_gpus require_gpus retry_request_memory retry_request_memory_max
retry_request_memory_increase retry_request_disk gpus_minimum_memory gpus_minimum_capability
gpus_maximum_capability gpus_minimum_runtime universe machine_count notify_user
email_attributes exit_requirements log log_xml ulog_execute_attrs dagman_log core_size
nice_user keep_claim_idle job_ad_information_attrs job_lease_duration job_machine_attrs
job_machine_attrs_history_length node_count NodeCount grid_resource x509userproxy
use_x509userproxy use_scitokens use_scitoken scitokens_file
delegate_job_gsi_credentials_lifetime arc_rte arc_application arc_resources arc_data_staging
rendezvousdir batch_extra_submit_args batch_project batch_queue batch_runtime file_remaps
buffer_files buffer_size buffer_block_size stack_size fetch_files compress_files append_files
local_files encrypt_execute_directory starter_debug starter_log tool_daemon_cmd
tool_daemon_args tool_daemon_arguments tool_daemon_arguments2 tool_daemon_input
tool_daemon_error tool_daemon_output suspend_job_at_exec when_to_transfer_output
should_transfer_files preserve_relative_paths transfer_checkpoint_files transfer_container
transfer_input_files TransferInputFiles transfer_output_files TransferOutputFiles
transfer_output_remaps transfer_executable transfer_input transfer_output transfer_error
transfer_plugins max_transfer_input_mb max_transfer_output_mb want_job_networking
want_io_proxy transfer_common_input container_is_common manifest manifest_dir
use_oauth_services UseOAuthServices jobset public_input_files encrypt_input_files
encrypt_output_files dont_encrypt_input_files dont_encrypt_output_files output_destination
output_directory stream_input stream_output stream_error leave_in_queue periodic_hold
periodic_hold_reason periodic_hold_subcode periodic_release periodic_remove periodic_vacate
on_exit_hold on_exit_hold_reason on_exit_hold_subcode on_exit_remove on_evict_checks noop_job
noop_job_exit_signal noop_job_exit_code match_list_length dagman_job_id submit_event_notes
submit_event_user_notes submit_event_notes_attrs jar_files java_vm_args java_vm_arguments
java_vm_arguments2 parallel_script_shadow parallel_script_starter max_job_retirement_time
want_ads skip_if_dataflow deferral_time deferral_window deferral_prep_time max_retries
retry_until success_exit_code checkpoint_exit_code checkpoint_destination
erase_output_and_error_on_restart cron_minute cron_hour cron_day_of_month cron_month
cron_day_of_week cron_window cron_prep_time run_as_owner load_profile primary_unix_group
concurrency_limits concurrency_limits_expr accounting_group accounting_group_user project_name
docker_image docker_network_type docker_pull_policy docker_override_entrypoint
docker_send_credentials container_image container_service_names container_target_dir
mount_under_scratch vm_vnc vm_type vm_memory vm_vcpus vm_disk vm_macaddr vm_checkpoint
vm_networking vm_networking_type vm_no_output_vm xen_kernel xen_initrd xen_root
xen_kernel_params WantNameTag ec2_access_key_id ec2_secret_access_key aws_access_key_id_file
aws_secret_access_key_file aws_region s3_access_key_id_file s3_secret_access_key_file
gs_access_key_id_file gs_secret_access_key_file ec2_ami_id ec2_user_data ec2_user_data_file
ec2_security_groups ec2_security_ids ec2_keypair ec2_keypair_file ec2_keyp_air
ec2_key_pair_file ec2_instance_type ec2_elastic_ip ec2_ebs_volumes ec2_availability_zone
ec2_vpc_subnet ec2_vpc_ip ec2_tag_names ec2_spot_price ec2_block_device_mapping
ec2_parameter_names ec2_iam_profile_arn ec2_iam_profile_name gce_image gce_account
gce_auth_file gce_machine_type gce_metadata gce_metadata_file gce_preemptible gce_json_file
azure_auth_file azure_location azure_size azure_image azure_admin_username azure_admin_key
cloud_label_names next_job_start_delay want_graceful_removal job_max_vacate_time
allowed_job_duration allowed_execute_duration max_materialize max_idle materialize_max_idle
cuda_version kill_sig remove_kill_sig hold_kill_sig kill_sig_timeout dag_node_name
request_gpu_memory request_gpus_memory
""".split()  # noqa: SIM905 - the table as it reads
PREFIXED = ["request_FPGAs", "require_FPGAs", "ec2_tag_Name", "ec2_parameter_x",
            "cloud_label_x", "Remote_grid_resource", "_container_port"]

# A value each handled command accepts (the rest take "1").
REQ = claim_request(shape="s")
HANDLED_SAMPLES = {
    "executable": "/bin/sh", "arguments": "a b", "environment": "A=1", "env": "A=1",
    "input": "in", "stdin": "in", "output": "out", "stdout": "out", "error": "err",
    "stderr": "err", "initialdir": "/tmp", "initial_dir": "/tmp", "job_iwd": "/tmp",
    "universe": "vanilla", "requirements": "true", "log": "log", "retry_until": "ExitCode == 0",
    "accounting_group": "group_a", "accounting_group_user": "alice",
    "concurrency_limits": "db", "kill_sig": "SIGTERM", "hold": "false", "getenv": "false",
    "get_env": "false", "transfer_executable": "true", "transfer_input_files": "",
    "skip_filechecks": "false", "allow_arguments_v1": "true", "allow_environment_v1": "true",
    "Cluster": "", "Process": "", "periodic_hold_reason": '"x"', "on_exit_hold_reason": '"x"',
    "should_transfer_files": "IF_NEEDED", "when_to_transfer_output": "ON_EXIT",
    "transfer_output_files": "", "TransferOutputFiles": "", "TransferInputFiles": "",
    "transfer_output_remaps": "", "checkpoint_exit_code": "", "transfer_checkpoint_files": "",
    "output_destination": "file:///tmp/outputs",
}
SAMPLES = {"string": ('a "quoted" word', '"a \\"quoted\\" word"'), "bool": ("yes", "true"),
           "int": ("7", "7"), "expr": ("1 + 2", "1 + 2")}


def _parse(tmp_path: Path, lines: str) -> Any:
    return parse_submit_text(f"executable = /bin/sh\n{lines}\nqueue\n", base_dir=tmp_path)


def test_the_table_holds_every_htcondor_25_command() -> None:
    missing = [name for name in HTCONDOR_25 + PREFIXED if lookup(name) is None]
    assert not missing, missing
    assert {c.kind for c in COMMANDS.values()} == {"handled", "stored", "refused"}
    for command in [*COMMANDS.values(), *PREFIXES.values()]:
        assert (command.kind == "refused") == bool(command.why), command
        assert (command.kind == "stored") == bool(command.attribute), command


@pytest.mark.parametrize("name", sorted(COMMANDS, key=lambda name: str(name).lower()))
def test_each_command_is_handled_stored_or_refused(tmp_path: Path, name: str) -> None:
    command = COMMANDS[name]
    if command.kind == "handled":
        value = HANDLED_SAMPLES.get(command.name, "1")
        (spec,) = _parse(tmp_path, f"{command.name} = {value}" if value else "")
        assert spec.cmd.endswith("sh")
    elif command.kind == "stored":
        given, stored = SAMPLES[command.form]
        (spec,) = _parse(tmp_path, f"{command.name} = {given}")
        assert spec.custom[command.attribute] == stored
        ad = classad2.ClassAd()
        ad[command.attribute] = classad2.ExprTree(stored)
        assert ad.eval(command.attribute) == classad2.ExprTree(stored).eval()
    else:
        with pytest.raises(SubmitError) as caught:
            _parse(tmp_path, f"{command.name} = something")
        message = str(caught.value)
        assert f": {command.name}: is not supported" in message and "\n" not in message
        for harmless in command.harmless:
            assert _parse(tmp_path, f"{command.name} = {harmless}")


def test_prefixed_commands(tmp_path: Path) -> None:
    (spec,) = _parse(tmp_path, "request_FPGAs = 2\nrequirements = OpSys == \"LINUX\"")
    assert spec.custom["RequestFPGAs"] == "2"
    assert spec.requirements == '(OpSys == "LINUX") && (TARGET.FPGAs >= RequestFPGAs)'
    for name in PREFIXED[1:]:
        with pytest.raises(SubmitError, match=f"{name}: is not supported"):
            _parse(tmp_path, f"{name} = x")
    (spec,) = _parse(tmp_path, "my_own_macro = 3\narguments = $(my_own_macro)")
    assert spec.args == "3"  # a name that is no command is a macro, as in condor_submit


def test_arguments_keep_their_syntax(tmp_path: Path) -> None:
    (old,) = _parse(tmp_path, "arguments = a b c")
    (new,) = _parse(tmp_path, "arguments = \"a 'b c'\"")
    assert submitted_ad(old)["Args"] == "a b c" and "Arguments" not in submitted_ad(old)
    assert submitted_ad(new)["Arguments"] == "a 'b c'" and "Args" not in submitted_ad(new)


def test_getenv_takes_the_submitters_environment(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBSTORE_T_ONE", "1")
    monkeypatch.setenv("JOBSTORE_T_TWO", "2")
    (spec,) = _parse(tmp_path, "getenv = JOBSTORE_T_*, !JOBSTORE_T_TWO\nenvironment = B=3")
    assert spec.env == "JOBSTORE_T_ONE=1 B=3"
    (spec,) = _parse(tmp_path, "getenv = true\nenvironment = JOBSTORE_T_ONE=own")
    assert "JOBSTORE_T_ONE=own" in spec.env and "JOBSTORE_T_TWO=2" in spec.env


def _job(**commands: str) -> htcondor2.Submit:
    return htcondor2.Submit({"executable": "/bin/sleep", "arguments": "60",
                             "transfer_executable": "false", **commands})


def test_hold_true_queues_the_jobs_held_with_code_15(schedd: Any) -> None:  # noqa: F811
    cluster = schedd.submit(_job(hold="True", batch_name="nightly"), count=3).cluster()
    ads = schedd.query(f"ClusterId == {cluster}")
    assert [(a["JobStatus"], a["HoldReasonCode"], a["HoldReason"], a["JobBatchName"])
            for a in ads] == [(5, 15, "submitted on hold at user's request", "nightly")] * 3
    assert claim(schedd.store, REQ) is None  # nothing runs
    events = schedd.store.reads.events(ads[0]["JobstoreJobId"])
    assert [(e.event, e.to_status) for e in events] == [("submit", "idle"), ("hold", "held")]
    assert schedd.act(htcondor2.JobAction.Release, cluster)["TotalSuccess"] == 3
    assert claim(schedd.store, REQ) is not None


def test_request_gpus_is_matched_against_the_slots_gpus(schedd: Any) -> None:  # noqa: F811
    cluster = schedd.submit(_job(request_gpus="2")).cluster()
    (ad,) = schedd.query(f"ClusterId == {cluster}")
    assert ad["RequestGPUs"] == 2
    assert "TARGET.GPUs >= RequestGPUs" in str(ad.lookup("Requirements"))
    for gpus, fits in ((None, False), (1, False), (2, True)):
        slot = classad2.ClassAd({"Cpus": 1, "Memory": 1024, "Disk": 10**6})
        if gpus is not None:
            slot["GPUs"] = gpus
        assert matches(ad, slot) is fits, gpus


def test_a_refused_command_queues_nothing(schedd: Any) -> None:  # noqa: F811
    with pytest.raises(htcondor2.HTCondorException, match="container_image: is not supported"):
        schedd.submit(_job(container_image="docker://alpine"))
    with pytest.raises(SubmitError, match="rank: is not supported"):
        schedd.submit(_job(rank="Memory"))
    assert schedd.query() == []


def test_the_documented_table_is_the_code() -> None:
    from jobstore.submit.commands import markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "submit-commands.md"
    assert doc.read_text() == markdown(), "regenerate docs/submit-commands.md from markdown()"
