"""Jobs as the domain sees them: the typed rows of a job and of an event, and a job to submit."""

from __future__ import annotations

INT32 = 2**31 - 1
INT64 = 2**63 - 1
# The job columns a report may set: name -> (type, lowest, highest). Nothing else, ever.
CHANGE_COLUMNS: dict[str, tuple[type, float, float]] = {
    "job_pid": (int, 1, INT32),
    "remote_user_cpu": (float, 0, 1e12),
    "remote_sys_cpu": (float, 0, 1e12),
    "image_size": (int, 0, INT64),
    "memory_usage": (int, 0, INT64),
    "exit_code": (int, -INT32 - 1, INT32),
    "exit_signal": (int, 0, 1024),
    "exit_by_signal": (bool, 0, 1),
}
