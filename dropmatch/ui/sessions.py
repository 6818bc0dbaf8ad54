"""What the server keeps per visitor, and when it lets it go.

Gradio keeps a SessionState per session: a copy of every component's config, the values of every
output it was sent (both columns' HTML, the figures, the replay) and its gr.State values (the run).
Nothing drops one until 10000 sessions exist: a closed tab's gr.State values go an hour after it
closed, the rest stays, and an API client's session is never closed. On a public Space that is
about a megabyte per visitor who never comes back.

The janitor drops a whole session
- CLOSED_GRACE_S after its tab closed (Gradio's unload), unless it was used again since (a tab
  that reconnects after a network blip and goes on keeps its run);
- API_IDLE_S after its last use when no page was ever loaded in it (an API client: /compare keeps
  nothing between calls, so a later call simply starts a new session).
It sweeps on page loads, tab closes and API calls: no thread of its own. (Gradio learns that a tab
closed when its next heartbeat write fails, up to 15 s later.)

It also remembers what a page's user did ("ran", "typed"): the first visit's shipped run is computed once
per server, slowly on a busy one, and must not land over a run the user already pressed or a prompt they
already typed.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import threading

CLOSED_GRACE_S = 60.0
API_IDLE_S = 10.0
M_ARENA_MAX = -8  # glibc's mallopt parameter


class SessionJanitor:
    """Drops the sessions of closed tabs and idle API clients from a Gradio app's state holder."""

    def __init__(self, demo, closed_grace_s: float | None = None, api_idle_s: float | None = None):
        self.demo = demo
        grace = closed_grace_s if closed_grace_s is not None else os.environ.get("DROPMATCH_SESSION_GRACE_S")
        self.closed_grace = datetime.timedelta(seconds=float(grace if grace is not None else CLOSED_GRACE_S))
        self.api_idle = datetime.timedelta(seconds=API_IDLE_S if api_idle_s is None else api_idle_s)
        self.pages: set[str] = set()
        self.closed: dict[str, datetime.datetime] = {}
        self.acts: dict[str, set[str]] = {}
        self.lock = threading.Lock()

    def user_did(self, session: str | None, act: str) -> None:
        """Notes that the user of `session` did `act` ("ran", "typed")."""
        if session:
            with self.lock:
                self.acts.setdefault(session, set()).add(act)

    def done_by(self, session: str | None) -> frozenset[str]:
        """What the user of `session` has done so far."""
        with self.lock:
            return frozenset(self.acts.get(session or "", ()))

    def page_opened(self, session: str | None) -> None:
        if session:
            with self.lock:
                self.pages.add(session)
                self.closed.pop(session, None)
        self.sweep()

    def page_closed(self, session: str | None) -> None:
        if session:
            with self.lock:
                self.closed[session] = datetime.datetime.now()
        self.sweep()

    def sweep(self) -> int:
        """Drops every session that is due; returns how many it dropped."""
        holder = getattr(self.demo, "state_holder", None)
        if holder is None:  # not launched yet
            return 0
        now = datetime.datetime.now()
        with self.lock:
            due = [session for session in list(holder.session_data) if self._due(session, holder, now)]
            for session in due:
                self.pages.discard(session)
                self.closed.pop(session, None)
                self.acts.pop(session, None)
        for session in due:
            _drop(holder, session)
            _drop_queue_entries(getattr(self.demo, "_queue", None), session)
        if due and (libc := _glibc()):
            libc.malloc_trim(0)  # what the sessions held goes back to the system, not to glibc's free lists
        return len(due)

    def _due(self, session: str, holder, now: datetime.datetime) -> bool:
        last_used = holder.time_last_used.get(session, now)
        if session in self.closed:
            closed_at = self.closed[session]
            if last_used > closed_at:  # used again after it closed: a reconnect
                del self.closed[session]
                return False
            return now - closed_at >= self.closed_grace
        return session not in self.pages and now - last_used >= self.api_idle


def _drop(holder, session: str) -> None:
    """The session's gr.State values first (their delete callbacks run), then the session itself."""
    holder.delete_state(session)
    with holder.lock:
        holder.session_data.pop(session, None)
        holder.time_last_used.pop(session, None)


def _drop_queue_entries(queue, session: str) -> None:
    """Gradio's queue keeps a message queue and a set of event ids per session it ever saw; a dropped
    session with no event pending needs neither (a later visit under that hash makes new ones)."""
    if queue is None or queue.pending_event_ids_session.get(session):
        return
    queue.pending_messages_per_session.pop(session, None)
    queue.pending_event_ids_session.pop(session, None)


def cap_malloc_arenas(arenas: int = 2) -> bool:
    """Caps glibc's malloc arenas; True where it applied (glibc), False elsewhere (macOS, Windows, musl).
    Glibc gives each new thread its own arena (up to 8 a core) and what a thread frees stays in its arena,
    so without the cap a server's memory climbs with each of Gradio's worker threads."""
    libc = _glibc()
    return bool(libc and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if libc.gnu_get_libc_version else None
    except (OSError, AttributeError):  # not glibc
        return None
