"""Runs one DAG node script and records how it ended: a program of its own, which the access
point's service starts in a session of its own (`python -I -S scriptrunner.py ...`), so that
the script outlives a restarted service and its exit is never lost.

    scriptrunner.py RESULTS TOKEN UID GID DIRECTORY EXECUTABLE [ARGUMENT ...]

As root it stays root (to write RESULTS, root's directory) and runs the script in a child that
becomes UID (with GID and the account's groups) before it enters DIRECTORY, with an
environment of the account's own: the script, its directory and its arguments are the
owner's, and are used only with her rights. RESULTS/TOKEN.pid says it runs;
RESULTS/TOKEN.json, written last, holds the exit (a negative number: killed by that signal)
and why the script could not be started, if it could not. SIGTERM kills the script's process
group. Only the standard library: nothing a user can put on a path is imported.
"""

import json
import os
import pwd
import signal
import sys

PATH = "/usr/local/bin:/usr/bin:/bin"
CANNOT_RUN = 127  # the exit of a script that could not be started


def main(argv: list[str]) -> int:
    results, token, uid_text, gid_text, directory, *command = argv
    uid, gid = int(uid_text), int(gid_text)
    pidfile = os.path.join(results, token + ".pid")
    fd = os.open(pidfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    account = pwd.getpwuid(uid if uid >= 0 else os.getuid())
    env = {"PATH": PATH, "HOME": account.pw_dir, "USER": account.pw_name,
           "LOGNAME": account.pw_name, "LANG": "C.UTF-8"}
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read_end)
        _exec(uid, gid, account.pw_name, directory, command, env, write_end)
    os.close(write_end)
    signal.signal(signal.SIGTERM, lambda _sig, _frame: _kill(child))
    error = b""
    while chunk := os.read(read_end, 4096):
        error += chunk
    os.close(read_end)
    while True:
        try:
            _pid, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            status = CANNOT_RUN << 8
            break
    code = os.waitstatus_to_exitcode(status)
    text = json.dumps({"code": code, "error": error.decode("utf-8", "replace")[:500]})
    tmp = os.path.join(results, token + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    os.write(fd, text.encode())
    os.fsync(fd)
    os.close(fd)
    os.rename(tmp, os.path.join(results, token + ".json"))
    os.unlink(pidfile)
    return 0


def _exec(uid: int, gid: int, name: str, directory: str, command: list[str],
          env: dict[str, str], errors: int) -> None:
    """In the child: become the owner, enter her directory, run her script (never returns)."""
    step = "becoming the owner"
    try:
        os.setpgid(0, 0)
        if uid >= 0:
            os.setgroups(os.getgrouplist(name, gid))
            os.setgid(gid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
                raise PermissionError(1, "the account was not taken")
        step = f"entering {directory}"
        os.chdir(directory)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        step = f"running {command[0]}"
        os.set_inheritable(errors, False)
        os.execve(command[0], command, env)
    except OSError as exc:
        os.write(errors, f"{step}: {exc.strerror or exc}".encode())
    finally:
        os._exit(CANNOT_RUN)


def _kill(child: int) -> None:
    try:
        os.killpg(child, signal.SIGKILL)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
