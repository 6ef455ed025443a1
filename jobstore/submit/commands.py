"""condor_submit's commands (HTCondor 25's keyword table) and what the job store does with each:
none is silently dropped.

* handled: read by jobstore.submit.description with condor_submit's meaning (executable,
  arguments, request_*, the policy commands, hold, getenv, ...);
* stored: set in the job ad under condor_submit's attribute, whose reader gives it its meaning
  (the starter reads CoreSize, the startd MaxJobRetirementTime; JobBatchName is for people);
* refused: the submit fails with one line naming the command and why (a universe, file
  transfer or credentials the job store does not have), unless its value asks for nothing
  (`harmless`, as `notification = never`).

A name that is no command (nor +Attr, MY.Attr, request_<tag>) is a macro, as in
condor_submit."""

from __future__ import annotations

from dataclasses import dataclass

from jobstore.submit.values import FALSE_WORDS, TRUE_WORDS

__all__ = ["Command", "COMMANDS", "lookup", "PREFIXES"]


@dataclass(frozen=True)
class Command:
    """One submit command: `kind` is handled, stored or refused."""

    name: str
    kind: str
    attribute: str | None = None  # stored: the job-ad attribute
    form: str = "expr"  # stored: string, expr, bool or int
    why: str | None = None  # refused: why
    harmless: frozenset[str] = frozenset()  # refused: values that ask for nothing


COMMANDS: dict[str, Command] = {}


def _add(*commands: Command) -> None:
    for command in commands:
        COMMANDS[command.name.lower()] = command


def _handled(*names: str) -> None:
    _add(*(Command(n, "handled") for n in names))


def _stored(attribute: str, form: str, *names: str) -> None:
    _add(*(Command(n, "stored", attribute=attribute, form=form) for n in names))


def _refused(why: str, *names: str, harmless: frozenset[str] | set[str] = frozenset()) -> None:
    _add(*(Command(n, "refused", why=why, harmless=frozenset(harmless)) for n in names))


# ---- handled by jobstore.submit.description ---------------------------------------------------
_handled(
    "executable", "arguments", "environment", "env", "input", "stdin", "output", "stdout",
    "error", "stderr", "initialdir", "initial_dir", "job_iwd", "universe", "requirements",
    "request_cpus", "request_memory", "request_disk", "request_gpus", "priority", "prio",
    "log", "max_retries", "success_exit_code", "retry_until", "accounting_group",
    "accounting_group_user", "concurrency_limits", "kill_sig", "job_max_vacate_time", "hold",
    "getenv", "get_env", "transfer_executable", "transfer_input_files", "skip_filechecks",
    "should_transfer_files", "when_to_transfer_output", "transfer_output_files",
    "TransferOutputFiles", "TransferInputFiles", "transfer_output_remaps",
    "checkpoint_exit_code", "transfer_checkpoint_files", "output_destination",
    "allow_arguments_v1", "allow_environment_v1",
    "periodic_hold", "periodic_hold_reason", "periodic_hold_subcode", "periodic_release",
    "periodic_remove", "on_exit_hold", "on_exit_hold_reason", "on_exit_hold_subcode",
    "on_exit_remove", "allowed_job_duration", "allowed_execute_duration",
    "Cluster", "Process",  # macros condor_submit sets itself
)

# ---- stored under condor_submit's attribute ---------------------------------------------------
for _attr, _form, *_names in (
    ("JobBatchName", "string", "batch_name"),
    ("JobBatchId", "string", "batch_id"),
    ("JobDescription", "string", "description"),
    ("JobSetName", "string", "jobset"),
    ("NotifyUser", "string", "notify_user"),
    ("EmailAttributes", "string", "email_attributes"),
    ("JobAdInformationAttrs", "string", "job_ad_information_attrs"),
    ("UserLogExecuteEventAttrs", "string", "ulog_execute_attrs"),
    ("SubmitEventNotes", "string", "submit_event_notes"),
    ("SubmitEventUserNotes", "string", "submit_event_user_notes"),
    ("SubmitEventNotesAttrs", "string", "submit_event_notes_attrs"),
    ("ProjectName", "string", "project_name"),
    ("DAGNodeName", "string", "dag_node_name"),
    ("DAGManJobId", "int", "dagman_job_id"),
    ("CoreSize", "int", "core_size"),
    ("MaxTransferInputMB", "int", "max_transfer_input_mb"),  # read by the node's PREPARE_JOB
    ("MaxTransferOutputMB", "int", "max_transfer_output_mb"),  # and JOB_EXIT
    ("KillSigTimeout", "int", "kill_sig_timeout"),
    ("WantGracefulRemoval", "expr", "want_graceful_removal"),
    ("MaxJobRetirementTime", "expr", "max_job_retirement_time"),
    ("LeaveJobInQueue", "expr", "leave_in_queue"),
    ("JobStarterDebug", "string", "starter_debug"),
    ("LoadProfile", "bool", "load_profile"),
    ("PrimaryUnixGroup", "string", "primary_unix_group"),
    ("WantIOProxy", "bool", "want_io_proxy"),
    ("EncryptExecuteDirectory", "bool", "encrypt_execute_directory"),
    ("EraseOutputAndErrorOnRestart", "bool", "erase_output_and_error_on_restart"),
    ("StreamIn", "bool", "stream_input"),
    ("StreamOut", "bool", "stream_output"),
    ("StreamErr", "bool", "stream_error"),
    ("TransferIn", "bool", "transfer_input"),
    ("TransferOut", "bool", "transfer_output"),
    ("TransferErr", "bool", "transfer_error"),
    ("MountUnderScratch", "string", "mount_under_scratch"),
):
    _stored(_attr, _form, *_names)

