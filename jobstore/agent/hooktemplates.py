"""The hook executables: their text, and installing them where HTCondor can run them."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from jobstore.node.hooktable import CONDOR_NAMES, NAMES

REPO_SHEBANG = "#!/usr/bin/env python3"


def hook_text(
    name: str,
    python: str = REPO_SHEBANG[2:],
    *,
    package_root: str | None = None,
    agent_socket: str | None = None,
    agent_uids: tuple[int, ...] = (0,),
) -> str:
    """The source of hook `name`: a thin client of the jobstore agent (falls back to the direct
    handlers when no agent runs). LF line endings, since a CRLF shebang cannot be executed.

    With `package_root` (where the `jobstore` package of `python` lives) the hook runs with
    `-sS`: no site import, so the hot path costs little more than the interpreter's start.
    """
    flags = " -sS" if package_root else ""
    path_line = f"sys.path.insert(0, {package_root!r})\n" if package_root else ""
    return (
        f"#!{python}{flags}\n"
        f'"""HTCondor {CONDOR_NAMES[name]} hook of htcondor-jobstore (generated)."""\n'
        "import sys\n"
        "\n"
        f"{path_line}"
        "try:\n"
        "    from jobstore.agent.client import main\n"
        "except ImportError as exc:  # the wrong interpreter: say so in one line, print nothing\n"
        "    if sys.stderr is not None:\n"
        '        print(f"jobstore hook: cannot import jobstore ({exc})", file=sys.stderr)\n'
        "    raise SystemExit(0) from None\n"
        "\n"
        f"main({name!r}, {agent_socket!r}, {tuple(agent_uids)!r})\n"
    )


def _compile_client() -> None:
    """Byte-compile the hot-path modules now, so that no hook has to (job users cannot write
    the package's __pycache__)."""
    import py_compile

    import jobstore
    from jobstore.agent import client, protocol
    from jobstore.node import hookproc, hooktable

    hot_path = (jobstore, sys.modules["jobstore.agent"], sys.modules["jobstore.node"], hooktable,
                hookproc, client, protocol)
    for module in hot_path:
        if module.__file__ is None:
            continue
        try:
            py_compile.compile(module.__file__, doraise=True)
        except (OSError, py_compile.PyCompileError):
            pass


def install_hooks(
    directory: str | Path,
    python: str | None = None,
    agent_socket: str | None = None,
    agent_users: tuple[str, ...] = (),
) -> dict[str, str]:
    """Write the six hooks into `directory` with `python` as interpreter (default: this one)
    and `agent_socket` as the agent's socket (default: $JOBSTORE_AGENT_SOCKET when the hook
    runs, else the documented default). The hooks trust a socket only if root, the installing
    account or one of `agent_users` (names or uids) serves it.

    Returns HTCondor hook name -> path. Refuses a world-writable directory, as HTCondor would.
    """
    target = Path(directory).absolute()
    target.mkdir(parents=True, exist_ok=True)
    if target.stat().st_mode & stat.S_IWOTH:
        raise ValueError(f"{target} is world-writable; HTCondor refuses hooks there")
    interpreter = python or sys.executable
    # The package's location is known only for this interpreter; another one imports it the
    # usual way (site-packages).
    package_root = None
    if interpreter == sys.executable:
        package_root = str(Path(__file__).resolve().parents[2])  # where jobstore/ is
    uids = agent_uids(agent_users)
    _compile_client()
    paths = {}
    for name in NAMES:
        path = target / name
        tmp = path.with_suffix(".tmp")
        text = hook_text(
            name, interpreter, package_root=package_root, agent_socket=agent_socket,
            agent_uids=uids,
        )
        tmp.write_text(text, encoding="utf-8")
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        paths[CONDOR_NAMES[name]] = str(path)
    return paths


def agent_uids(names: tuple[str, ...]) -> tuple[int, ...]:
    """root, this account and the accounts `names`: those whose socket the hooks trust."""
    import pwd

    uids = [0, os.geteuid()]
    for name in names:
        try:
            uids.append(int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise ValueError(f"no account {name!r}") from None
    return tuple(sorted(set(uids)))
