"""The HTTP client of the Prometheus reader (``gpuctl.fleet.prom``): one store's HTTP API asked
over aiohttp, bounded.

- **One answer is bounded in bytes and time.** The body is read as it comes, counted, and the
  read stops at ``max_answer`` bytes (``prometheus_max_answer``, 64 MiB by default: a poll at
  16,384 GPUs answers 6.3 MB in all): an answer past it is refused in one line naming the
  setting, never held whole (one of 256 MiB took 1.6 GB of RSS when it was read whole, one of
  1 GiB ended in ``MemoryError``). Every request has a total timeout over the connect, the
  request and the whole answer (aiohttp's ``ClientTimeout(total=...)``), cut to what is left of
  its poll's deadline (``post``'s ``deadline``): a store that answers a byte every few seconds
  (a socket timeout per read never fires) ends the poll at its deadline, and cancelling a poll
  (``q`` in the screen, the fleet stopping) closes its connections at once (no thread is left
  blocked in a read, as urllib's were).
- **No redirect is followed** (it would carry the Authorization header to wherever it points):
  the 3xx is one line naming where it points.
- **TLS**: the system's CAs or ``prometheus_ca``'s, the host name checked; an untrusted
  certificate, one for another name, a server not speaking TLS are each one line.
- **Credentials** (a bearer token or a user's password) are read from files that must be the
  user's (or root's) and readable by no other user, as ``export --auth-file`` requires
  (``gpuctl.config.files.unsafe_secret``), in folders no other user can write
  (``gpuctl.config.files.unsafe_folder``); they are not sent over plain ``http://`` to a host not on
  loopback unless ``prometheus_allow_plain_http_credentials = true``.
- The body is asked uncompressed (``Accept-Encoding: identity``, as urllib asked it): a
  compressed answer would be inflated past the cap a chunk at a time before it is counted.

Where it runs: on an event loop of its own on a daemon thread (``PromHttp.call``), as urllib's
requests ran in threads: the screen's loop paces its waits for I/O (20 ms), which would pace
every read of an answer, and decoding an answer there would hold the screen. A poll awaits its
requests there, and cancelling the poll cancels them (their connections closed).
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import msgspec

from gpuctl.config.files import unsafe_folder, unsafe_secret

if TYPE_CHECKING:
    from gpuctl.config import PrometheusConfig

T = TypeVar("T")
CHUNK = 1 << 16  # an answer is read this much at a time at most


class PromError(Exception):
    """The store could not be read; ``reason``: unreachable, tls, auth, redirect, no_match,
    sample_limit, bad_query, protocol, too_large, config. ``str()`` is one line for a person,
    and never holds a token or password (they travel in a header no message quotes)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class ErrorReply(msgspec.Struct):
    """The body of an error answer (``{"status": "error", "errorType": ..., "error": ...}``)."""

    status: str = "error"
    errorType: str | None = None
    error: str | None = None


_ERROR = msgspec.json.Decoder(ErrorReply)


def check_url(url: str, name: Callable[[str], str] = str) -> str:
    """``url`` without a trailing slash; raises PromError(config) unless it is http(s)://host
    (``name``: how the line names a setting, ``PrometheusConfig.name``)."""
    parts = urllib.parse.urlsplit(url.strip())
    if "@" in parts.netloc:  # user:password@host: every line naming the store (errors, the
        # detail screen, ``describe``) would show the password
        raise PromError(
            "config",
            f"a Prometheus URL must not hold a user or password: set {name('prometheus_user')} "
            f"and {name('prometheus_password_file')} (or {name('prometheus_token_file')}) instead",
        )
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise PromError(
            "config",
            f"a Prometheus URL is http(s)://host:port, e.g. http://prom:9090 (not {url!r})",
        )
    return url.strip().rstrip("/")