# ---- refused, with why -------------------------------------------------------------------
_FILES = ("is not supported: a fetched job's sandbox takes local files and file, http and "
          "https URLs in, and sends its outputs back into the job store or to a URL "
          "(transfer_input_files, transfer_output_files, transfer_output_remaps, "
          "output_destination), nothing else yet")
_refused(_FILES, "transfer_plugins",
         "transfer_container", "transfer_common_input", "public_input_files",
         "output_directory",
         "preserve_relative_paths", "checkpoint_destination",
         "encrypt_input_files", "encrypt_output_files", "dont_encrypt_input_files",
         "dont_encrypt_output_files", "manifest", "manifest_dir", "container_is_common",
         "aws_access_key_id_file", "aws_secret_access_key_file",
         "aws_region", "s3_access_key_id_file", "s3_secret_access_key_file",
         "gs_access_key_id_file", "gs_secret_access_key_file")
_CREDENTIALS = "is not supported: the job store passes no credentials to the jobs it hands out"
_refused(_CREDENTIALS, "x509userproxy", "use_x509userproxy", "use_scitokens", "use_scitoken",
         "scitokens_file", "delegate_job_gsi_credentials_lifetime", "use_oauth_services",
         "UseOAuthServices", "send_credential")
_GRID = "is not supported: the job store runs vanilla-universe jobs, not grid or cloud ones"
_refused(_GRID, "grid_resource", "arc_rte", "arc_application", "arc_resources",
         "arc_data_staging", "batch_extra_submit_args", "batch_project", "batch_queue",
         "batch_runtime", "remote_initialdir", "WantNameTag", "ec2_access_key_id",
         "ec2_secret_access_key", "ec2_ami_id", "ec2_user_data", "ec2_user_data_file",
         "ec2_security_groups", "ec2_security_ids", "ec2_keypair", "ec2_keypair_file",
         "ec2_keyp_air", "ec2_key_pair_file", "ec2_instance_type", "ec2_elastic_ip",
         "ec2_ebs_volumes", "ec2_availability_zone", "ec2_vpc_subnet", "ec2_vpc_ip",
         "ec2_tag_names", "ec2_spot_price", "ec2_block_device_mapping", "ec2_parameter_names",
         "ec2_iam_profile_arn", "ec2_iam_profile_name", "gce_image", "gce_account",
         "gce_auth_file", "gce_machine_type", "gce_metadata", "gce_metadata_file",
         "gce_preemptible", "gce_json_file", "azure_auth_file", "azure_location", "azure_size",
         "azure_image", "azure_admin_username", "azure_admin_key", "cloud_label_names")
_CONTAINER = ("is not supported: the job store runs vanilla-universe jobs, and a node's startd "
              "would run a container job only where it has a container runtime")
_refused(_CONTAINER, "container_image", "docker_image", "docker_network_type",
         "docker_pull_policy", "docker_override_entrypoint", "docker_send_credentials",
         "container_service_names", "container_target_dir", "want_job_networking")
_refused("is not supported: the job store runs vanilla-universe jobs, not VM ones", "vm_vnc",
         "vm_type", "vm_memory", "vm_vcpus", "vm_disk", "vm_macaddr", "vm_checkpoint",
         "vm_networking", "vm_networking_type", "vm_no_output_vm", "xen_kernel", "xen_initrd",
         "xen_root", "xen_kernel_params")
_refused("is not supported: the job store runs vanilla-universe jobs, not Java ones",
         "jar_files", "java_vm_args", "java_vm_arguments", "java_vm_arguments2")
_PARALLEL = "is not supported: a fetched job runs in one slot (no parallel universe)"
_refused(_PARALLEL, "machine_count", "node_count", "NodeCount", "parallel_script_shadow",
         "parallel_script_starter", "rendezvousdir")
_refused("is not supported: the standard universe's remote I/O is gone from HTCondor",
         "file_remaps", "buffer_files", "buffer_size", "buffer_block_size", "fetch_files",
         "compress_files", "append_files", "local_files", "stack_size", "exit_requirements",
         "want_ads")
_refused("is not supported: a fetched job has no tool daemon", "tool_daemon_cmd",
         "tool_daemon_args", "tool_daemon_arguments", "tool_daemon_arguments2",
         "tool_daemon_input", "tool_daemon_error", "tool_daemon_output")
_refused("is not supported: there is no interactive job in the job store",
         "interactive_executable", "interactive_args", "shell")
