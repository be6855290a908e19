"""The Prometheus reader against stores that answer as an attacker or a broken proxy would (issue
38): too much, too slowly, nested too deep, with odd host names, and credentials that others can
read or that would cross the network in the clear. Each store is a stand-in on a loopback port
(``StandInStore``) answering as the attack did; ``gpuctl status`` reads it as a user would, and
each case is one line (or a host left out, said in the log), never a traceback, never a hang.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuctl.config import parse_config
from gpuctl.fleet.prom import PromClient, PromError, PromSource, PromTarget
from gpuctl_tests.harness.prometheus import StandInStore, hosts_answer
from gpuctl_tests.helpers import node_env, wait_until

MIB = 1 << 20
Answer = Callable[[socket.socket, str], None]


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    """Set when the test ends: a dripping answer stops."""
    event = threading.Event()
    yield event
    event.set()


@pytest.fixture
def stores() -> Iterator[Callable[[Answer], StandInStore]]:
    """Stand-in stores, closed after the test."""
    made: list[StandInStore] = []

    def make(answer: Answer) -> StandInStore:
        made.append(StandInStore(answer))
        return made[-1]

    yield make
    for store in made:
        store.close()


def status(
    *args: str, timeout: float = 90, before: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``gpuctl [BEFORE] status ARGS``, given ``timeout`` seconds (a hang fails the test)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *before, "status", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=node_env(),
    )


def one_line(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode != 0, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "internal error" not in lines[0], lines[0]
    return lines[0]


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
OPEN = b'{"status":"success","data":{"resultType":"vector","result":['


def endless(sent: list[int], total: int) -> Answer:
    """An answer that is valid JSON (an empty vector padded with spaces) of ``total`` bytes,
    with no length said (read until the connection closes); ``sent`` counts what went out."""

    def answer(conn: socket.socket, query: str) -> None:
        conn.sendall(HEAD + OPEN)
        pad = b" " * MIB
        sent[0] = len(OPEN)
        while sent[0] < total:
            conn.sendall(pad)
            sent[0] += len(pad)
        conn.sendall(b"]}}")

    return answer


def test_an_answer_over_the_byte_cap_is_refused_before_it_is_read_whole(
    stores: Callable[[Answer], StandInStore],
) -> None:
    """A store answering 160 MiB (the attack's 256 MiB took 1.6 GB of RSS, 1 GiB ended in
    MemoryError): the read stops at ``prometheus_max_answer`` (64 MiB by default), one line
    says which bound, and the store could not send the rest."""
    sent = [0]
    total = 160 * MIB
    store = stores(endless(sent, total))
    line = one_line(status("--prometheus", store.url))
    assert f"Prometheus at {store.url}: the answer to " in line
    assert "goes on past it, over prometheus_max_answer (67,108,864 bytes)" in line
    assert "narrow --prometheus-match" in line
    wait_until(lambda: store.closed == 1, 30, "the store to see its answer cut")
    assert sent[0] < total


def test_an_answer_saying_it_is_too_long_is_refused_unread(
    stores: Callable[[Answer], StandInStore], tmp_path: Path
) -> None:
    """A Content-Length over the cap (a config's smaller one here): refused on the head."""

    def answer(conn: socket.socket, query: str) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1048577\r\n\r\n" + OPEN
        )

    store = stores(answer)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[clusters.site]\nprometheus = "{store.url}"\nprometheus_max_answer = {1 << 20}\n'
    )
    line = one_line(status("--config", str(config)))
    assert "says it holds 1,048,577 bytes, over prometheus_max_answer (1,048,576 bytes)" in line


def test_more_series_or_hosts_than_the_caps_are_one_line(
    stores: Callable[[Answer], StandInStore], tmp_path: Path
) -> None:
    """An answer of more series than ``prometheus_max_series`` is refused before it is
    decoded; a store of more hosts than ``prometheus_max_hosts`` is refused at discovery
    (300,000 series took 5.6 GB before): each one line naming its setting."""
    store = stores(hosts_answer([f"node-{i:03}" for i in range(50)]))
    config = tmp_path / "config.toml"
    head = f'[clusters.site]\nprometheus = "{store.url}"\n'
    config.write_text(head + "prometheus_max_series = 20\n")
    line = one_line(status("--config", str(config)))
    assert "holds 50 series, over prometheus_max_series (20)" in line
    config.write_text(head + "prometheus_max_hosts = 10\n")
    line = one_line(status("--config", str(config)))
    assert f"Prometheus at {store.url} holds GPUs of 50 hosts, over prometheus_max_hosts" in line
    assert "(10): 40 left out" in line
    config.write_text(head)
    r = status("--config", str(config), "--json")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["nodes"]) == 50