def read_secret(path: str, what: str, name: str) -> str:
    """The secret in ``path`` (``what``: "token", "password"; ``name``: the setting that named
    the file), stripped; raises PromError(config) in one line that names the file, never its
    text: a file that cannot be read, is empty, or that another user could read or change (the
    file's owner and mode as ``export --auth-file`` requires them, and its folders)."""

    def refuse(why: str) -> PromError:
        return PromError("config", f"the Prometheus {what} file {path} ({name}): {why}")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise PromError(
            "config", f"cannot read the Prometheus {what} file {path} ({name}): {e.strerror or e}"
        ) from None
    try:
        unsafe = unsafe_secret(os.fstat(fd), path)
        if unsafe is not None:
            raise refuse(unsafe)
        unsafe = unsafe_folder(path)
        if unsafe is not None:
            raise refuse(unsafe)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(1 << 16)
    except OSError as e:
        raise refuse(f"cannot read it: {e.strerror or e}") from None
    finally:
        os.close(fd)
    try:
        text = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise refuse("not UTF-8 text") from None
    if not text:
        raise PromError("config", f"the Prometheus {what} file {path} ({name}) is empty")
    return text


def loopback(host: str | None) -> bool:
    """Whether ``host`` (a URL's) is this machine: ``localhost`` or a loopback address."""
    if not host:
        return False
    if host.lower() in ("localhost", "localhost.") or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# X509_V_ERR_HOSTNAME_MISMATCH, X509_V_ERR_IP_ADDRESS_MISMATCH: a certificate for another name
_NAME_MISMATCH = (62, 64)


