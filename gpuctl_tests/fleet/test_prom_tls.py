"""The store over https and with credentials (issue 29): Debian's Prometheus serving TLS with a
certificate from a CA made by the test, asking for basic auth, and behind a reverse proxy that
asks for a bearer token (Prometheus has no bearer auth of its own); ``gpuctl status`` and the
screen read it, and each mistake a user can make is one line that names the store and never
holds the secret.
"""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuctl.core.model import NodeState
from gpuctl.fleet.prom import PromClient, PromError, PromTarget
from gpuctl.tui import GpuctlApp
from gpuctl_tests.fleet.test_prom import gpuctl, one_line_error, site_fleet
from gpuctl_tests.harness.prometheus import (
    PASSWORD,
    USER,
    BearerProxy,
    Prometheus,
    StandInExporter,
    StartedStores,
    Store,
    Tls,
    make_tls,
    prometheus,
)
from gpuctl_tests.helpers import until

pytestmark = pytest.mark.prometheus  # a real /usr/bin/prometheus: the full lane only

TOKEN = "tok-3f9c1d0e7a"  # test-only bearer token


@dataclass
class TlsSite:
    prom: Prometheus
    tls: Tls
    exporter: StandInExporter
    basic: str  # the Authorization header that Prometheus accepts


@pytest.fixture(scope="module")
def plain_stores() -> Iterator[StartedStores]:
    """The plain Prometheus behind the bearer-token proxy: started with ``tls_site``'s, so that
    its 5 s before the first scrape pass while the https tests run."""
    stores = StartedStores(targets=1)
    with stores.stack:
        yield stores


@pytest.fixture
def plain_store(plain_stores: StartedStores) -> Iterator[Store]:
    with plain_stores.take(start_next=False) as got:
        yield got


@pytest.fixture(scope="module")
def tls_site(
    tmp_path_factory: pytest.TempPathFactory, plain_stores: StartedStores
) -> Iterator[TlsSite]:
    """One node of two GPUs behind a Prometheus serving https (the test's own CA) that asks
    for basic auth; ready once its first scrapes are in."""
    plain_stores.start_ahead()
    tls = make_tls(tmp_path_factory.mktemp("tls"))
    exporter = StandInExporter("node-t")
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    try:
        with prometheus([exporter.address], basic_auth=True, tls=tls) as prom:
            prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2, auth=basic)
            yield TlsSite(prom, tls, exporter, basic)
    finally:
        exporter.close()


