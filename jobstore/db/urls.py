"""Database URLs in messages: parsed once, never with their password, always one line."""

from __future__ import annotations

import os

from sqlalchemy import URL
from sqlalchemy.engine import make_url

from jobstore.errors import DatabaseError


def parse_url(url: str) -> URL:
    """`url` parsed, or DatabaseError saying why it is not a database URL."""
    try:
        return make_url(url)
    except Exception:
        raise DatabaseError(url_error(url)) from None


def safe_url(url: str) -> str:
    """The URL with its password masked, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def database_message(exc: BaseException, url: str | URL) -> str:
    """A failed statement in one line, naming the database (never its password)."""
    orig = getattr(exc, "orig", None) or exc
    first = str(orig).strip().splitlines()[0] if str(orig).strip() else type(orig).__name__
    if "no such table" in first or ("relation" in first and "does not exist" in first):
        first += " (not a job store yet? create it with `jobstore init`)"
    return f"database {safe_url(str(url))}: {first}"


def url_error(url: str) -> str:
    """Why `url` is not a database URL, with the URL a path would have been meant as."""
    text = url.strip()
    if text.startswith("/") or text.endswith((".db", ".sqlite", ".sqlite3")):
        path = os.path.abspath(text)
        return (f"{text!r} is a path, not a database URL: for SQLite say sqlite:///{path}")
    return "the database URL cannot be parsed (postgresql://USER@HOST/DB or sqlite:////PATH)"
