"""The hook executables: their text, and installing them where HTCondor can run them."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

HOOK_NAMES = (
    "fetch_job",
    "reply_fetch",
    "evict_claim",
    "prepare_job",
    "update_job_info",
    "job_exit",
)
# HTCondor configuration name of each hook: <KEYWORD>_HOOK_<NAME>.
CONDOR_HOOK_NAMES = {
    "fetch_job": "FETCH_WORK",
    "reply_fetch": "REPLY_FETCH",
    "evict_claim": "EVICT_CLAIM",
    "prepare_job": "PREPARE_JOB",
    "update_job_info": "UPDATE_JOB_INFO",
    "job_exit": "JOB_EXIT",
}
REPO_SHEBANG = "#!/usr/bin/env python3"


def hook_text(name: str, python: str = REPO_SHEBANG[2:]) -> str:
    """The source of hook `name`; LF line endings, since a CRLF shebang cannot be executed."""
    return (
        f"#!{python}\n"
        f'"""HTCondor {CONDOR_HOOK_NAMES[name]} hook of htcondor-jobstore (generated)."""\n'
        "import sys\n"
        "\n"
        "try:\n"
        "    from jobstore.hookmain import main\n"
        "except ImportError as exc:  # the wrong interpreter: say so in one line, print nothing\n"
        "    if sys.stderr is not None:\n"
        '        print(f"jobstore hook: cannot import jobstore ({exc})", file=sys.stderr)\n'
        "    raise SystemExit(0) from None\n"
        "\n"
        f'main("{name}")\n'
    )


def install_hooks(directory: str | Path, python: str | None = None) -> dict[str, str]:
    """Write the six hooks into `directory` with `python` as interpreter (default: this one).

    Returns HTCondor hook name -> path. Refuses a world-writable directory, as HTCondor would.
    """
    target = Path(directory).absolute()
    target.mkdir(parents=True, exist_ok=True)
    if target.stat().st_mode & stat.S_IWOTH:
        raise ValueError(f"{target} is world-writable; HTCondor refuses hooks there")
    interpreter = python or sys.executable
    paths = {}
    for name in HOOK_NAMES:
        path = target / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(hook_text(name, interpreter), encoding="utf-8")
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        paths[CONDOR_HOOK_NAMES[name]] = str(path)
    return paths
