"""A real Prometheus (Debian's ``prometheus`` package) on a free loopback port, and stand-in
DCGM exporters for it to scrape: the parts ``gpuctl.fleet.prom`` reads in the tests.

``StandInExporter`` serves, for one node, text in DCGM exporter's own exposition format and
labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, the driver
version label), the counters of its default set (``etc/default-counters.csv``) plus the clock
event reasons and one ECC counter; a test changes a GPU's values in ``gpus`` and the next scrape
serves them. ``set_jobs`` maps a GPU to Slurm jobs as DCGM exporter's ``--hpc-job-mapping-dir``
does: each of the GPU's series once per job, with an ``hpc_job`` label. ``serving = False``: the
exporter answers with no series (its node left: Prometheus marks them stale at the next
scrape); ``clock`` (a function of no argument, seconds): every sample carries the time it
gives, as a federating or remote-written store's samples do. Prometheus never marks such a
sample stale: with a clock that stands still it keeps answering with that sample, no newer,
for its 5 min lookback. ``set_mig`` puts a GPU
in MIG mode as DCGM exporter's default ("flex") device mode shows one: no series of its own,
each series once per GPU instance with ``GPU_I_PROFILE`` and ``GPU_I_ID`` (before the host
label, as its render_metrics.go template writes them), and no GPU/memory/video utilisation
(DCGM reports none for an instance: GR_ENGINE_ACTIVE instead).

``make_tls`` writes a CA and a server certificate for 127.0.0.1 and localhost (``cryptography``,
which asyncssh requires) for ``prometheus(tls=...)`` to serve https with, and ``BearerProxy``
puts a bearer token in front of a Prometheus (which has no bearer-token server auth of its own),
as a site's reverse proxy does.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuctl_tests.helpers import unavailable

PROMETHEUS = "/usr/bin/prometheus"
# bcrypt of "gpuctl-test" (cost 4): Prometheus's web config takes only bcrypt hashes.
USER, PASSWORD = "ops", "gpuctl-test"
PASSWORD_HASH = "$2b$04$ilUwImCpL8EoJGcmyJCNoO4DZgRlzqC4QIxp1u.86XmOzyJnDaTBy"

# name, type, help: DCGM exporter's default counters (those it exports out of the box), and
# two it leaves commented out that gpuctl reads when a site turns them on.
COUNTERS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "sm_clock"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "mem_clock"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "mem_temp"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "temp"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "power"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Energy since boot (in mJ).", "energy"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "PCIe retries.", "replay"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "util"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", "mem_util"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", "enc"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", "dec"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", "xid"),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "fb_free"),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "fb_used"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", "fb_reserved"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped (uncorr.).", "rr_u"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped (corr.).", "rr_c"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", "rr_f"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Graphics engine active ratio.", "gr"),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge", "Clock event reasons (bitmask).", "events"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Double-bit volatile ECC errors.", "dbe"),
)


def gpu_values(util: int = 10, **changes: Any) -> dict[str, Any]:
    """One GPU's readings as the stand-in serves them (MiB, C, W, MHz, %)."""
    values: dict[str, Any] = {
        "sm_clock": 1980,
        "mem_clock": 2619,
        "mem_temp": 40,
        "temp": 45,
        "power": 120.5,
        "energy": 123456789,
        "replay": 0,
        "util": util,
        "mem_util": 3,
        "enc": 0,
        "dec": 0,
        "xid": 0,
        "fb_free": 80000,
        "fb_used": 1000,
        "fb_reserved": 559,
        "rr_u": 0,
        "rr_c": 0,
        "rr_f": 0,
        "gr": 0.1,
        "events": 0,
        "dbe": 0,
    }
    values.update(changes)
    return values


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def series_labels(
    hostname: str, gpu: int, uuid: str, model: str, instance: tuple[str, str] | None = None
) -> str:
    """A GPU's labels as DCGM exporter writes them (inside the braces); ``instance``: a MIG
    instance's (profile, id)."""
    mig = f',GPU_I_PROFILE="{instance[0]}",GPU_I_ID="{instance[1]}"' if instance else ""
    return (
        f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:{gpu + 7:02X}:00.0",'
        f'device="nvidia{gpu}",modelName="{model}"{mig},Hostname="{hostname}",'
        'DCGM_FI_DRIVER_VERSION="550.54.15"'
    )


# what DCGM does not report for a MIG instance (dcgm-exporter issues 50, 105, 216)
NOT_PER_INSTANCE = ("util", "mem_util", "enc", "dec")


