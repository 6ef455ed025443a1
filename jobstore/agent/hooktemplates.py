"""The hook executables: their text, and installing them where HTCondor can run them."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import sys
from pathlib import Path

from jobstore.errors import InvalidInput
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
    from jobstore.node import directnote, hookproc, hooktable, siblings

    hot_path = (jobstore, sys.modules["jobstore.agent"], sys.modules["jobstore.node"], hooktable,
                hookproc, directnote, siblings, client, protocol)
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
    found = os.lstat(target)
    if not stat.S_ISDIR(found.st_mode):
        raise InvalidInput(f"{target} is not a directory (a symlink?): hooks are not written "
                           "through one")
    if found.st_uid not in (0, os.geteuid()):
        raise InvalidInput(f"{target} belongs to uid {found.st_uid}: hooks go into a directory "
                           "of root's or of the installing account's")
    if found.st_mode & stat.S_IWOTH:
        raise InvalidInput(f"{target} is world-writable; HTCondor refuses hooks there")
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
        text = hook_text(
            name, interpreter, package_root=package_root, agent_socket=agent_socket,
            agent_uids=uids,
        )
        _write_new(target, name, text)
        paths[CONDOR_NAMES[name]] = str(path)
    return paths


def _write_new(directory: Path, name: str, text: str) -> None:
    """Write `name` in `directory` as a new file (O_EXCL|O_NOFOLLOW under a random name, mode
    0755), then rename it over the old one: a symlink planted there is replaced, never
    followed."""
    tmp = directory / f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755)
    try:
        os.fchmod(fd, 0o755)  # whatever the umask
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, directory / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def agent_uids(names: tuple[str, ...]) -> tuple[int, ...]:
    """root, this account and the accounts `names`: those whose socket the hooks trust."""
    import pwd

    uids = [0, os.geteuid()]
    for name in names:
        try:
            uids.append(int(name) if name.isdigit() else pwd.getpwnam(name).pw_uid)
        except KeyError:
            raise InvalidInput(f"no account {name!r}") from None
    return tuple(sorted(set(uids)))
