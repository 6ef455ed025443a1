"""Why a job is held: HTCondor's HoldReasonCode values (condor_holdcodes.h), the ones the job
store gives."""

from __future__ import annotations

UNSPECIFIED = 0
USER_REQUEST = 1  # condor_hold, jobstore hold
JOB_POLICY = 3  # periodic_hold, on_exit_hold
JOB_POLICY_UNDEFINED = 5  # a policy expression could not be evaluated (too costly)
FAILED_TO_CREATE_PROCESS = 6  # the executable cannot be run (subcode: errno)
UNABLE_TO_OPEN_INPUT = 8  # the job's `input` cannot be read (subcode: errno)
TRANSFER_OUTPUT_ERROR = 12  # the job's outputs could not be sent back (file transfer)
TRANSFER_INPUT_ERROR = 13  # the job's inputs could not be put in its sandbox (file transfer)
IWD_ERROR = 14  # the job's initial directory cannot be entered (subcode: errno)
SUBMITTED_ON_HOLD = 15  # the submit command `hold = true`
MAX_TRANSFER_INPUT_SIZE_EXCEEDED = 32  # its inputs are more than its MaxTransferInputMB
MAX_TRANSFER_OUTPUT_SIZE_EXCEEDED = 33  # its outputs are more than its MaxTransferOutputMB
STARTD_HELD_JOB = 21  # the startd or starter put the job on hold (JOB_EXIT hold)
FAILED_TO_ACCESS_USER_ACCOUNT = 23  # the job's owner may not run jobs on the node
JOB_DURATION_EXCEEDED = 46  # allowed_job_duration
JOB_EXECUTE_EXCEEDED = 47  # allowed_execute_duration