def dripping(every: float, stop: threading.Event, started: threading.Event | None = None) -> Answer:
    """An answer whose head comes at once and whose body comes a byte every ``every`` s, for
    ever (until the client closes the connection, or ``stop`` is set)."""

    def answer(conn: socket.socket, query: str) -> None:
        conn.sendall(HEAD)
        if started is not None:
            started.set()
        while True:
            conn.sendall(b" ")
            if stop.wait(every):  # the drip's pace (what the attack did), not a wait on gpuctl
                return

    return answer


def test_a_store_that_drips_ends_the_poll_at_its_deadline(
    stores: Callable[[Answer], StandInStore], stop: threading.Event
) -> None:
    """A byte every 0.5 s never trips a socket's per-read timeout: ``status --timeout 3`` did
    not return. Now the poll's deadline ends it in one line and the connection is closed."""
    store = stores(dripping(0.5, stop))
    line = one_line(status("--prometheus", store.url, "--timeout", "3", timeout=60))
    assert f"Prometheus at {store.url}: no whole answer to " in line and "within 3 s" in line
    wait_until(lambda: store.closed == 1, 10, "the dripping connection closed")


QUIT = """
import asyncio, sys
from gpuctl.config import parse_config
from gpuctl.fleet.build import fleet_from_config

async def main() -> None:
    config = parse_config('[clusters.s]\\nprometheus = "%s"\\n')
    fleet = fleet_from_config(config, interval=0.2)
    await fleet.start()
    print("started", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await fleet.stop()  # what q does in the screen

asyncio.run(main())
print("ended", flush=True)
"""


