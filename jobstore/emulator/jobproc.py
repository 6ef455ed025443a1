"""The job's command line, environment and resource usage, as the starter computes them."""

from __future__ import annotations

import os
from dataclasses import dataclass

from jobstore.errors import InvalidInput


def parse_args_v2(text: str) -> list[str]:
    """HTCondor "new" argument syntax: whitespace separates, '...' groups, '' is a quote."""
    args: list[str] = []
    cur: str | None = None
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            if cur is not None:
                args.append(cur)
                cur = None
            i += 1
        elif c == "'":
            cur = cur or ""
            i += 1
            while True:
                if i >= len(text):
                    raise InvalidInput(f"unterminated quote in arguments: {text!r}")
                if text.startswith("''", i):
                    cur += "'"
                    i += 2
                elif text[i] == "'":
                    i += 1
                    break
                else:
                    cur += text[i]
                    i += 1
        else:
            cur = (cur or "") + c
            i += 1
    if cur is not None:
        args.append(cur)
    return args


def parse_args_v1(text: str) -> list[str]:
    """Old `Args`: plain whitespace-separated words."""
    return text.split()


def parse_env_v2(text: str) -> dict[str, str]:
    """New `Environment`: space-separated NAME=value, values may be single-quoted."""
    env: dict[str, str] = {}
    for word in parse_args_v2(text):
        name, sep, value = word.partition("=")
        if not sep or not name:
            raise InvalidInput(f"bad environment entry {word!r}")
        env[name] = value
    return env


def parse_env_v1(text: str) -> dict[str, str]:
    """Old `Env`: `;`-separated NAME=value."""
    env: dict[str, str] = {}
    for entry in text.split(";"):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, value = entry.partition("=")
        if not sep or not name:
            raise InvalidInput(f"bad environment entry {entry!r}")
        env[name] = value
    return env


@dataclass
class Usage:
    num_pids: int = 0
    image_kib: int = 0
    rss_kib: int = 0
    user_cpu: float = 0.0
    sys_cpu: float = 0.0


_TICKS = os.sysconf("SC_CLK_TCK")


def sample_usage(pgid: int) -> Usage:
    """Sum the usage of the processes in the job's process group (its family)."""
    usage = Usage()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            if int(fields[2]) != pgid:
                continue
            usage.num_pids += 1
            usage.user_cpu += int(fields[11]) / _TICKS
            usage.sys_cpu += int(fields[12]) / _TICKS
            with open(f"/proc/{entry}/status") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key == "VmPeak":
                        usage.image_kib += int(rest.split()[0])
                    elif key == "VmHWM":
                        usage.rss_kib += int(rest.split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return usage
