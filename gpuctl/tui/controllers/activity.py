"""What other gpuctl sessions did while this screen watched: every few seconds the audit log
(``gpuctl.audit``: this user's, or the site's shared one the config names) is looked at for new
entries, and each action another session took (a burn started or stopped, a process signalled,
an acceptance run, a drain) is said in a notification. A read-only session, which cannot act,
sees what those who can are doing; its own actions are not repeated back to it."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gpuctl import audit, service

if TYPE_CHECKING:
    from gpuctl.tui.app import GpuctlApp

LOOK_EVERY_S = 2.0  # how often the log is looked at (a stat; a read only when it grew)
SAID_AT_ONCE = 3  # notifications for one look; more are counted in one more
SERIOUS = ("stress_start", "signal", "drain")  # said as warnings


class ActivityController:
    """Follows the audit log of ``app``'s session and tells ``app`` of others' actions."""

    def __init__(self, app: GpuctlApp) -> None:
        self.app = app
        self.follow = audit.Follow(audit.log_path())
        self.seen: list[audit.Entry] = []  # others' entries said so far, oldest first
        self._looking = False

    def start(self) -> None:
        self.app.set_interval(LOOK_EVERY_S, self.look, name="activity")
        self.app.run_worker(self.look(), name="activity", group="activity")  # the log's end

    async def look(self) -> None:
        """One look at the log (in a thread: a shared log may sit on a slow file system)."""
        if self._looking:
            return
        self._looking = True
        try:
            entries = await asyncio.to_thread(self.follow.new)
        finally:
            self._looking = False
        mine = service.me().session
        others = [e for e in entries if e.session != mine]
        self.seen.extend(others)
        del self.seen[:-100]
        for e in others[:SAID_AT_ONCE]:
            self.app.notify(
                e.words(), severity="warning" if e.action in SERIOUS else "information", timeout=8
            )
        if len(others) > SAID_AT_ONCE:
            self.app.notify(
                f"{len(others) - SAID_AT_ONCE} more actions by others: gpuctl audit lists them",
                timeout=8,
            )
