"""Fuzz: Prometheus's answers as gpuctl reads them (``fleet.prom``: the answers' structs
``VectorReply`` / ``MatrixReply`` / ``ErrorReply`` as ``PromClient`` decodes them, then
``group``, which turns a poll's series into per-host readings): any answer is read or refused
with msgspec's one-line DecodeError (``PromClient`` makes it a PromError), and any series,
whatever its labels and values, groups into readings or is skipped, never an exception."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import strategies as st

from gpuctl.fleet import prom, promhttp, promwire
from gpuctl_tests.fuzz.harness import LANES, bounded, junk_bytes, run


def _series(host: str, gpu: str, value: str, **labels: str) -> dict[str, Any]:
    return {
        "metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "Hostname": host, "gpu": gpu, **labels},
        "value": [1_700_000_000.5, value],
    }


GOOD = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            _series("n1", "0", "97", UUID="GPU-1", modelName="NVIDIA H100 80GB HBM3"),
            _series("n1", "1", "3", UUID="GPU-2", modelName="NVIDIA H100 80GB HBM3"),
            _series("n2", "0", "NaN", GPU_I_ID="1", GPU_I_PROFILE="1g.10gb"),
        ],
    },
}
MATRIX = {
    "status": "success",
    "data": {
        "resultType": "matrix",
        "result": [{"metric": {"Hostname": "n1", "gpu": "0"}, "values": [[1.0, "5"], [2.0, "6"]]}],
    },
}
ERROR = {"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}
VALID = [json.dumps(x).encode() for x in (GOOD, MATRIX, ERROR)]
METRICS: list[prom.Metric | None] = [None, *prom.METRICS, prom.MIG]
# As PromClient decodes each kind of answer.
DECODERS = [
    msgspec.json.Decoder(k)
    for k in (promwire.VectorReply, promwire.MatrixReply, promhttp.ErrorReply)
]

# What label values and sample texts a store may hold: any text, digits of other scripts
# ("²", "٣"), huge numbers, signs, the float words Go writes.
label_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["0", "7", "-1", "²", "٣", "9" * 5000, "1e3", " 1", "0x10", ""]),
)
value_text = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "-0", "9" * 5000, "1_000", "0x1p3", ""]),
)
series = st.fixed_dictionaries(
    {
        "metric": st.fixed_dictionaries(
            {"Hostname": st.sampled_from(["n1", "n2", ""]) | label_text, "gpu": label_text},
            optional=dict.fromkeys(
                (
                    "instance",
                    "UUID",
                    "modelName",
                    "GPU_I_ID",
                    "GPU_I_PROFILE",
                    "hpc_job",
                    "DCGM_FI_DRIVER_VERSION",
                    "other",
                ),
                label_text,
            ),
        ),
        "value": st.tuples(st.floats(allow_nan=False, allow_infinity=False), value_text),
    }
)


class Store:
    """A real HTTP server on loopback that answers every query with ``body`` (and ``status``):
    the answers reach ``PromClient`` as a store's would."""

    def __init__(self) -> None:
        store = self
        self.body, self.status = b"", 200

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(store.status)
                self.send_header("Content-Length", str(len(store.body)))
                self.end_headers()
                self.wfile.write(store.body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.client = prom.PromClient(
            prom.PromTarget(f"http://127.0.0.1:{self.server.server_address[1]}", timeout=10)
        )

    def close(self) -> None:
        asyncio.run(self.client.aclose())
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    s = Store()
    yield s
    s.close()


def _sync(ask: Callable[[str], Any]) -> Callable[[str], Any]:
    """The client's async query, asked as a caller that waits for it (its HTTP runs on the
    client's own loop thread)."""
    return lambda promql: asyncio.run(ask(promql))


def _answers(store: Store) -> Callable[[bytes], None]:
    def check(body: bytes) -> None:
        for status in (200, 422):
            store.body, store.status = body, status
            for ask in (store.client.query, store.client.query_matrix):
                got = bounded(_sync(ask), "up", errors=(prom.PromError,))
                assert isinstance(got, (list, prom.PromError))
                if isinstance(got, list) and got and isinstance(got[0], prom.Series):
                    _group(got)
        for decoder in DECODERS:  # the structs themselves, without HTTP
            with contextlib.suppress(msgspec.DecodeError, UnicodeDecodeError):
                decoder.decode(body)

    return check


def _group(result: list[prom.Series]) -> None:
    for metric in METRICS:
        nodes = bounded(prom.group, [(metric, result)])
        assert isinstance(nodes, dict)
        for host, reading in nodes.items():
            assert host and isinstance(reading, prom.NodeReading)


@pytest.mark.parametrize("examples", LANES)
def test_any_answer_is_read_or_refused(examples: int, store: Store) -> None:
    run(examples, junk_bytes(VALID), _answers(store))


@pytest.mark.parametrize("examples", LANES)
def test_any_series_groups_or_is_skipped(examples: int) -> None:
    def check(items: list[dict[str, Any]]) -> None:
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": items}})
        reply = DECODERS[0].decode(body.encode())
        assert reply.data is not None
        _group(reply.data.result)

    run(examples, st.lists(series, max_size=6), check)


def test_a_valid_answer_groups_to_its_values() -> None:
    reply = msgspec.json.decode(VALID[0], type=promwire.VectorReply)
    assert reply.data is not None
    nodes = prom.group([(prom.UTIL, reply.data.result)])
    assert nodes["n1"].gpus == {0: {"util_gpu": 97}, 1: {"util_gpu": 3}}
    assert nodes["n1"].statics[1] == {"index": 1, "uuid": "GPU-2", "name": "NVIDIA H100 80GB HBM3"}


def test_an_answer_in_bad_utf8_is_a_prom_error(store: Store) -> None:
    # Found by the fuzz: msgspec raises UnicodeDecodeError, not DecodeError, for bad UTF-8, and
    # it came out of PromClient as it was (the poll's thread, then the source, got a traceback).
    store.body, store.status = b'{"status": "\x80uccess", "data": null}', 200
    with pytest.raises(prom.PromError) as e:
        asyncio.run(store.client.query("up"))
    assert e.value.reason == "protocol" and "unexpected answer" in str(e.value)
    store.status = 422
    with pytest.raises(prom.PromError) as e:
        asyncio.run(store.client.query("up"))
    assert e.value.reason == "protocol" and "answered 422" in str(e.value)


def test_a_gpu_label_of_other_digits_is_skipped() -> None:
    # Found by the fuzz: "²".isdigit() is True and int("²") raises; so does a 5,000-digit label.
    for gpu in ("²", "٣", "9" * 5000):
        items = [_series("n1", gpu, "5"), _series("n1", "0", "7")]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": items}})
        reply = DECODERS[0].decode(body.encode())
        assert reply.data is not None
        assert prom.group([(prom.UTIL, reply.data.result)])["n1"].gpus == {0: {"util_gpu": 7}}
