"""The screen in a browser: textual-serve runs one gpuctl screen per browser session.

The URL printed at start carries the server's token (``/?token=...``). No cookie carries it:
cookies are scoped by host, not port, so a cookie of ``127.0.0.1`` goes to every other service
on 127.0.0.1 (another user's listener, a tunnelled port, a dev server), each of which could then
open this screen. Instead the page's own script takes the token from the address bar, keeps it
in the tab's ``sessionStorage`` (per origin, so per port: only this server's pages read it),
strips it from the address bar (``history.replaceState``) and hands it to the websocket in the
websocket's URL; a reload of the tab uses the stored copy. The page is sent with
``Referrer-Policy: no-referrer`` and ``Cache-Control: no-store``. Every request needs the token
but the page's static files and a delivery's one-time ``/download/<key>`` (a uuid4: 122 random
bits): the page without it is a 403 that says to open the printed URL (its script still finds a
reloaded tab's token), and ``/ws`` without it starts nothing.
The websocket also refuses an ``Origin`` other than the page's own.

Each websocket is a whole ``gpuctl`` screen (a process and its fleet: one agent per node per
tab), so there are at most ``max_sessions`` at once (a 503 that says so beyond it), and the
terminal size the browser asks for, on connect and on resize, is clamped to ``MAX_WIDTH`` x
``MAX_HEIGHT`` (``?width=20000&height=20000`` took one session past 2.2 GB). Measured with
``benchmarks/serve_sessions.py`` (demo, 6 nodes x 8 GPUs, RSS of the server and its screens):
1 tab 158 MB, 10 tabs 684 MB (the server itself 75 MB: each tab is ~58 MB more), one tab asking
20000 x 20000 now 162 MB. One fleet shared by all tabs would need the screens in one process
(textual-serve runs one process per websocket): not done.

The page is gpuctl's own (no web fonts or anything else fetched from outside this server), and
the websocket's URL is built from the ``Host`` the browser asked for, so a tunnel to another
local port (``ssh -L 9000:...:8000``) works. The access log is off: the token is in the first
request's URL and in the websocket's.
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

from aiohttp import WSMsgType, web

log = logging.getLogger("gpuctl.serve")

DEFAULT_MAX_SESSIONS = 4
# A 4K screen at the page's smallest font (6 px) is about 640 x 270 cells; a 1920 x 1080 one at
# the default 16 px about 200 x 55.
MAX_WIDTH, MAX_HEIGHT = 640, 270
PARENT_ENV = "GPUCTL_SERVE_PARENT"  # set for each session: the pid of the gpuctl serve it serves
PAGE_FOLDER = Path(__file__).parent / "web"
DENIED = "gpuctl serve: wrong or missing token: open the URL that gpuctl serve printed\n"
# On every response of ours: the page's URL held the token, and nothing of it is to be kept.
PAGE_HEADERS = {
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
}

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


def full(max_sessions: int) -> str:
    return (
        f"gpuctl serve: {max_sessions} browser sessions are open, the most it allows: close "
        "one, or start gpuctl serve with a larger --max-sessions\n"
    )


def clamp_size(value: Any, default: int, most: int) -> int:
    """A terminal dimension the browser asked for, within 1..``most`` (``default`` when it is
    not a whole number)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return default
    return max(1, min(n, most))


def session_query(request: web.Request) -> dict[str, str]:
    """The websocket's query: the page appends ``?width=..&height=..`` to a URL that already has
    ``?token=..&``, so a ``?`` inside the query separates too. Width and height are clamped."""
    from urllib.parse import parse_qsl

    query = dict(parse_qsl(request.query_string.replace("?", "&")))
    query["width"] = str(clamp_size(query.get("width"), 80, MAX_WIDTH))
    query["height"] = str(clamp_size(query.get("height"), 24, MAX_HEIGHT))
    return query