def config(
    tmp_path: Path,
    url: str,
    *,
    ca: Path | None = None,
    password: str | None = None,
    token: str | None = None,
) -> Path:
    """A config file of one cluster read from ``url`` with these credentials (in files)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    lines = ["[clusters.site]", f'prometheus = "{url}"']
    if ca is not None:
        lines.append(f'prometheus_ca = "{ca}"')
    if password is not None:
        (tmp_path / "password").write_text(password + "\n")
        (tmp_path / "password").chmod(0o600)  # a secret others cannot read (issue 38)
        lines += [
            f'prometheus_user = "{USER}"',
            f'prometheus_password_file = "{tmp_path}/password"',
        ]
    if token is not None:
        (tmp_path / "token").write_text(token + "\n")
        (tmp_path / "token").chmod(0o600)
        lines.append(f'prometheus_token_file = "{tmp_path}/token"')
    path = tmp_path / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def status_json(path: Path) -> dict[str, object]:
    r = gpuctl("--config", str(path), "status", "--json")
    assert r.returncode == 0, r.stderr
    (node,) = json.loads(r.stdout)["nodes"]
    assert isinstance(node, dict)
    return node


def test_https_with_the_right_ca_and_password_reads_the_gpus(
    tls_site: TlsSite, tmp_path: Path
) -> None:
    url = tls_site.prom.url
    assert url.startswith("https://")
    node = status_json(config(tmp_path, url, ca=tls_site.tls.ca, password=PASSWORD))
    assert node["name"] == "node-t" and node["state"] == "live" and node["link"] == "prometheus"
    gpus = node["gpus"]
    assert isinstance(gpus, list) and [g["util_gpu"] for g in gpus] == [10, 20]


def test_an_untrusted_certificate_is_one_line(tls_site: TlsSite, tmp_path: Path) -> None:
    """No CA given (the system's do not hold the test's) or another CA: one line saying the
    certificate is not trusted, naming the store and what to set; the password never in it."""
    url = tls_site.prom.url
    line = one_line_error(
        gpuctl("--config", str(config(tmp_path, url, password=PASSWORD)), "status")
    )
    assert f"Prometheus at {url}: certificate not trusted" in line
    assert "set prometheus_ca" in line and PASSWORD not in line
    other = make_tls(tmp_path / "other", name="another CA")
    path = config(tmp_path, url, ca=other.ca, password=PASSWORD)
    line = one_line_error(gpuctl("--config", str(path), "status"))
    assert f"Prometheus at {url}: certificate not trusted" in line
    assert f"not signed by a CA in prometheus_ca ({other.ca})" in line
    # --prometheus without --prometheus-ca: the system's CAs, the same line naming the option
    line = one_line_error(gpuctl("status", "--prometheus", url))
    assert f"Prometheus at {url}: certificate not trusted" in line
    assert "set --prometheus-ca to the CA bundle" in line


def test_a_certificate_for_another_name_and_plain_http_are_one_line(
    tls_site: TlsSite, tmp_path: Path
) -> None:
    """A certificate for another name than the URL's says so; http:// to the https port
    says to use https."""
    named = make_tls(tmp_path / "named", hosts=("localhost",))  # not for 127.0.0.1
    proxy = BearerProxy(tls_site.prom.url, TOKEN, tls=named, upstream_tls=tls_site.tls)
    try:
        client = PromClient(PromTarget(proxy.url, ca=str(named.ca), timeout=5))
        with pytest.raises(PromError) as e:
            client.run_blocking(lambda: client.query("up"))
    finally:
        proxy.close()
    assert e.value.reason == "tls"
    assert f"Prometheus at {proxy.url}: its certificate is not for 127.0.0.1" in str(e.value)
    port = tls_site.prom.port
    path = config(tmp_path, f"http://127.0.0.1:{port}", password=PASSWORD)
    line = one_line_error(gpuctl("--config", str(path), "status"))
    assert "answers https only: use https://" in line and PASSWORD not in line


def test_a_wrong_password_is_the_401_line_without_the_password(
    tls_site: TlsSite, tmp_path: Path
) -> None:
    wrong = "not-the-Pa55word"
    path = config(tmp_path, tls_site.prom.url, ca=tls_site.tls.ca, password=wrong)
    log = tmp_path / "gpuctl.log"
    r = gpuctl("--log-file", str(log), "--config", str(path), "status")
    line = one_line_error(r)
    assert f"Prometheus at {tls_site.prom.url} refused us (401" in line
    assert "check prometheus_token_file / prometheus_user and prometheus_password_file" in line
    assert wrong not in r.stderr + r.stdout and PASSWORD not in r.stderr
    assert "status" in log.read_text() and wrong not in log.read_text()


def test_the_command_line_options_are_the_configs_keys(tls_site: TlsSite, tmp_path: Path) -> None:
    """``--prometheus URL`` with ``--prometheus-ca``, ``--prometheus-user`` and
    ``--prometheus-password-file``, no config: the GPUs read over https with basic auth as the
    cluster's keys read them; a wrong password is the 401 line naming the options, the
    password in neither the output nor the log; another CA is named by its option."""
    url = tls_site.prom.url
    password = secret(tmp_path, PASSWORD)
    given = ("--prometheus", url, "--prometheus-ca", str(tls_site.tls.ca))
    user = ("--prometheus-user", USER, "--prometheus-password-file")
    r = gpuctl("status", "--json", *given, *user, str(password))
    assert r.returncode == 0, r.stderr
    (node,) = json.loads(r.stdout)["nodes"]
    assert node["name"] == "node-t" and node["state"] == "live" and node["link"] == "prometheus"
    assert [g["util_gpu"] for g in node["gpus"]] == [10, 20]

    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-Pa55word\n")
    wrong.chmod(0o600)
    log = tmp_path / "gpuctl.log"
    r = gpuctl("--log-file", str(log), "status", *given, *user, str(wrong))
    line = one_line_error(r)
    assert f"Prometheus at {url} refused us (401" in line
    assert (
        "check --prometheus-token-file / --prometheus-user and --prometheus-password-file" in line
    )
    assert "not-the-Pa55word" not in r.stderr + r.stdout + log.read_text()
    assert PASSWORD not in r.stderr + log.read_text() and "status" in log.read_text()

    other = make_tls(tmp_path / "other", name="another CA")
    r = gpuctl(
        "status", "--prometheus", url, "--prometheus-ca", str(other.ca), *user, str(password)
    )
    line = one_line_error(r)
    assert f"Prometheus at {url}: certificate not trusted" in line
    assert f"not signed by a CA in --prometheus-ca ({other.ca})" in line and PASSWORD not in line


async def test_the_screen_over_https_with_basic_auth(tls_site: TlsSite, tmp_path: Path) -> None:
    fleet = site_fleet(
        tls_site.prom.url,
        f'prometheus_ca = "{tls_site.tls.ca}"\nprometheus_user = "{USER}"\n'
        f'prometheus_password_file = "{secret(tmp_path, PASSWORD)}"\n',
    )
    app = GpuctlApp(fleet, read_only=True, state_dir=tmp_path / "state")
    async with app.run_test(size=(120, 30)) as pilot:

        def shown() -> bool:
            snap = app.store.snaps.get("node-t")
            return (
                snap is not None
                and snap.state is NodeState.LIVE
                and [g.util_gpu for g in snap.gpus] == [10, 20]
                and bool(app.overview.nodes.lines)
            )

        await until(pilot, shown, "node-t on screen", 30)
        tls_site.exporter.set(1, util=66)
        reading = lambda: app.store.snaps["node-t"].gpus[1].util_gpu == 66  # noqa: E731
        await until(pilot, reading, "the new reading", 30)


def secret(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "secret"
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def test_a_bearer_token_through_an_https_proxy(tmp_path: Path, plain_store: Store) -> None:
    """A site's store behind a reverse proxy that asks for a bearer token over https: the
    token in the file is sent (and nothing else), the GPUs are read; a wrong token or none
    is the 401 line, never holding the token."""
    tls = make_tls(tmp_path / "tls")
    prom, (sock,) = plain_store
    exporter = StandInExporter("node-b", sock=sock)
    try:
        prom.wait_for("count_over_time(DCGM_FI_DEV_GPU_UTIL[1m]) >= 3", 2)
        proxy = BearerProxy(prom.url, TOKEN, tls=tls)
        token = secret(tmp_path / "cli", TOKEN)
        try:
            node = status_json(config(tmp_path, proxy.url, ca=tls.ca, token=TOKEN))
            gpus = node["gpus"]
            assert isinstance(gpus, list) and [g["util_gpu"] for g in gpus] == [10, 20]
            assert proxy.seen and set(proxy.seen) == {f"Bearer {TOKEN}"}
            # the same through the command line's options, no config
            given = ("--prometheus", proxy.url, "--prometheus-ca", str(tls.ca))
            r = gpuctl("status", "--json", *given, "--prometheus-token-file", str(token))
            assert r.returncode == 0, r.stderr
            (node,) = json.loads(r.stdout)["nodes"]
            assert [g["util_gpu"] for g in node["gpus"]] == [10, 20]
            assert set(proxy.seen) == {f"Bearer {TOKEN}"}

            wrong = "tok-wrong-81c2"
            log = tmp_path / "gpuctl.log"
            path = config(tmp_path, proxy.url, ca=tls.ca, token=wrong)
            r = gpuctl("--log-file", str(log), "--config", str(path), "status")
            line = one_line_error(r)
            assert f"Prometheus at {proxy.url} refused us (401" in line
            assert "check prometheus_token_file" in line
            assert wrong not in r.stderr + r.stdout and TOKEN not in r.stderr
            assert f"Bearer {wrong}" in proxy.seen  # it was sent, and not told
            assert "status" in log.read_text() and wrong not in log.read_text()
            r = gpuctl("status", *given, "--prometheus-token-file", str(tmp_path / "token"))
            line = one_line_error(r)
            assert f"Prometheus at {proxy.url} refused us (401" in line
            assert "check --prometheus-token-file" in line and wrong not in r.stderr

            line = one_line_error(
                gpuctl("--config", str(config(tmp_path / "none", proxy.url, ca=tls.ca)), "status")
            )
            assert "refused us (401" in line and "set prometheus_token_file" in line
        finally:
            proxy.close()
    finally:
        exporter.close()


def test_a_redirect_is_not_followed_with_the_credentials(tmp_path: Path) -> None:
    """A store whose URL redirects (a proxy moved it, or http -> https elsewhere): urllib
    would follow a 302 as a GET carrying the Authorization header to wherever it points.
    gpuctl does not follow: the token never reaches the other server; one line names it."""
    elsewhere: list[str | None] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            elsewhere.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass

    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    moved_to = f"http://127.0.0.1:{target.server_address[1]}"

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(302)
            self.send_header("Location", moved_to + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for s in (target, server):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        r = gpuctl("--config", str(config(tmp_path, url, token=TOKEN)), "status")
        assert elsewhere == []  # nothing reached the other server, the token least of all
        line = one_line_error(r)
        assert f"Prometheus at {url} redirects to {moved_to}/api/v1/query (302)" in line
        assert TOKEN not in r.stderr
    finally:
        for s in (server, target):
            s.shutdown()
            s.server_close()


def test_a_password_in_the_url_is_refused_without_echoing_it(tmp_path: Path) -> None:
    """``https://user:password@host``: refused before any request, in one line that does not
    repeat the password (it would be on every line naming the store), saying where it goes."""
    url = "https://ops:s3cret-in-url@127.0.0.1:9"
    for r, user in (
        (gpuctl("status", "--prometheus", url), "--prometheus-user"),
        (gpuctl("--config", str(config(tmp_path, url)), "status"), "prometheus_user"),
    ):
        line = one_line_error(r)
        assert f"must not hold a user or password: set {user}" in line, line
        assert "s3cret-in-url" not in r.stderr + r.stdout
