"""``gpuctl serve``: the screen in a real browser (Debian's chromium driven by selenium), the
token and origin checks over real HTTP, and no session left behind when it stops."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuctl.core.deadline import wait_for
from gpuctl_tests.helpers import require_binary, wait_until

ANSI = re.compile(r"\x1b(\[[0-9;?<>=]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-B]|.)")
# A demo size no other test uses, so the session's process can be told from others.
NODES, GPUS = "2", "3"


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.url.split("/?", 1)[0]

    @property
    def token(self) -> str:
        return self.url.rsplit("token=", 1)[1]


def _sessions() -> list[int]:
    """Pids of the screens that ``gpuctl serve`` started for this test's demo size."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "demo" in words and words[-5:] == ["--nodes", NODES, "--gpus", GPUS, "--read-only"]:
            found.append(int(d.name))
    return found


def _start(*args: str) -> Served:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuctl", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # its first line, printed once it listens (or its error)
    m = re.search(r"(http://\S+)", line)
    if m is None:
        proc.kill()
        pytest.fail(f"gpuctl serve did not print a URL: {line!r}")
    return Served(proc, m.group(1), [line])


@contextlib.contextmanager
def _serving(*more: str) -> Iterator[Served]:
    s = _start("--demo", "--nodes", NODES, "--gpus", GPUS, "--listen", "127.0.0.1:0", *more)
    try:
        yield s
    finally:
        if s.proc.poll() is None:
            s.proc.kill()
        s.proc.wait(10)
        for pid in _sessions():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))  # the sessions' too
    with _serving() as s:
        yield s


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    """(status, body, response headers)."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


def test_every_request_needs_the_token(served: Served) -> None:
    status, body, _ = _get(served.base + "/")
    assert status == 403 and "open the URL that gpuctl serve printed" in body
    assert _get(served.base + "/?token=" + "x" * len(served.token))[0] == 403
    assert _get(served.base + "/ws")[0] == 403
    assert _get(served.base + "/ws?token=" + "x" * len(served.token))[0] == 403
    status, body, headers = _get(served.url)
    assert status == 200
    assert f"ws://{served.base.split('://')[1]}/ws" in body  # the Host the browser asked for
    assert "googleapis" not in body  # nothing fetched from outside this server
    # no cookie: a cookie of 127.0.0.1 goes to every port of it; nothing keeps the token
    assert headers.get("Set-Cookie") is None
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "no-store"
    # the old cookie opens nothing
    assert _get(served.base + "/ws", {"Cookie": f"gpuctl_token={served.token}"})[0] == 403
    # a websocket from a page of another site is refused even with the token
    status, body, _ = _get(
        served.base + "/ws?token=" + served.token, {"Origin": "http://evil.example"}
    )
    assert status == 403 and "another site" in body


def test_prints_the_tunnel_line_and_stops_on_ctrl_c(served: Served) -> None:
    assert served.proc.stdout is not None
    second = served.proc.stdout.readline()
    port = served.base.rsplit(":", 1)[1]
    assert f"ssh -N -L {port}:127.0.0.1:{port} " in second
    assert "read-only" in served.lines[0]
    served.proc.send_signal(signal.SIGINT)
    assert served.proc.wait(15) == 0


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--listen", "0.0.0.0:8000"], "is not a loopback address: anyone who can reach"),
        (["--listen", "127.0.0.1"], "--listen must be HOST:PORT"),
        (["--listen", "127.0.0.1:99999"], "--listen must be HOST:PORT"),
    ],
)
def test_bad_listen_is_one_line(args: list[str], says: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", "serve", "--demo", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and says in r.stderr, r.stderr


def test_a_port_in_use_is_one_line(served: Served) -> None:
    port = served.base.rsplit(":", 1)[1]
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", "serve", "--demo", "--listen", f"127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.startswith(f"gpuctl: cannot listen on 127.0.0.1:{port}: ")
    assert r.stderr.count("\n") == 1, r.stderr


class Browser:
    """Headless chromium on the served page; what the screen sent is read from the
    websocket's frames as the browser received them (Chrome's performance log)."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.frames: list[str] = []

    def poll(self) -> None:
        for entry in self.driver.get_log("performance"):
            msg = json.loads(entry["message"])["message"]
            if msg["method"] != "Network.webSocketFrameReceived":
                continue
            resp = msg["params"]["response"]
            data = resp["payloadData"]
            raw = base64.b64decode(data) if resp["opcode"] == 2 else data.encode()
            self.frames.append(ANSI.sub("", raw.decode("utf-8", "replace")))

    def text_since(self, start: int) -> str:
        self.poll()
        return "".join(self.frames[start:])

    def shows(self, text: str, *, since: int = 0, timeout: float = 30.0) -> None:
        wait_until(lambda: text in self.text_since(since), timeout, f"{text!r} in the browser")

    def press(self, key: str) -> int:
        """Type ``key`` into the terminal; returns the frame count before it."""
        self.poll()
        mark = len(self.frames)
        self.driver.find_element("css selector", ".xterm-helper-textarea").send_keys(key)
        return mark


