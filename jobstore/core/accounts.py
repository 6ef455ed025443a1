"""Which uids are ordinary accounts: what a job may run as, and what root may act as."""

from __future__ import annotations

# The lowest uid of an ordinary account (Debian's and Red Hat's UID_MIN).
MIN_USER_UID = 1000
NOBODY_UID = 65534


def ordinary_uid(uid: int) -> bool:
    """Is `uid` an ordinary account's (not root's, a system account's or nobody's)?"""
    return MIN_USER_UID <= uid < NOBODY_UID
