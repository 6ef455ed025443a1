"""The six hooks in one table that every part reads (hooks, agent, peer checks, templates,
emulator, tests): our executable's name, HTCondor's name, the daemon that runs it (and so the
account: condor for the startd, the job's user for the starter), whether HTCondor reads its
stdout and stderr (the others run with fds 1 and 2 closed), and the deadline after which the
hook gives up. Imports nothing: the hooks' hot path reads it.
"""

from __future__ import annotations

# (ours, HTCondor's, daemon, output read, deadline in seconds). JOB_EXIT must end well inside
# the starter's 30 s timeout; FETCH_WORK has no timeout in HTCondor, so ours is what keeps a slot
# from hanging (JOBSTORE_FETCH_DEADLINE can shorten it).
TABLE = (
    ("fetch_job", "FETCH_WORK", "startd", True, 10.0),
    ("reply_fetch", "REPLY_FETCH", "startd", False, 20.0),
    ("evict_claim", "EVICT_CLAIM", "startd", False, 20.0),
    ("prepare_job", "PREPARE_JOB", "starter", True, 20.0),
    ("update_job_info", "UPDATE_JOB_INFO", "starter", False, 20.0),
    ("job_exit", "JOB_EXIT", "starter", True, 20.0),
)

NAMES = tuple(row[0] for row in TABLE)
CONDOR_NAMES = {row[0]: row[1] for row in TABLE}  # ours -> HTCondor's
BY_CONDOR_NAME = {row[1]: row[0] for row in TABLE}  # HTCondor's -> ours
STARTD_HOOKS = frozenset(row[0] for row in TABLE if row[2] == "startd")
STARTER_HOOKS = frozenset(row[0] for row in TABLE if row[2] == "starter")
# HTCondor's names of the hooks whose stdout and stderr HTCondor captures.
OUTPUT_HOOKS = frozenset(row[1] for row in TABLE if row[3])
DEADLINES = {row[0]: row[4] for row in TABLE}
DEFAULT_DEADLINE = 20.0
# A FETCH_WORK that the agent lets wait for work (JOBSTORE_FETCH_WAIT, at most FETCH_WAIT_LIMIT)
# has its deadline moved by the agent's `hold`, never past FETCH_HOLD_LIMIT from its start.
FETCH_WAIT_LIMIT = 120.0
FETCH_HOLD_LIMIT = FETCH_WAIT_LIMIT + DEADLINES["fetch_job"]