def held_port() -> socket.socket:
    """A loopback port bound and held, not listening (a connection there is refused), for an
    exporter to take over later (``StandInExporter(sock=...)``): a target Prometheus may
    scrape before the exporter exists, and no other socket can take the port meanwhile."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


def serve_metrics(
    body: Callable[[], bytes], port: int = 0, sock: socket.socket | None = None
) -> http.server.ThreadingHTTPServer:
    """An exporter's HTTP side on a loopback port (0: any free one; ``sock``: that bound
    socket's, see ``held_port``): every GET is answered ``body()`` as exposition text, from a
    thread of its own until ``shutdown()``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            text = body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    if sock is None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    else:
        server = http.server.ThreadingHTTPServer(
            sock.getsockname(), Handler, bind_and_activate=False
        )
        server.socket.close()
        server.socket = sock
        server.server_activate()  # listen: from now on a scrape is answered
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class StandInExporter:
    """One node's DCGM exporter: ``/metrics`` in its text format, from ``gpus`` (index ->
    values, see ``gpu_values``), on a loopback port of its own (``port``: one chosen before,
    e.g. a target Prometheus already scrapes while nothing listens there: a node coming up;
    ``sock``: a ``held_port``, the same without a moment when another socket may take it;
    ``clock``: what time its samples carry, from the first scrape on)."""

    def __init__(
        self,
        hostname: str,
        gpus: int = 2,
        model: str = "NVIDIA H100 80GB HBM3",
        port: int = 0,
        sock: socket.socket | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.hostname = hostname
        self.model = model
        self.gpus: dict[int, dict[str, Any]] = {i: gpu_values(10 * (i + 1)) for i in range(gpus)}
        self.jobs: dict[int, list[str]] = {}
        self.mig: dict[int, list[dict[str, Any]]] = {}
        self.serving = True
        self.clock = clock  # the samples' own time (None: none written, the scrape's)
        self.lock = threading.Lock()
        self.server = serve_metrics(lambda: self.text().encode(), port, sock)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def uuid(self, gpu: int) -> str:
        tag = sum(self.hostname.encode()) % 10**8
        return f"GPU-{tag:08d}-0000-0000-0000-{gpu:012d}"

    def set(self, gpu: int, **changes: Any) -> None:
        with self.lock:
            self.gpus[gpu].update(changes)

    def set_jobs(self, gpu: int, *jobs: str) -> None:
        """The Slurm jobs on ``gpu`` now (none: its series lose the ``hpc_job`` label)."""
        with self.lock:
            self.jobs[gpu] = list(jobs)

    def set_mig(self, gpu: int, *instances: dict[str, Any]) -> None:
        """``gpu`` in MIG mode with these GPU instances, each ``{"id": "1", "profile":
        "3g.40gb", ...}`` with its own readings (``fb_used``, ``fb_free``, ``fb_reserved``,
        ``gr``: the rest are the GPU's); none: out of MIG mode."""
        with self.lock:
            self.mig[gpu] = [dict(i) for i in instances]

    def text(self) -> str:
        with self.lock:
            gpus = {i: dict(v) for i, v in self.gpus.items()} if self.serving else {}
            jobs = {i: list(v) for i, v in self.jobs.items()}
            mig = {i: [dict(x) for x in v] for i, v in self.mig.items() if v}
            stamp = "" if self.clock is None else f" {int(self.clock() * 1000)}"
        lines = []
        for name, kind, help_text, key in COUNTERS:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for i, values in sorted(gpus.items()):
                # a MIG GPU: a series per instance, none of those DCGM has no value for
                entities: list[tuple[tuple[str, str] | None, dict[str, Any]]] = (
                    [((x["profile"], x["id"]), {**values, **x}) for x in mig[i]]
                    if i in mig
                    else [(None, values)]
                )
                if i in mig and key in NOT_PER_INSTANCE:
                    continue
                for instance, readings in entities:
                    labels = series_labels(self.hostname, i, self.uuid(i), self.model, instance)
                    for job in jobs.get(i) or [None]:
                        extra = f',hpc_job="{job}"' if job is not None else ""
                        lines.append(f"{name}{{{labels}{extra}}} {readings[key]}{stamp}")
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(frozen=True)
class Tls:
    """PEM files: ``ca`` the CA's certificate (what ``prometheus_ca`` names), ``cert`` and
    ``key`` a server's, signed by that CA, for 127.0.0.1 and localhost."""

    ca: Path
    cert: Path
    key: Path

    def context(self) -> ssl.SSLContext:
        """A client context that trusts ``ca`` (the harness's own requests)."""
        return ssl.create_default_context(cafile=str(self.ca))

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.cert), str(self.key))
        return ctx