def test_stopping_the_fleet_ends_a_dripping_read_and_the_process(
    stores: Callable[[Answer], StandInStore], stop: threading.Event
) -> None:
    """In the screen ``q`` stopped the fleet, but a poll's reader thread stayed blocked in the
    dripping read and the process never ended. Now stopping cancels the read: the connection
    is closed and the process ends."""
    normal = hosts_answer(["node-a"])
    drip = threading.Event()
    dripping_now = threading.Event()
    slow = dripping(0.5, stop, dripping_now)

    def answer(conn: socket.socket, query: str) -> None:
        (slow if drip.is_set() else normal)(conn, query)

    store = stores(answer)
    p = subprocess.Popen(
        [sys.executable, "-c", QUIT % store.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=node_env(),
    )
    try:
        assert p.stdout is not None and p.stdin is not None
        assert p.stdout.readline() == "started\n", p.stderr.read() if p.stderr else ""
        drip.set()
        wait_until(dripping_now.is_set, 20, "a poll's read to drip")
        p.stdin.write("\n")
        p.stdin.flush()
        assert p.wait(timeout=30) == 0
        assert p.stdout.read() == "ended\n"
        wait_until(lambda: store.closed >= 1, 10, "the dripping connection closed")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


DEPTH = 1_000_000


def deep(conn: socket.socket, query: str) -> None:
    """A series with a label gpuctl does not read (skipped while decoding) holding JSON
    nested a million deep: skipping it recursed until RecursionError ("internal error")."""
    nested = b"[" * DEPTH + b"]" * DEPTH
    body = OPEN + b'{"metric":{"Hostname":"a","x":' + nested + b'},"value":[1,"1"]}]}}'
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


def test_json_nested_a_million_deep_is_one_line(stores: Callable[[Answer], StandInStore]) -> None:
    store = stores(deep)
    line = one_line(status("--prometheus", store.url))
    assert f"Prometheus at {store.url}: unexpected answer to " in line
    assert "nested too deep" in line


def test_a_host_name_with_hostlist_characters_is_left_out_with_a_line(
    stores: Callable[[Answer], StandInStore], tmp_path: Path
) -> None:
    """Host labels holding ``[``, ``]`` or ``,`` (read as a hostlist: "internal error:
    BadHostlist") are left out, each said once in the log; the other hosts are read."""
    store = stores(hosts_answer(["node-ok", "a[1", "b,c", "d]"], gpus=2))
    log = tmp_path / "gpuctl.log"
    r = status("--prometheus", store.url, before=("--log-file", str(log)))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (
        "reader node-ok: prometheus" in r.stderr
    )  # the reader lines go to stderr: stdout holds rows only
    text = log.read_text()
    for odd in ("a[1", "b,c", "d]"):
        assert f"host {odd!r} left out" in text
        assert odd not in r.stdout


def token_config(folder: Path, url: str, mode: int, folder_mode: int = 0o700) -> Path:
    folder.mkdir(mode=folder_mode, exist_ok=True)
    folder.chmod(folder_mode)
    token = folder / "token"
    token.write_text("tok-5e1f0a9c2b\n")
    token.chmod(mode)
    config = folder.parent / "config.toml"
    config.write_text(f'[clusters.site]\nprometheus = "{url}"\nprometheus_token_file = "{token}"\n')
    return config


def test_a_token_file_others_can_read_or_replace_is_refused(
    stores: Callable[[Answer], StandInStore], tmp_path: Path
) -> None:
    """A token file of mode 0666 in a 0777 folder was used silently, while ``export
    --auth-file`` refused it: the same rule (``gpuctl.config.files.unsafe_secret``) now, and the
    folder's too; a private file in a private folder is used."""
    store = stores(hosts_answer(["node-a"]))
    shared = tmp_path / "shared"
    line = one_line(status("--config", str(token_config(shared, store.url, 0o666, 0o777))))
    assert f"the Prometheus token file {shared}/token (prometheus_token_file)" in line
    assert "bad permissions 0666, other users could read or change the secret" in line
    assert "tok-5e1f0a9c2b" not in line
    line = one_line(status("--config", str(token_config(shared, store.url, 0o600, 0o777))))
    assert f"its folder {shared} (mode 0777) is writable by others" in line
    r = status("--config", str(token_config(shared, store.url, 0o600, 0o700)), "--json")
    assert r.returncode == 0, r.stderr
    assert [n["name"] for n in json.loads(r.stdout)["nodes"]] == ["node-a"]


def test_a_credential_is_not_sent_over_plain_http_to_another_host(tmp_path: Path) -> None:
    """A token over ``http://`` to a host not on loopback is refused before any request (the
    line says how to allow it); loopback and ``prometheus_allow_plain_http_credentials = true``
    are allowed."""
    token = tmp_path / "token"
    token.write_text("tok-5e1f0a9c2b\n")
    token.chmod(0o600)
    head = f'[clusters.site]\nprometheus_token_file = "{token}"\n'
    refused = parse_config(head + 'prometheus = "http://prom.example:9090"\n')
    target = refused.clusters["site"].prometheus
    assert target is not None
    with pytest.raises(PromError) as e:
        PromClient(target)
    assert e.value.reason == "config"
    assert "is plain http: the token would cross the network" in str(e.value)
    assert "prometheus_allow_plain_http_credentials = true" in str(e.value)
    for allowed in (
        'prometheus = "http://prom.example:9090"\nprometheus_allow_plain_http_credentials = true\n',
        'prometheus = "http://127.0.0.1:9090"\n',
        'prometheus = "https://prom.example:9090"\n',
    ):
        target = parse_config(head + allowed).clusters["site"].prometheus
        assert target is not None
        assert PromClient(target).headers["Authorization"] == "Bearer tok-5e1f0a9c2b"
    assert PromClient(PromTarget("http://prom.example:9090")).headers.get("Authorization") is None


def test_the_secret_rule_is_exports(tmp_path: Path) -> None:
    """``export --auth-file`` and the store's token file refuse a file by one rule."""
    from gpuctl.fleet.export import AuthFileError, Credential

    path = tmp_path / "secret"
    path.write_text("x" * 24 + "\n")
    os.chmod(path, 0o644)
    with pytest.raises(AuthFileError, match="bad permissions 0644") as a:
        Credential.load(str(path))
    target = PromTarget("http://127.0.0.1:9", token_file=str(path))
    with pytest.raises(PromError) as b:
        PromClient(target)
    assert str(a.value).split(": ", 1)[1] in str(b.value)


async def test_hosts_past_the_cap_while_running_are_left_out(
    stores: Callable[[Answer], StandInStore],
) -> None:
    """Hosts that appear while gpuctl runs, past ``prometheus_max_hosts``, are left out (the
    held ones stay, then new ones by name) and ``capped`` holds the line saying so."""
    hosts = ["node-a", "node-b"]
    store = stores(hosts_answer(hosts))
    source = PromSource(PromTarget(store.url, max_hosts=3), interval=1.0)
    source._take(await source.poll(), publish=False)
    assert sorted(source.latest) == ["node-a", "node-b"] and source.capped is None
    hosts += ["node-e", "node-d", "node-c"]  # the store answers them from now on
    source._take(await source.poll(), publish=False)
    assert sorted(source.latest) == ["node-a", "node-b", "node-c"]
    assert source.capped is not None
    assert "holds GPUs of 5 hosts, over prometheus_max_hosts (3): 2 left out" in source.capped
    await source.client.aclose()
