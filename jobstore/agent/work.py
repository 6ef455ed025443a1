"""The agent's queue of requests waiting for a worker thread, with condor's hooks served first.

Service accounts' requests (the startd's and starter's hooks as condor or root) go before any
other; ordinary accounts' requests take turns by uid, and at most `shared` workers serve them at
once, so that however much other users send, a worker is always free for FETCH_WORK.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class WorkQueue(Generic[T]):
    """Thread-safe; `get` blocks until an item may be served, or returns None once closed."""

    def __init__(self, shared: int) -> None:
        self.shared = max(1, shared)
        self._cv = threading.Condition()
        self._service: deque[T] = deque()
        self._others: OrderedDict[int, deque[T]] = OrderedDict()
        self._others_running = 0
        self._closed = False

    def put(self, item: T, uid: int | None) -> None:
        """Queue `item`; `uid` None for a service account's request."""
        with self._cv:
            if uid is None:
                self._service.append(item)
            else:
                self._others.setdefault(uid, deque()).append(item)
            self._cv.notify()

    def get(self) -> tuple[T, int | None] | None:
        """The next item to serve and its uid; call `done(uid)` when it has been served."""
        with self._cv:
            while True:
                if self._closed:
                    return None
                if self._service:
                    return self._service.popleft(), None
                if self._others and self._others_running < self.shared:
                    uid, queue = next(iter(self._others.items()))
                    item = queue.popleft()
                    if queue:
                        self._others.move_to_end(uid)  # the next uid's turn
                    else:
                        del self._others[uid]
                    self._others_running += 1
                    return item, uid
                self._cv.wait()

    def done(self, uid: int | None) -> None:
        if uid is None:
            return
        with self._cv:
            self._others_running -= 1
            self._cv.notify()

    def close(self) -> list[T]:
        """Wake every worker to stop; returns the items never served."""
        with self._cv:
            self._closed = True
            left = list(self._service)
            for queue in self._others.values():
                left.extend(queue)
            self._service.clear()
            self._others.clear()
            self._cv.notify_all()
        return left