_refused("is not supported: a pulling slot takes the first job that matches it, in the queue's "
         "order (priority, then fair share); there are no machines for a job to rank",
         "rank", "preferences")
_refused("is not supported: the job store sends no email (leave notification = never)",
         "notification", harmless={"never"})
_refused("is not supported: jobs are queued all at once (bound how many run at once with "
         "concurrency_limits)", "max_materialize", "max_idle", "materialize_max_idle")
_refused("is not supported: a job is claimable as soon as it is idle (no deferral or cron "
         "start times yet)", "deferral_time", "deferral_window", "deferral_prep_time",
         "cron_minute", "cron_hour", "cron_day_of_month", "cron_month", "cron_day_of_week",
         "cron_window", "cron_prep_time")
_refused("is not supported: use accounting_group for a job that should get less of the pool",
         "nice_user", harmless=FALSE_WORDS)
_refused("is not supported: the account a fetched job runs as is decided by the node's hook "
         "configuration", "run_as_owner", harmless=TRUE_WORDS)
_refused("is not supported: a fetched job is stopped with kill_sig (the starter is not told "
         "whether it was held or removed)", "remove_kill_sig", "hold_kill_sig")
_refused("is not supported: the starter would write it as the condor account",
         "starter_log")
_refused("is not supported: a fetched job's attempts report it (use request_memory, "
         "request_disk)", "image_size", "disk_usage", "memory_usage")
_refused("is not supported: the job store's retry of a job is max_retries, with the same "
         "requests", "retry_request_memory", "retry_request_memory_max",
         "retry_request_memory_increase", "retry_request_disk")
_refused("is not supported: the job store matches GPUs by request_gpus only",
         "require_gpus", "gpus_minimum_memory", "gpus_minimum_capability",
         "gpus_maximum_capability", "gpus_minimum_runtime", "cuda_version",
         "request_gpu_memory", "request_gpus_memory")
_refused("is not supported: the job store records no machine attributes of an attempt",
         "job_machine_attrs", "job_machine_attrs_history_length")
_refused("is not supported: the job store sets JobLeaseDuration itself (the hook's lease)",
         "job_lease_duration")
_refused("is not supported: the job store has no schedd that keeps claims, paces starts or "
         "runs no-op jobs", "keep_claim_idle", "next_job_start_delay", "match_list_length",
         "noop_job", "noop_job_exit_signal", "noop_job_exit_code", "suspend_job_at_exec",
         "skip_if_dataflow", "concurrency_limits_expr", "on_evict_checks")
_refused("is not supported: the job store's periodic pass holds, releases or removes a job "
         "(periodic_hold, periodic_release, periodic_remove), it does not vacate one",
         "periodic_vacate")
_refused("is not supported: the job store writes its user log as text, not XML", "log_xml",
         harmless=FALSE_WORDS)
_refused("is not supported: DAGMan's own log is not written by the job store", "dagman_log")
_refused("is not supported: write the arguments in the arguments command (in quotes for the "
         "new syntax)", "arguments2", "environment2")

# Commands that are a prefix and a name: request_<tag> is handled (a custom resource), the
# others refused.
PREFIXES: dict[str, Command] = {
    "request_": Command("request_<tag>", "handled"),
    "require_": Command("require_<tag>", "refused", why="is not supported: the job store "
                        "matches custom resources by request_<tag> only"),
    "ec2_tag_": Command("ec2_tag_<name>", "refused", why=_GRID),
    "ec2_parameter_": Command("ec2_parameter_<name>", "refused", why=_GRID),
    "cloud_label_": Command("cloud_label_<name>", "refused", why=_GRID),
    "remote_": Command("remote_<command>", "refused", why=_GRID),
    "_container_": Command("_container_<port>", "refused", why=_CONTAINER),
}


def lookup(key: str) -> Command | None:
    """The command a submit description's key is, or None for a macro."""
    low = key.lower()
    found = COMMANDS.get(low)
    if found is not None:
        return found
    for prefix, command in PREFIXES.items():
        if low.startswith(prefix) and len(low) > len(prefix):
            return command
    return None


def markdown() -> str:
    """The table as docs/submit-commands.md has it (tests/unit/test_submit_commands.py checks)."""
    lines = ["# Submit commands", "",
             "What the job store does with each of condor_submit's commands (HTCondor 25's",
             "keyword table), generated from `jobstore/submit/commands.py`. A name that is no",
             "command is a macro, as in condor_submit; `+Attr` and `MY.Attr` set attributes.", "",
             "| command | what the job store does |", "|---|---|"]
    rows = [*COMMANDS.values(), *PREFIXES.values()]
    for command in sorted(rows, key=lambda c: c.name.lower()):
        if command.kind == "handled":
            what = "honoured, with condor_submit's meaning"
        elif command.kind == "stored":
            what = f"sets `{command.attribute}` ({command.form}), as condor_submit does"
        else:
            what = f"refused: {(command.why or '').removeprefix('is not supported: ')}"
            if command.harmless:
                what += f" (accepted: {', '.join(sorted(command.harmless))})"
        lines.append(f"| `{command.name}` | {what} |")
    return "\n".join(lines) + "\n"
