"""A backend's hand-written SQL statements: its queries.sql, parsed once, each by its name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib.resources import files

from sqlalchemy import TextClause, text

from jobstore.errors import InvalidInput


@dataclass(frozen=True)
class Statement:
    """One named statement of a queries.sql."""

    name: str
    purpose: str  # its comment lines
    sql: str  # without the trailing semicolon

    @property
    def clause(self) -> TextClause:
        return text(self.sql)


_NAME = re.compile(r"^-- name: (\w+)\n", re.M)


def parse(source: str) -> dict[str, Statement]:
    """The statements of a queries.sql text, by name: the comment lines after `-- name:` are the
    purpose, the SQL runs to the first line that ends with `;`; whatever follows (a comment about
    the next statements) is not part of it. InvalidInput for a statement without either."""
    found: dict[str, Statement] = {}
    parts = _NAME.split(source)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = body.strip().splitlines()
        lead = next((i for i, ln in enumerate(lines) if not ln.startswith("--")), len(lines))
        end = next((i for i in range(lead, len(lines)) if lines[i].rstrip().endswith(";")), -1)
        purpose = " ".join(ln[2:].strip() for ln in lines[:lead])
        sql = "\n".join(lines[lead : end + 1]).strip().rstrip(";")
        if not purpose or not sql or name in found:
            raise InvalidInput(f"queries.sql: statement {name} needs a purpose, SQL and one name")
        found[name] = Statement(name, purpose, sql)
    return found


def load(package: str) -> dict[str, Statement]:
    """The statements of `package`'s queries.sql (a backend's)."""
    return parse(files(package).joinpath("queries.sql").read_text(encoding="utf-8"))
