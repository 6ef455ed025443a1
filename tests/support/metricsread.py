"""Reading the metrics the agent serves: a free loopback port to serve them on (`free_port`) and
every sample of the text it serves (`samples`)."""

from __future__ import annotations

import socket

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and sorted labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