def _build_server(command: str, token: str, title: str, max_sessions: int) -> Any:
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
            if len(sessions) >= max_sessions:  # checked and counted with no await between
                log.warning("browser session refused: %d open (%s)", len(sessions), request.remote)
                raise web.HTTPServiceUnavailable(text=full(max_sessions))
            task = asyncio.current_task()
            assert task is not None
            sessions.add(task)
            try:
                log.info("browser session started (%s)", request.remote)
                clamped = request.clone(rel_url=request.rel_url.with_query(session_query(request)))
                return await super().handle_websocket(clamped)
            finally:
                sessions.discard(task)
                log.info("browser session ended (%s)", request.remote)

        async def _process_messages(
            self, websocket: web.WebSocketResponse, app_service: Any
        ) -> None:
            """textual-serve's loop, with the size of a ``resize`` clamped like the first one
            and anything but a list of a known type ignored."""
            async for message in websocket:
                if message.type != WSMsgType.TEXT:
                    continue
                try:
                    envelope = message.json()
                except ValueError:
                    continue
                if not isinstance(envelope, list) or len(envelope) < 1:
                    continue
                kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
                if kind == "stdin" and isinstance(data, str):
                    await app_service.send_bytes(data.encode("utf-8"))
                elif kind == "resize" and isinstance(data, dict):
                    await app_service.set_terminal_size(
                        clamp_size(data.get("width"), 80, MAX_WIDTH),
                        clamp_size(data.get("height"), 24, MAX_HEIGHT),
                    )
                elif kind == "ping":
                    await websocket.send_json(["pong", data])
                elif kind == "blur":
                    await app_service.blur()
                elif kind == "focus":
                    await app_service.focus()

        async def _make_app(self) -> web.Application:
            app: web.Application = await super()._make_app()
            app.middlewares.append(_guard(token))
            return app

        async def handle_index(self, request: web.Request) -> web.StreamResponse:
            import aiohttp_jinja2

            given = request.query.get("token")
            denied = not hmac.compare_digest((given or "").encode(), token.encode())
            if len(sessions) >= max_sessions and not (given and denied):  # (a reload: no token)
                return web.Response(status=503, text=full(max_sessions))
            scheme = "wss" if request.secure else "ws"
            size = request.query.get("fontsize", "16")
            context = {
                "font_size": int(size) if size.isdigit() and 6 <= int(size) <= 48 else 16,
                "app_websocket_url": f"{scheme}://{request.host}/ws",
                "config": {"static": {"url": "/static/"}},
                "application": {"name": "gpuctl" if denied else self.title},
                "denied": denied,
                "denied_text": DENIED.strip(),
            }
            response = aiohttp_jinja2.render_template("app_index.html", request, context)
            if denied:  # the page still runs: a reloaded tab finds its token in sessionStorage
                response.set_status(403)
            return response

    return GuardedServer(command, title=title, templates_path=PAGE_FOLDER)


def _guard(token: str) -> Any:
    """Every request needs the token in its query (the page's own check is in ``handle_index``:
    without the token it is the page that says so), but textual-serve's static files and a
    delivery's download, whose one-time key (a uuid4: 122 random bits) is its credential: the
    browser opens it in a new tab, with no token."""
    expected = token.encode()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await _checked(request, handler)
        if not response.prepared:
            response.headers.update(PAGE_HEADERS)
        return response

    async def _checked(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(("/static/", "/download/")) or request.path == "/":
            return await handler(request)
        given = request.query.get("token") or ""
        if not hmac.compare_digest(given.encode(), expected):
            return web.Response(status=403, text=DENIED)
        origin = request.headers.get("Origin")
        if (
            request.path == "/ws"
            and origin is not None
            and origin.split("://", 1)[-1] != (request.host)
        ):
            return web.Response(status=403, text="gpuctl serve: a page of another site\n")
        return await handler(request)

    return guard


async def serve(
    argv: Sequence[str],
    *,
    host: str,
    port: int,
    token: str,
    title: str = "gpuctl",
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    ready: Callable[[str, int], None] = lambda host, port: None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve the screen that ``argv`` starts until ``stop`` is set (or SIGINT/SIGTERM).

    ``ready(host, port)`` is called once the socket listens, with the port it got (``port`` 0
    asks the system for a free one). At most ``max_sessions`` browser sessions at once.
    OSError when the address cannot be bound.
    """
    import shlex

    os.environ[PARENT_ENV] = str(os.getpid())  # textual-serve hands its environment to sessions
    server = _build_server("exec " + shlex.join(argv), token, title, max_sessions)
    app = await server._make_app()
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0]
        # Ctrl-C stops it from the moment the user is told where it is (ready prints that line)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        ready(host, int(bound[1]))
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(sig)
        await runner.cleanup()  # ends every session: each screen is told to quit, then awaited