@pytest.fixture
def browser() -> Iterator[Browser]:
    require_binary("chromium")
    require_binary("chromedriver")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    service = webdriver.ChromeService(executable_path="/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield Browser(driver)
    finally:
        with contextlib.suppress(Exception):  # a test may have closed it already
            driver.quit()


@pytest.mark.slow
def test_the_screen_in_a_real_browser(served: Served, browser: Browser) -> None:
    from selenium.webdriver.common.keys import Keys

    browser.driver.get(served.url)
    browser.shows("sim-02")  # the page loaded, the session started, GPU rows arrived
    assert len(_sessions()) == 1
    # Enter opens the selected GPU; after Escape and one Down, Enter opens the next one.
    mark = browser.press(Keys.ENTER)
    browser.shows("GPU 0", since=mark)
    # (the overview must be back before the next key: ESC then a key at once reads as Alt+key)
    browser.shows("nodes 2/2", since=browser.press(Keys.ESCAPE))
    browser.press(Keys.DOWN)
    mark = browser.press(Keys.ENTER)
    browser.shows("GPU 1", since=mark)
    browser.shows("nodes 2/2", since=browser.press(Keys.ESCAPE))
    # a key that changes nodes is refused: the browser's screen is read-only
    mark = browser.press("s")
    browser.shows("read-only", since=mark)
    # closing the browser ends its screen on the login node
    browser.driver.quit()
    wait_until(lambda: not _sessions(), 30, "the session's gpuctl to end")


@pytest.mark.slow
def test_stopping_serve_ends_open_sessions(served: Served, browser: Browser) -> None:
    browser.driver.get(served.url)
    browser.shows("sim-01")
    pids = _sessions()
    assert len(pids) == 1
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(20) == 0
    assert not _sessions()


@pytest.mark.slow
def test_a_killed_serve_leaves_no_session(served: Served, browser: Browser) -> None:
    browser.driver.get(served.url)
    browser.shows("sim-01")
    (pid,) = _sessions()
    assert int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == (
        served.proc.pid
    )  # its parent is the server itself (exec), not a shell in between
    served.proc.kill()
    served.proc.wait(10)
    wait_until(lambda: not _sessions(), 15, "the session to end with its server")


# -- limits: sessions and terminal sizes --------------------------------------------------------

CUP = re.compile(rb"\x1b\[(\d+);(\d+)H")  # cursor position: the rows a screen draws


async def _screen_rows(ws: Any, seconds: float, *, at_least: int = 0) -> int:
    """The last row the screen drew in what it sent during ``seconds``; with ``at_least``, until
    it drew that row (then 2 s more: the rest of that screen), or 60 s."""
    import aiohttp

    loop = asyncio.get_running_loop()
    end = loop.time() + (60 if at_least else seconds)
    rows = 0
    with contextlib.suppress(TimeoutError):
        while (left := end - loop.time()) > 0:
            msg = await wait_for(ws.receive(), left)
            if msg.type == aiohttp.WSMsgType.BINARY:
                drawn = max((int(m.group(1)) for m in CUP.finditer(msg.data)), default=0)
                if at_least and rows < at_least <= drawn:
                    end = loop.time() + 2
                rows = max(rows, drawn)
            elif msg.type != aiohttp.WSMsgType.TEXT:
                break
    return rows


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode(errors="replace").split("=", 1) for kv in raw if b"=" in kv)


