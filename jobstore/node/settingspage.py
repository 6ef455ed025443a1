"""docs/settings.md, rendered from `settingtable` (`python -m jobstore.node.settingspage`)."""

from __future__ import annotations

import sys

from jobstore.node.settingtable import (
    AGENT_SETTINGS,
    ENVIRONMENT,
    ENVIRONMENT_ONLY,
    KEYWORD,
    KEYWORD_SETTINGS,
    Setting,
)

INTRO = """\
# Settings

<!-- Rendered from jobstore/node/settingtable.py by `make docs`; edit the table, not this page
(a test fails when they differ). -->

Everything below is HTCondor configuration (a file in `condor_config.d/`, as the shipped
`50-jobstore.conf` and `55-jobstore-agent.conf`), read by the hooks, the agent and the
`jobstore` commands alike. The agent reads it once, at its start and again on `condor_reconfig`
(SIGHUP), and hands each call it serves what it read; a hook in direct mode reads it for its
one call. The environment wins over the configuration: HTCondor's own `_CONDOR_<NAME>`
variables for every setting (htcondor2 reads them), and the settings marked *environment*
under their own name too (`$JOBSTORE_SPOOL`), for a node without HTCondor's configuration.
A value that cannot be used stops the reader (the agent at its start, a hook, a command) with
one line naming the parameter, except where a row says otherwise.
"""

KEYWORD_INTRO = """\
## Each hook keyword's

A slot's keyword is resolved as the startd does: `SLOT<N>_JOB_HOOK_KEYWORD` (`slot1_1` for a
dynamic slot), then `SLOT_TYPE_<n>_STARTD_JOB_HOOK_KEYWORD`, then `STARTD_JOB_HOOK_KEYWORD`; the
starter's hooks use the job's `HookKeyword`. Each `JOBSTORE_X` is then read as
`<KEYWORD>_JOBSTORE_X` (a keyword of its own, as in `60-jobstore-two-queues.conf.example`),
then `JOBSTORE_X`, then the HTCondor parameter its row names, then its default.
"""

AGENT_INTRO = """\
## The agent's

One per node, whatever the keywords (`docs/agent.md` says what the agent does).
"""

CONDOR_INTRO = """\
## HTCondor's own, as the job store reads them

Set for HTCondor itself; the job store reads them and never needs them changed.
"""

ENVIRONMENT_INTRO = """\
## The environment only

Read by a hook from the environment the startd gives it (`STARTD_ENVIRONMENT`), or by a
`jobstore` command from its own, never from the configuration. A hook never stops on one: a
value that is no number gives the default, one out of range the nearest bound.
"""

TYPES = {
    "text": "text",
    "path": "path",
    "names": "names",
    "integer": "integer",
    "boolean": "true or false",
    "seconds": "seconds",
    "duration": "duration (`30d`, `12h`, seconds)",
    "attribute names": "attribute names",
    "command": "command line",
    "port": "TCP port",
    "loopback address": "loopback address",
    "vacate time": "expression (seconds)",
    "database url": "SQLAlchemy URL",
}


def _number(value: float) -> str:
    return f"{value:g}" if value != int(value) else str(int(value))


def _type(s: Setting) -> str:
    text = TYPES[s.kind]
    bounds = []
    if s.minimum is not None:
        bounds.append(f"≥ {_number(s.minimum)}")
    elif s.kind == "vacate time":
        bounds.append("not a constant number: the default")
    elif s.kind == "seconds":
        bounds.append("≥ 0" if s.zero else "> 0")
    if s.maximum is not None:
        bounds.append(f"≤ {_number(s.maximum)}" if s.kind == "seconds"
                      else f"more is {_number(s.maximum)}")
    return f"{text}, {', '.join(bounds)}" if bounds else text


def _default(s: Setting) -> str:
    if s.shown is not None:
        return s.shown
    value = s.default
    if value is None or value == ():
        return "—"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ", ".join(f"`{v}`" for v in value)
    if isinstance(value, int | float):
        return f"{_number(value)} {s.unit}".strip()
    return f"`{value}`"


def _name(s: Setting) -> str:
    name = f"`{s.param}`"
    if s.joined:
        name += ", " + ", ".join(f"`{p}`" for p in s.joined)
    if s.fallback:
        name += f" (else `{s.fallback}`)"
    if s.environment:
        name += " (*environment*)"
    return name


def _table(settings: tuple[Setting, ...]) -> str:
    rows = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    rows += [f"| {_name(s)} | {_type(s)} | {_default(s)} | {s.meaning} |" for s in settings]
    return "\n".join(rows) + "\n"


def _condors_own(s: Setting) -> bool:
    return not s.param.startswith("JOBSTORE_")


def render() -> str:
    """The whole page."""
    keyword = tuple(s for s in KEYWORD_SETTINGS if s.scope == KEYWORD)
    agent = tuple(s for s in AGENT_SETTINGS if not _condors_own(s))
    condor = tuple(s for s in KEYWORD_SETTINGS + AGENT_SETTINGS if _condors_own(s))
    environment = tuple(s for s in ENVIRONMENT_ONLY if s.scope == ENVIRONMENT)
    parts = [INTRO, KEYWORD_INTRO, _table(keyword), AGENT_INTRO, _table(agent), CONDOR_INTRO,
             _table(condor), ENVIRONMENT_INTRO, _table(environment)]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.stdout.write(render())
