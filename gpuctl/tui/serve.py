"""The screen in a browser: textual-serve runs one gpuctl screen per browser session.

Every request but the page's own static files needs the token printed at start: in the URL
(``/?token=...``) the first time, then in a cookie (HttpOnly, SameSite=Strict) that the page's
websocket carries. The websocket also refuses an ``Origin`` other than the page's own, so another
site open in the same browser cannot drive the screen. The page is gpuctl's own (no web fonts or
anything else fetched from outside this server), and the websocket's URL is built from the
``Host`` the browser asked for, so a tunnel to another local port (``ssh -L 9000:...:8000``)
works. The access log is off: the token is in the first request's URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import signal
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger("gpuctl.serve")

COOKIE = "gpuctl_token"
PARENT_ENV = "GPUCTL_SERVE_PARENT"  # set for each session: the pid of the gpuctl serve it serves
PAGE_FOLDER = Path(__file__).parent / "web"
DENIED = "gpuctl serve: wrong or missing token: open the URL that gpuctl serve printed\n"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token() -> str:
    return secrets.token_urlsafe(24)


def url_host(host: str) -> str:
    """``host`` as it goes into a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


SERVED_WHY = "this browser screen was started read-only: start it with gpuctl serve --allow-actions"


def served() -> bool:
    """True in a screen that ``gpuctl serve`` runs for a browser (Textual's web driver)."""
    return "web_driver" in os.environ.get("TEXTUAL_DRIVER", "")


def bind_session_to_server() -> None:
    """In a browser session's screen: end with the ``gpuctl serve`` that started it, even when
    that one is killed outright (a session would otherwise keep its fleet's links open with
    nobody watching). The session runs as ``exec gpuctl ...``, so its parent is the server."""
    from gpuctl.node import proc

    parent = os.environ.pop(PARENT_ENV, "")
    if parent.isdigit():
        proc.set_death_signal(signal.SIGTERM, parent=int(parent))


def _build_server(command: str, token: str, title: str) -> Any:
    from textual_serve.server import Server

    sessions: set[asyncio.Task[Any]] = set()

    class GuardedServer(Server):
        def initialize_logging(self) -> None:  # gpuctl's log, not a second handler on stderr
            pass

        async def on_startup(self, app: web.Application) -> None:  # no banner: gpuctl prints
            pass

        async def on_shutdown(self, app: web.Application) -> None:
            """End every session: its handler, cancelled, tells its screen to quit and waits
            for that process to end (aiohttp alone would wait a minute for open websockets)."""
            for task in list(sessions):
                task.cancel()
            await asyncio.gather(*sessions, return_exceptions=True)

        async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
            task = asyncio.current_task()
            assert task is not None
            sessions.add(task)
            try:
                log.info("browser session started (%s)", request.remote)
                return await super().handle_websocket(request)
            finally:
                sessions.discard(task)
                log.info("browser session ended (%s)", request.remote)

        async def _make_app(self) -> web.Application:
            app: web.Application = await super()._make_app()
            app.middlewares.append(_guard(token))
            return app

        async def handle_index(self, request: web.Request) -> web.StreamResponse:
            import aiohttp_jinja2

            scheme = "wss" if request.secure else "ws"
            size = request.query.get("fontsize", "16")
            context = {
                "font_size": int(size) if size.isdigit() and 6 <= int(size) <= 48 else 16,
                "app_websocket_url": f"{scheme}://{request.host}/ws",
                "config": {"static": {"url": "/static/"}},
                "application": {"name": self.title},
            }
            return aiohttp_jinja2.render_template("app_index.html", request, context)

    return GuardedServer(command, title=title, templates_path=PAGE_FOLDER)


def _guard(token: str) -> Any:
    expected = token.encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/static/"):  # textual-serve's own scripts, nothing of ours
            return await handler(request)
        given = request.query.get("token") or request.cookies.get(COOKIE) or ""
        if not hmac.compare_digest(given.encode(), expected):
            return web.Response(status=403, text=DENIED)
        origin = request.headers.get("Origin")
        if (
            request.path == "/ws"
            and origin is not None
            and origin.split("://", 1)[-1] != (request.host)
        ):
            return web.Response(status=403, text="gpuctl serve: a page of another site\n")
        response = await handler(request)
        if "token" in request.query and not response.prepared:
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
        return response

    return guard


async def serve(
    argv: Sequence[str],
    *,
    host: str,
    port: int,
    token: str,
    title: str = "gpuctl",
    ready: Callable[[str, int], None] = lambda host, port: None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve the screen that ``argv`` starts until ``stop`` is set (or SIGINT/SIGTERM).

    ``ready(host, port)`` is called once the socket listens, with the port it got (``port`` 0
    asks the system for a free one). OSError when the address cannot be bound.
    """
    import shlex

    os.environ[PARENT_ENV] = str(os.getpid())  # textual-serve hands its environment to sessions
    server = _build_server("exec " + shlex.join(argv), token, title)
    app = await server._make_app()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        ready(host, int(bound[1]))
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
        await runner.cleanup()  # ends every session: each screen is told to quit, then awaited
