"""``status --json`` is made from the model and published as a JSON Schema
(``docs/status.schema.json``): the file is what the model makes, and a real
``gpuctl status --demo --json`` fits it, every field of the node snapshot included."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.cli.status import status_schema
from gpuctl.core.model import GpuProcess, GpuSample, GpuStatic, HostSample, NodeInfo, NodeSnapshot
from gpuctl.fleet.status import GPU_FOLDED, INFO_FOLDED, NODE_FOLDED
from gpuctl_tests.helpers import node_env

SCHEMA_FILE = Path(__file__).parents[2] / "docs" / "status.schema.json"
REGENERATE = "gpuctl status --json-schema > docs/status.schema.json"


class Invalid(AssertionError):
    pass


# The keywords msgspec's schemas (and status_schema's own) use; any other one is refused, so
# that the walk below never passes a document by not knowing what a keyword asks.
NOTES = {"title", "description", "default", "$schema", "$defs"}
TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def validate(value: Any, schema: dict[str, Any], root: dict[str, Any], at: str = "$") -> None:
    """Check ``value`` against ``schema`` (a JSON Schema as msgspec writes them), raising
    Invalid with where and why; ``root`` holds ``$defs``."""
    unknown = set(schema) - NOTES - {
        "$ref", "anyOf", "type", "enum", "const", "properties", "required",
        "additionalProperties", "items", "prefixItems", "minimum", "maximum",
        "minItems", "maxItems", "minLength", "maxLength",
    }  # fmt: skip
    if unknown:
        raise Invalid(f"{at}: the walk does not know {sorted(unknown)}")
    if "$ref" in schema:
        name = schema["$ref"].removeprefix("#/$defs/")
        validate(value, root["$defs"][name], root, at)
    if "anyOf" in schema:
        errors = []
        for option in schema["anyOf"]:
            try:
                validate(value, option, root, at)
                break
            except Invalid as e:
                errors.append(str(e))
        else:
            raise Invalid(f"{at}: fits no option: {errors}")
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        # JSON's true and false are no numbers (Python's bool is an int)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = any(
            number
            if k in ("integer", "number") and isinstance(value, TYPES[k])
            else isinstance(value, TYPES[k])
            for k in kinds
        )
        if not ok:
            raise Invalid(f"{at}: {value!r} is not {kinds}")
    if "enum" in schema and value not in schema["enum"]:
        raise Invalid(f"{at}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        raise Invalid(f"{at}: {value!r} is not {schema['const']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            raise Invalid(f"{at}: {value} < {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            raise Invalid(f"{at}: {value} > {schema['maximum']}")
    if isinstance(value, str) and not (
        schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value))
    ):
        raise Invalid(f"{at}: {value!r} has a length out of bounds")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                raise Invalid(f"{at}: no {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, v in value.items():
            if key in props:
                validate(v, props[key], root, f"{at}.{key}")
            elif extra is False:
                raise Invalid(f"{at}: {key!r} is not allowed")
            elif isinstance(extra, dict):
                validate(v, extra, root, f"{at}.{key}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", 1e18):
            raise Invalid(f"{at}: {len(value)} items, out of bounds")
        prefix = schema.get("prefixItems", [])
        for i, v in enumerate(value):
            if i < len(prefix):
                validate(v, prefix[i], root, f"{at}[{i}]")
            elif "items" in schema:
                validate(v, schema["items"], root, f"{at}[{i}]")


def keys_outside(value: Any, schema: dict[str, Any], root: dict[str, Any], at: str) -> list[str]:
    """Keys of objects in ``value`` that ``schema`` does not name (the schema leaves objects
    open to later fields; the document gpuctl writes names none it does not publish)."""
    if "$ref" in schema:
        return keys_outside(value, root["$defs"][schema["$ref"].removeprefix("#/$defs/")], root, at)
    out: list[str] = []
    for option in schema.get("anyOf", ()):
        try:
            validate(value, option, root)
        except Invalid:
            continue
        return keys_outside(value, option, root, at)
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        out += [f"{at}.{k}" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                out += keys_outside(v, props[k], root, f"{at}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            out += keys_outside(v, schema["items"], root, f"{at}[{i}]")
    return out


@pytest.fixture(scope="module")
def demo() -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", "status", "--demo", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=node_env(),
    )
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_the_published_schema_is_the_models() -> None:
    """docs/status.schema.json is what the model makes: a field added to a Struct of the node
    snapshot changes it, and this fails until the file is made again."""
    published = json.loads(SCHEMA_FILE.read_text())
    assert published == status_schema(), f"the model changed: run {REGENERATE}"
    cli = subprocess.run(
        [sys.executable, "-m", "gpuctl", "status", "--json-schema"],
        capture_output=True,
        text=True,
        timeout=120,
        env=node_env(),
    )
    assert cli.returncode == 0 and json.loads(cli.stdout) == published, cli.stderr
    assert "status.schema.json" in (SCHEMA_FILE.parent / "commands.md").read_text()


def test_demo_json_fits_the_schema_and_names_no_key_outside_it(demo: dict[str, Any]) -> None:
    schema = json.loads(SCHEMA_FILE.read_text())
    validate(demo, schema, schema)
    assert keys_outside(demo, schema, schema, "$") == []
    assert demo["xids_watched"] is False and demo["idle_watched"] is False


def test_the_walk_refuses_what_does_not_fit(demo: dict[str, Any]) -> None:
    """The validation above can fail: a wrong type, a missing key, a bound broken."""
    schema = json.loads(SCHEMA_FILE.read_text())
    for path, value in (
        (("nodes", 0, "host", "cpu"), "busy"),
        (("nodes", 0, "host", "cpu"), 101.0),
        (("nodes", 0, "gpus", 0, "util_gpu"), 1.5),
        (("nodes", 0, "state"), "sleeping"),
        (("xids_watched",), 0),
        (("nodes", 0, "gpus", 0, "processes"), {}),
    ):
        doc = copy.deepcopy(demo)
        target = doc
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        with pytest.raises(Invalid):
            validate(doc, schema, schema)
    doc = copy.deepcopy(demo)
    del doc["nodes"][0]["host"]
    with pytest.raises(Invalid, match="host"):
        validate(doc, schema, schema)


def test_the_hosts_cpu_memory_load_and_network_reach_json(demo: dict[str, Any]) -> None:
    for node in demo["nodes"]:
        host = node["host"]
        assert set(host) == set(HostSample.__struct_fields__)
        assert 0 <= host["cpu"] <= 100 and host["cpus"] > 0
        assert 0 < host["mem_available"] <= host["mem_total"]
        assert len(host["load"]) == 3 and host["net_rx"] >= 0 and host["net_tx"] >= 0
        assert node["last_sample_t"] > 0 and node["parents"], node["name"]
        assert node["protocol"] and node["features"] and node["nvml"]
        for gpu in node["gpus"]:
            assert gpu["pcie_gen"] and gpu["serial"] and gpu["max_sm_clock"]


def test_every_field_of_the_snapshot_is_in_the_schema() -> None:
    """Every field of NodeSnapshot, of its hello (NodeInfo) and of a GPU (GpuStatic,
    GpuSample) is a key of the published node or GPU, save the few folded into others; a
    process and the host keep every field of theirs."""
    schema = status_schema()
    node = schema["$defs"]["Node"]["properties"]
    gpu = schema["$defs"]["Gpu"]["properties"]
    snapshot = {f.name for f in dataclasses.fields(NodeSnapshot)} - set(NODE_FOLDED)
    assert snapshot <= set(node) and {"host", "parents", "last_sample_t"} <= snapshot
    assert set(NodeInfo.__struct_fields__) - set(INFO_FOLDED) <= set(node)
    assert set(GpuStatic.__struct_fields__) <= set(gpu)
    assert set(GpuSample.__struct_fields__) - set(GPU_FOLDED) <= set(gpu)
    assert {"burn", "slurm_job", "slurm_user"} <= set(gpu)
    for name, struct in (("HostSample", HostSample), ("GpuProcess", GpuProcess)):
        assert set(schema["$defs"][name]["properties"]) == set(struct.__struct_fields__)