def _ssl_cause(e: BaseException) -> ssl.SSLError | None:
    """The TLS error behind an aiohttp exception, if one is."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        x = todo.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, ssl.SSLError) and not isinstance(x, aiohttp.ClientError):
            return x  # (aiohttp's TLS errors are ssl.SSLError too, without its fields)
        todo += [
            getattr(x, "certificate_error", None),
            getattr(x, "os_error", None),
            x.__cause__,
            x.__context__,
        ]
    return None


class PromHttp:
    """POSTs to one store's HTTP API, each answer's body returned whole as bytes, bounded (see
    the module's doc). Raises PromError, one line.

    Tested against Debian's Prometheus 2.42 serving https (``--web.config.file``'s
    ``tls_server_config``) with basic auth, behind a proxy that asks for a bearer token
    (``gpuctl_tests/fleet/test_prom_tls.py``), and against stand-in stores that answer too much,
    too slowly or oddly (``gpuctl_tests/fleet/test_prom_bounds.py``)."""

    def __init__(self, target: PrometheusConfig) -> None:
        self.target = target
        self.base = check_url(target.url, target.name)
        self.max_answer = target.max_answer
        self.headers = {
            "Accept": "application/json",
            "Accept-Encoding": "identity",
            "User-Agent": "gpuctl",
        }
        if target.token_file:
            token = read_secret(target.token_file, "token", target.name("prometheus_token_file"))
            self.headers["Authorization"] = f"Bearer {token}"
        elif target.user:
            password = (
                read_secret(
                    target.password_file, "password", target.name("prometheus_password_file")
                )
                if target.password_file
                else ""
            )
            pair = base64.b64encode(f"{target.user}:{password}".encode()).decode()
            self.headers["Authorization"] = f"Basic {pair}"
        parts = urllib.parse.urlsplit(self.base)
        if (
            "Authorization" in self.headers
            and parts.scheme == "http"
            and not loopback(parts.hostname)
            and not target.allow_plain_http_credentials
        ):
            what = "token" if target.token_file else "password"
            raise PromError(
                "config",
                f"Prometheus at {self.base} is plain http: the {what} would cross the network "
                f"readable by anyone on the way; use https://, or set "
                f"prometheus_allow_plain_http_credentials = true in the cluster's table if "
                "that network is trusted",
            )
        self.context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self.context = ssl.create_default_context(cafile=target.ca)
            except OSError as e:  # ssl.SSLError too: not PEM ("no certificate or crl found")
                why = e.strerror if e.strerror and not isinstance(e, ssl.SSLError) else e
                raise PromError(
                    "config",
                    f"cannot read the Prometheus CA file {target.ca} "
                    f"({target.name('prometheus_ca')}): {why}",
                ) from None
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the I/O thread's (``_io``)
        self._lock = threading.Lock()

    def _io(self) -> asyncio.AbstractEventLoop:
        """The client's own event loop, on a daemon thread of its own, started at the first
        request (and again after ``aclose``). Requests and decoding run there, as urllib's
        did in threads: not on the screen's loop, whose waits for I/O are paced
        (``gpuctl.fleet.eventloop``: 20 ms, which made each read of an answer wait: a poll
        of 512 hosts took 0.54 s median against urllib's 0.27 s; on this thread 0.38 s
        against 0.43 s, p95 0.65 s against 1.65 s, CPU 0.069 against 0.083 s a poll, one
        round of 6 polls each of ``benchmarks/prom_scale.py --nodes 512 --polls 6
        --baseline``), and not holding it while an answer is decoded. Being a daemon, it never
        keeps the process alive."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    try:
                        loop.run_forever()
                    finally:
                        loop.close()

                threading.Thread(target=run, name="gpuctl-prometheus", daemon=True).start()
                self._loop = loop
            return self._loop

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """``work`` (a request, its decoding) run on the client's I/O thread and awaited here;
        cancelled here (a poll cancelled, ``q``), it is cancelled there: its connection is
        closed."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._io()))

    def _client(self) -> aiohttp.ClientSession:
        """The I/O loop's session (made there: aiohttp's is bound to its loop)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self.context if self.context is not None else True, limit=16
            )
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False
            )
        return self._session

    async def aclose(self) -> None:
        """Close the session (its connections) and end the I/O thread."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return

        async def close() -> None:
            session, self._session = self._session, None
            if session is not None:
                await session.close()

        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(close(), loop))
        finally:
            loop.call_soon_threadsafe(loop.stop)

    def run_blocking(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` run to its end from outside an event loop (``PromSource.discover``,
        before the fleet's loop runs), on a loop of its own (a thread's when this thread runs
        one); the session and the I/O thread are closed after it (a fleet's polls start them
        again)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            in_loop = False
        else:
            in_loop = True

        async def run() -> T:
            try:
                return await work()
            finally:
                await self.aclose()

        if not in_loop:
            return asyncio.run(run())
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, run()).result()

    async def post(
        self, path: str, form: Mapping[str, str], *, deadline: float | None = None
    ) -> bytes | bytearray:
        """The body of the answer to ``form`` POSTed to ``path``, read whole within the
        target's timeout and ``deadline`` (``time.monotonic()``'s), at most ``max_answer``
        bytes. Raises PromError."""
        seconds = self.target.timeout
        if deadline is not None:
            seconds = min(seconds, deadline - time.monotonic())
        query = form.get("query", "")
        if seconds <= 0:
            raise self._late(query)
        try:
            async with self._client().post(
                self.base + path,
                data=dict(form),
                headers=self.headers,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=seconds),
            ) as r:
                if 300 <= r.status < 400:
                    where = r.headers.get("Location") or "elsewhere"
                    raise PromError(
                        "redirect",
                        f"Prometheus at {self.base} redirects to {where} ({r.status}): set "
                        "prometheus to the URL it redirects to (a redirect is not followed: it "
                        "would carry the credentials there)",
                    )
                body = await self._read(r, query)
                if r.status >= 400:
                    raise self._http_error(r.status, r.reason or "", body, query)
                return body
        except PromError:
            raise
        except asyncio.TimeoutError:  # aiohttp's, the builtin one from 3.11 on
            raise self._late(query) from None
        except (aiohttp.ClientError, OSError) as e:
            raise self._reach_error(e) from None

    async def _read(self, r: aiohttp.ClientResponse, query: str) -> bytearray:
        """The answer's body, read as it comes and never past ``max_answer`` bytes."""
        cap = self.max_answer
        if r.content_length is not None and r.content_length > cap:
            raise self._too_large(query, f"says it holds {r.content_length:,} bytes")
        body = bytearray()  # grown in place (msgspec decodes it as is: no copy at the end)
        while True:
            chunk = await r.content.read(min(CHUNK, cap + 1 - len(body)))
            if not chunk:
                return body
            if len(body) + len(chunk) > cap:
                raise self._too_large(query, "goes on past it")
            body += chunk

    def _too_large(self, query: str, how: str) -> PromError:
        return PromError(
            "too_large",
            f"Prometheus at {self.base}: the answer to {query[:80]!r} {how}, over "
            f"prometheus_max_answer ({self.max_answer:,} bytes): "
            f"narrow {self.target.name('prometheus_match')}, or raise that limit (a config key)",
        )

    def _late(self, query: str) -> PromError:
        """An answer not in whole when its poll's deadline (the target's timeout) passed."""
        return PromError(
            "unreachable",
            f"Prometheus at {self.base}: no whole answer to {query[:80]!r} within "
            f"{self.target.timeout:g} s",
        )

    def _reach_error(self, e: BaseException) -> PromError:
        """One line for a connection that failed: TLS (an untrusted certificate, one for
        another name, a server that does not speak TLS) said as such, else unreachable."""
        why = _ssl_cause(e)
        if isinstance(why, ssl.SSLCertVerificationError):
            detail = why.verify_message or why.reason or "verify failed"
            if why.verify_code in _NAME_MISMATCH:
                host = urllib.parse.urlsplit(self.base).hostname
                return PromError(
                    "tls",
                    f"Prometheus at {self.base}: its certificate is not for {host} ({detail}): "
                    "use a name in the URL that the certificate was issued for",
                )
            how = (
                f"it is not signed by a CA in {self.target.name('prometheus_ca')} "
                f"({self.target.ca})"
                if self.target.ca
                else f"set {self.target.name('prometheus_ca')} to the CA bundle that signed it"
            )
            return PromError(
                "tls", f"Prometheus at {self.base}: certificate not trusted ({detail}): {how}"
            )
        if why is not None:
            if why.reason in (
                "WRONG_VERSION_NUMBER",
                "RECORD_LAYER_FAILURE",
                "PACKET_LENGTH_TOO_LONG",
            ):
                return PromError(
                    "tls",
                    f"Prometheus at {self.base} does not answer in TLS ({why.reason}): "
                    "is it http://?",
                )
            return PromError("tls", f"Prometheus at {self.base}: TLS failed ({why.reason or why})")
        os_error = getattr(e, "os_error", e)
        if isinstance(os_error, OSError) and (os_error.errno or os_error.strerror):
            # asyncio's strerror is "Connect call failed (...)": the errno's own words
            text = os.strerror(os_error.errno) if os_error.errno else str(os_error.strerror)
        else:
            text = " ".join(str(e).split())[:300] or type(e).__name__
        return PromError("unreachable", f"cannot reach Prometheus at {self.base}: {text}")

    def _http_error(self, code: int, reason: str, body: bytes | bytearray, query: str) -> PromError:
        if code in (401, 403):
            token, user, password = (
                self.target.name(k)
                for k in ("prometheus_token_file", "prometheus_user", "prometheus_password_file")
            )
            how = (
                f"check {token} / {user} and {password}"
                if "Authorization" in self.headers
                else f"set {token}, or {user} and {password}"
            )
            return PromError(
                "auth", f"Prometheus at {self.base} refused us ({code} {reason}): {how}"
            )
        try:
            err = _ERROR.decode(body)
        except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
            err = ErrorReply(error=body[:200].decode(errors="replace").strip() or reason)
        text = " ".join((err.error or reason).split())[:300]
        if "too many samples" in text:
            return PromError(
                "sample_limit",
                f"Prometheus at {self.base} refused the query as over its sample limit "
                f"(--query.max-samples): narrow {self.target.name('prometheus_match')}, or "
                f"raise that limit ({text})",
            )
        if "HTTP request to an HTTPS server" in text:  # Go's answer to plain http
            return PromError(
                "tls", f"Prometheus at {self.base} answers https only: use https:// ({text})"
            )
        if err.errorType == "bad_data":
            return PromError(
                "bad_query",
                f"Prometheus at {self.base} cannot parse {query!r}: {text}; "
                f"check {self.target.name('prometheus_match')}",
            )
        return PromError("protocol", f"Prometheus at {self.base} answered {code}: {text}")