def test_sessions_are_capped_and_the_terminal_size_clamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each websocket is a whole gpuctl screen: the one past --max-sessions is refused with a
    503 that says why (the page too), and the size the client asks for, on connect and on
    resize, is clamped (a 20000 x 20000 screen took one session past 2.2 GB)."""
    aiohttp = pytest.importorskip("aiohttp")
    from gpuctl.tui.serve import MAX_HEIGHT, MAX_WIDTH

    monkeypatch.setenv("GPUCTL_STATE_DIR", str(tmp_path / "state"))
    ws_url = ""

    async def run() -> None:
        async with aiohttp.ClientSession() as client:
            big = f"?width={MAX_WIDTH + 360}&height={MAX_HEIGHT + 30}&token="
            ws = await client.ws_connect(ws_url + big + served.token)
            await _screen_rows(ws, 3)
            (pid,) = _sessions()
            env = _environ(pid)
            assert (env["COLUMNS"], env["ROWS"]) == (str(MAX_WIDTH), str(MAX_HEIGHT))
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await client.ws_connect(ws_url + "?token=" + served.token)
            assert info.value.status == 503
            status, body, _ = await asyncio.to_thread(_get, served.url)
            assert status == 503 and "1 browser sessions are open" in body
            assert "--max-sessions" in body and body.count("\n") == 1
            assert len(_sessions()) == 1
            # a resize to a small screen, then past the limits: the screen drawn is the limit's
            await ws.send_json(["resize", {"width": 100, "height": 30}])
            await _screen_rows(ws, 3)
            await ws.send_json(["resize", {"width": MAX_WIDTH + 360, "height": MAX_HEIGHT + 30}])
            assert await _screen_rows(ws, 0, at_least=MAX_HEIGHT - 20) in range(
                MAX_HEIGHT - 20, MAX_HEIGHT + 1
            )
            await ws.close()

    with _serving("--max-sessions", "1") as served:
        ws_url = served.base.replace("http://", "ws://") + "/ws"
        asyncio.run(run())
        wait_until(lambda: not _sessions(), 30, "the session to end with its websocket")


@pytest.mark.parametrize("value", ["0", "65"])
def test_a_bad_max_sessions_is_one_line(value: str) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", "serve", "--demo", "--max-sessions", value],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "--max-sessions must be within 1..64" in r.stderr, r.stderr


# -- the token stays with gpuctl's page -----------------------------------------------------------


class _Other(http.server.BaseHTTPRequestHandler):
    """Another service on 127.0.0.1 (another user's listener, a dev server): what it was sent."""

    seen: list[tuple[str, dict[str, str]]]

    def do_GET(self) -> None:
        type(self).seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
        body = b"<html><body>another service</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def other_port() -> Iterator[tuple[str, list[tuple[str, dict[str, str]]]]]:
    handler = type("Other", (_Other,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_the_token_reaches_no_other_port(
    served: Served,
    browser: Browser,
    other_port: tuple[str, list[tuple[str, dict[str, str]]]],
) -> None:
    """Cookies are per host, not per port: a cookie that opens the screen would go to every
    service on 127.0.0.1. In the real browser, what another port receives, loaded from the
    page, navigated to from it and typed, carries no credential; the token leaves the address
    bar, and a reload of the tab still opens the screen."""
    other, seen = other_port
    driver = browser.driver
    driver.get(served.url)
    browser.shows("sim-02")
    assert served.token not in driver.current_url and "token" not in driver.current_url
    # sub-resources of gpuctl's page on another port, with credentials where there are any
    driver.execute_script(
        "new Image().src = arguments[0] + '/img';"
        "fetch(arguments[0] + '/fetch', {mode: 'no-cors', credentials: 'include'});",
        other,
    )
    wait_until(lambda: {"/img", "/fetch"} <= {p for p, _ in seen}, 15, "the page's requests")
    # a reload: the screen again, from the tab's own copy of the token
    browser.poll()
    mark = len(browser.frames)
    driver.refresh()
    browser.shows("sim-02", since=mark)
    assert "token" not in driver.current_url
    # the page navigates to the other port, then the user types its address
    driver.execute_script("window.location.href = arguments[0] + '/followed';", other)
    wait_until(lambda: "/followed" in {p for p, _ in seen}, 15, "the navigation")
    driver.get(other + "/typed")
    assert {p for p, _ in seen} >= {"/img", "/fetch", "/followed", "/typed"}
    for path, headers in seen:
        assert "cookie" not in headers, (path, headers)
        assert served.token not in path + repr(headers), (path, headers)


@pytest.mark.slow
def test_a_read_only_browser_screen_does_not_record(served: Served, browser: Browser) -> None:
    """R writes the fleet's stream to the server's disk without bound: not from a read-only
    browser."""
    browser.driver.get(served.url)
    browser.shows("sim-02")
    browser.shows("recording is disabled", since=browser.press("R"))
    state = Path(os.environ["GPUCTL_STATE_DIR"])
    assert not (state / "recordings").exists()