def make_tls(
    folder: Path, name: str = "gpuctl test CA", hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
) -> Tls:
    """A new CA (``name``) and a server certificate it signs for ``hosts`` (names or
    addresses), written under ``folder``: a test's own, trusted by nothing else (two calls:
    two CAs that do not trust each other's certificates)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([_alt_name(h) for h in hosts]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    tls = Tls(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    tls.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    tls.key.chmod(0o600)
    return tls


def _alt_name(host: str) -> Any:
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


class BearerProxy:
    """A reverse proxy on a loopback port that lets a request through to ``upstream`` (a
    Prometheus's URL) only with ``Authorization: Bearer <token>`` (401 otherwise), as a site
    puts one in front of its store: Prometheus has no bearer-token server auth of its own.
    With ``tls`` it serves https with that certificate. ``seen`` holds each request's
    Authorization header (None when it had none)."""

    def __init__(
        self, upstream: str, token: str, tls: Tls | None = None, upstream_tls: Tls | None = None
    ) -> None:
        self.seen: list[str | None] = []
        proxy = self
        context = upstream_tls.context() if upstream_tls is not None else None

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                auth = self.headers.get("Authorization")
                proxy.seen.append(auth)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if auth != f"Bearer {token}":
                    self._answer(401, b"Unauthorized\n", "text/plain", bearer=True)
                    return
                req = urllib.request.Request(upstream + self.path, data=body, method=self.command)
                for name in ("Content-Type", "Accept"):
                    if self.headers.get(name):
                        req.add_header(name, self.headers[name])
                try:
                    with urllib.request.urlopen(req, timeout=30, context=context) as r:
                        self._answer(r.status, r.read(), r.headers.get("Content-Type"))
                except urllib.error.HTTPError as e:
                    self._answer(e.code, e.read(), e.headers.get("Content-Type"))

            def _answer(
                self, code: int, text: bytes, kind: str | None, bearer: bool = False
            ) -> None:
                self.send_response(code)
                if bearer:
                    self.send_header("WWW-Authenticate", "Bearer")
                self.send_header("Content-Type", kind or "application/octet-stream")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            do_GET = do_POST = _forward

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.server_context().wrap_socket(
                self.server.socket, server_side=True
            )
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Prometheus:
    """A running ``/usr/bin/prometheus`` with its own config and data folder (https with
    ``tls``: its URL then names 127.0.0.1, which its certificate is for)."""

    def __init__(
        self, proc: subprocess.Popen[bytes], port: int, folder: Path, tls: Tls | None = None
    ) -> None:
        self.proc = proc
        self.port = port
        self.folder = folder
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"

    def log(self) -> str:
        return (self.folder / "log").read_text(errors="replace")[-2000:]

    def query(self, promql: str, auth: str | None = None) -> list[dict[str, Any]]:
        data = urllib.parse.urlencode({"query": promql}).encode()
        req = urllib.request.Request(self.url + "/api/v1/query", data=data)
        if auth:
            req.add_header("Authorization", auth)
        context = self.tls.context() if self.tls is not None else None
        with urllib.request.urlopen(req, timeout=5, context=context) as r:
            result: list[dict[str, Any]] = json.load(r)["data"]["result"]
            return result

    def wait_for(
        self, promql: str, count: int, timeout: float = 30.0, auth: str | None = None
    ) -> None:
        """Poll until ``promql`` gives ``count`` series or more (the first scrapes are in);
        fail naming the log at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if len(self.query(promql, auth)) >= count:
                    return
            except (urllib.error.URLError, OSError, KeyError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"Prometheus never had {count} series of {promql}: {self.log()}"
                )
            time.sleep(0.1)  # a poll interval: the deadline decides


@contextmanager
def prometheus(
    targets: list[str],
    *,
    basic_auth: bool = False,
    max_samples: int | None = None,
    metrics_path: str = "/metrics",
    scrape_interval: float = 1.0,
    tls: Tls | None = None,
) -> Iterator[Prometheus]:
    """Start Prometheus scraping ``targets`` (host:port) every ``scrape_interval`` seconds;
    stop it after. ``basic_auth``: it asks for ``USER`` and ``PASSWORD``; ``tls``: it serves
    https with that certificate (its web config's ``tls_server_config``)."""
    if not Path(PROMETHEUS).exists():
        unavailable(f"{PROMETHEUS} missing: scripts/test.sh installs Debian's prometheus")
    folder = Path(tempfile.mkdtemp(prefix="gpuctl-prom-"))
    target_list = ", ".join(f'"{t}"' for t in targets)
    (folder / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {scrape_interval:g}s\n"
        f"  scrape_timeout: {min(scrape_interval, 10.0):g}s\n"
        "scrape_configs:\n  - job_name: dcgm\n"
        f"    metrics_path: {metrics_path}\n"
        f"    static_configs:\n      - targets: [{target_list}]\n"
    )
    port = free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    web = ""
    if tls is not None:
        web += f"tls_server_config:\n  cert_file: {tls.cert}\n  key_file: {tls.key}\n"
    if basic_auth:
        web += f'basic_auth_users:\n  {USER}: "{PASSWORD_HASH}"\n'
    if web:
        (folder / "web.yml").write_text(web)
        argv.append(f"--web.config.file={folder / 'web.yml'}")
    if max_samples is not None:
        argv.append(f"--query.max-samples={max_samples}")
    with open(folder / "log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Prometheus(proc, port, folder, tls)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


Store = tuple[Prometheus, list[socket.socket]]


class StartedStores:
    """Prometheus started ahead, each scraping ``targets`` held ports (``held_port``: refused
    until a test's exporters serve there; a test with fewer exporters leaves the rest refused, which
    makes no series). A Prometheus scrapes some 5 s after it starts (its discovery manager
    sends target updates every 5 s, a fixed period): ``take`` hands over one started during the
    previous test, starts the next, and stops the one handed over when its user is done."""

    def __init__(self, targets: int = 3) -> None:
        self.targets = targets
        self.stack = ExitStack()
        self.ahead: tuple[Store, ExitStack] | None = None

    def _start(self) -> tuple[Store, ExitStack]:
        own = self.stack.enter_context(ExitStack())  # stopped at the end if not taken
        socks = [own.enter_context(held_port()) for _ in range(self.targets)]
        targets = [f"127.0.0.1:{s.getsockname()[1]}" for s in socks]
        return (own.enter_context(prometheus(targets)), socks), own

    def start_ahead(self) -> None:
        """Start the next one now (a module's first test that takes one, later, finds it up)."""
        if self.ahead is None:
            self.ahead = self._start()

    @contextmanager
    def take(self, *, start_next: bool = True) -> Iterator[Store]:
        """One for the caller (stopped when it is done); ``start_next``: start the next."""
        got, own = self.ahead or self._start()
        self.ahead = self._start() if start_next else None
        with own:
            yield got


# -- a stand-in store: what a hostile or broken HTTP API answers ------------------------------
class StandInStore:
    """A store's HTTP API on a loopback port that answers as ``answer`` says, for the bounds of
    ``gpuctl.fleet.promhttp`` (issue 38): ``answer(conn, query)`` writes a whole HTTP answer to
    the socket ``conn`` for the POSTed ``query`` (PromQL). A thread per connection; ``queries``
    the queries asked, ``closed`` the connections the client closed while being answered."""

    def __init__(self, answer: Callable[[socket.socket, str], None]) -> None:
        self.answer = answer
        self.queries: list[str] = []
        self.closed = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while self._open:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                got = conn.recv(65536)
                if not got:
                    return
                data += got
            head, _, body = data.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                got = conn.recv(65536)
                if not got:
                    return
                body += got
            form = urllib.parse.parse_qs(body.decode())
            query = form.get("query", [""])[0]
            with self._lock:
                self.queries.append(query)
            try:
                self.answer(conn, query)
            except OSError:  # the client closed the connection while it was answered
                with self._lock:
                    self.closed += 1

    def close(self) -> None:
        self._open = False
        self._sock.close()


def answer_json(conn: socket.socket, body: bytes, status: str = "200 OK") -> None:
    """A whole answer of ``body`` (JSON), the connection closed after it."""
    conn.sendall(
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


def vector(series: list[tuple[dict[str, str], str]], t: float = 0.0) -> bytes:
    """An instant vector's answer: each series its labels and value text."""
    result = [{"metric": labels, "value": [t or time.time(), value]} for labels, value in series]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


def hosts_answer(hosts: list[str], gpus: int = 1) -> Callable[[socket.socket, str], None]:
    """A store holding ``gpus`` GPUs of each of ``hosts`` (DCGM exporter's labels), each value
    5, sampled now: the stamp query's times, each metric's values, no raw samples (the scrape
    period query)."""

    def answer(conn: socket.socket, query: str) -> None:
        now = time.time()
        if "[5m]" in query:
            body = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
        elif query.startswith("max by (Hostname") and "timestamp(" in query:
            body = vector([({"Hostname": h}, f"{now:.3f}") for h in hosts], now)
        else:
            body = vector(
                [
                    ({"Hostname": h, "gpu": str(g), "UUID": f"GPU-{h}-{g}"}, "5")
                    for h in hosts
                    for g in range(gpus)
                ],
                now,
            )
        answer_json(conn, body)

    return answer
