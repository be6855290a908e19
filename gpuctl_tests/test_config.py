"""The config file: hostlist expansion, per-node overrides, and one clear line per mistake."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuctl.config import Config, ConfigError, load_config, parse_config
from gpuctl_tests.helpers import REPO, node_env

GOOD = """\
read_only = true

[defaults]
interval = 2.0

[fleet]
concurrency = 8

[clusters.lab]
nodes = "gpu[01-03],dgx-a"
via = "ssh"
python = "python3"
workload_python = "/opt/envs/torch/bin/python"
simulate = "2:A100"
setup = ["module load cuda"]
ssh_config = "ssh/config"

[clusters.lab.override."gpu[02-03]"]
python = "/usr/bin/python3.6"
interval = 0.5

[clusters.here]
via = "local"
nodes = ["sim[1-2]"]
simulate = 4

[tui]
theme = "nord"
keys = { quit = "ctrl+q" }
confirm_burn = false

[stress]
max_duration = 1800
"""


def test_good_config_expands_hostlists_and_applies_overrides(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(GOOD)
    config = load_config(path)
    names = [n.name for n in config.nodes()]
    assert names == ["gpu01", "gpu02", "gpu03", "dgx-a", "sim1", "sim2"]
    by = {n.name: n for n in config.nodes()}
    assert by["gpu01"].python == "python3" and by["gpu01"].interval == 2.0  # from [defaults]
    assert by["gpu02"].python == "/usr/bin/python3.6" and by["gpu02"].interval == 0.5
    assert by["gpu03"].python == "/usr/bin/python3.6"
    assert by["dgx-a"].simulate == "2:A100" and by["dgx-a"].setup == ("module load cuda",)
    assert by["gpu01"].workload_python == "/opt/envs/torch/bin/python"
    # login-side paths are relative to the config file's folder
    assert by["gpu01"].ssh_config == str(tmp_path / "ssh" / "config")
    assert by["sim1"].via == "local" and by["sim1"].simulate == "4"
    assert config.read_only is True
    assert config.tui.given_values() == {
        "theme": "nord",
        "keys": {"quit": "ctrl+q"},
        "confirm_burn": False,
    }
    assert config.tui.confirm_burn is False
    assert config.stress.given_values() == {"max_duration": 1800.0}
    assert config.stress.max_duration == 1800.0 and config.stress.engine == "auto"  # default
    assert config.accept.given_values() == {} and config.jobs.given_values() == {}
    assert config.fleet.given_values() == {"concurrency": 8}


def test_hostlist_forms() -> None:
    config = parse_config('[clusters.c]\nnodes = ["n[1-2,5]", "a[01-02]b[1-2]", "x"]\n')
    assert [n.name for n in config.nodes()] == [
        "n1",
        "n2",
        "n5",
        "a01b1",
        "a01b2",
        "a02b1",
        "a02b2",
        "x",
    ]


def test_no_file_means_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUCTL_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    config = load_config(None)
    assert config.empty and config.nodes() == [] and config.read_only is False


def test_env_var_names_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[clusters.x]\nnodes = "a,b"\n')
    monkeypatch.setenv("GPUCTL_CONFIG", str(path))
    assert [n.name for n in load_config(None).nodes()] == ["a", "b"]
    monkeypatch.setenv("GPUCTL_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match=r"missing\.toml: no such file$"):
        load_config(None)


# (config text, expected "line: message" after "path:")
BAD = [
    ("[clusters.a\nnodes = 'x'\n", r"1: TOML syntax: .*"),
    ('x = 1\n[clusters.a]\nnodes = "n1"\nnodes = "n2"\n', r"4: TOML syntax: .*"),
    ('[clusters.a]\nnodes = "n[1-"\n', r"2: clusters\.a\.nodes: bad hostlist 'n\[1-': .*bracket.*"),
    ('[clusters.a]\nnodes = "n[3-1]"\n', r"2: clusters\.a\.nodes: bad hostlist 'n\[3-1\]': .*"),
    ('[clusters.a]\nnodes = ""\n', r"2: clusters\.a\.nodes: names no node"),
    ('[clusters.a]\nnodes = "a b"\n', r"2: clusters\.a\.nodes: hostlist 'a b' gives a bad node .*"),
    (
        "[clusters.a]\nnodes = 3\n",
        r'2: clusters\.a\.nodes: expected a hostlist like "node\[1-4\]".*',
    ),
    ("[clusters.a]\nvia = 'ssh'\n", r'1: clusters\.a: no nodes: set nodes = "host\[1-4\]".*'),
    (
        '[clusters.a]\nvia = "ssh"\npartition = 7\n',
        r"3: clusters\.a\.partition: expected a non-empty .*",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nnodez = "n2"\n',
        r"3: clusters\.a\.nodez: unknown key \(did you mean 'nodes'\?\); "
        r"known keys: nodes, via, .*",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nvia = "telnet"\n',
        r"3: clusters\.a\.via: must be one of ssh, srun, local; got 'telnet'",
    ),
    (
        '[clusters.a]\nnodes = "n1"\ninterval = "fast"\n',
        r"3: clusters\.a\.interval: expected a number, got 'fast'",
    ),
    (
        '[clusters.a]\nnodes = "n1"\ninterval = 0\n',
        r"3: clusters\.a\.interval: must be within 0\.1\.\.3600; got 0",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nport = 70000\n',
        r"3: clusters\.a\.port: must be within 1\.\.65535; got 70000",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nport = true\n',
        r"3: clusters\.a\.port: expected a whole number, got true",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nsimulate = "8:B200"\n',
        r"3: clusters\.a\.simulate: bad simulate '8:B200': unknown model 'B200' .*",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nsimulate = 0\n',
        r"3: clusters\.a\.simulate: must simulate at least one GPU",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nhost_key_policy = "no"\n',
        r"3: clusters\.a\.host_key_policy: must be one of strict, accept-new; got 'no'",
    ),
    (
        '[clusters.a]\nnodes = "n1"\npython = ""\n',
        r"3: clusters\.a\.python: expected a non-empty string, got ''",
    ),
    (
        '[clusters.a]\nnodes = "n1"\nsetup = [1]\n',
        r"3: clusters\.a\.setup: expected a string or a list of strings, got a list",
    ),
    ("read_only = 'yes'\n", r"1: read_only: expected true or false, got 'yes'"),
    ('colour = "red"\n', r"1: colour: unknown key; known keys: read_only, defaults, clusters, .*"),
    ('nodes = "n1"\n', r"1: nodes: cluster settings go in a \[clusters\.NAME\] table.*"),
    ("tui = 3\n", r"1: tui: expected a table \(\[tui\]\), got 3"),
    ('[defaults]\nnodes = "n1"\n', r"2: defaults\.nodes: nodes are named in \[clusters\.NAME\] .*"),
    ("[fleet]\nconcurrency = 0\n", r"2: fleet\.concurrency: must be within 1\.\.4096; got 0"),
    ("[fleet]\nworkers = 2\n", r"2: fleet\.workers: unknown key; known keys: concurrency, .*"),
    (
        "[stress]\nmax_durration = 60\n",
        r"2: stress\.max_durration: unknown key \(did you mean 'max_duration'\?\); known keys: .*",
    ),
    ('[stress]\nengine = "cuda"\n', r"2: stress\.engine: must be one of auto, torch, gpu-burn; .*"),
    ("[stress]\nmem_fraction = 2\n", r"2: stress\.mem_fraction: must be within 0\.05\.\.0\.99.*"),
    ('[tui]\nthme = "light"\n', r"2: tui\.thme: unknown key \(did you mean 'theme'\?\).*"),
    ("[tui]\nkeys = 3\n", r"2: tui\.keys: expected a table of binding id = \"key\", got 3"),
    ('[tui]\nconfirm_burn = "no"\n', r"2: tui\.confirm_burn: expected true or false, .*"),
    (
        "[tui]\ntemp_warn = 90\ntemp_critical = 80\n",
        r"3: tui\.temp_critical: temp_warn \(90\) must be below temp_critical \(80\)$",
    ),
    ("[tui]\ntemp_warn = 90\n", r"2: tui\.temp_warn: temp_warn \(90\) must be below .*\(85\)$"),
    ("[tui]\nmem_warn = 120\n", r"2: tui\.mem_warn: must be within 0\.\.100; got 120"),
    ("[accept]\nexpect_gpu = 8\n", r"2: accept\.expect_gpu: unknown key \(did you mean .*"),
    ('[accept]\nexpect_gpus = "8"\n', r"2: accept\.expect_gpus: expected a whole number, .*"),
    ('[jobs]\njob_dir = "/x"\n', r"2: jobs\.job_dir: unknown key \(did you mean 'dir'\?\).*"),
    ("[jobs]\nsetup = 1\n", r"2: jobs\.setup: expected a string or a list of strings, got 1"),
    ('[clusters."a b"]\nnodes = "n1"\n', r'1: clusters\."a b": a cluster name is letters, .*'),
    (
        '[clusters.a]\nnodes = "n1"\n[clusters.b]\nnodes = "n[0-2]"\n',
        r"4: clusters\.b\.nodes: node 'n1' is in clusters 'a' and 'b'",
    ),
    (
        '[clusters.a]\nnodes = "n[1-2]"\n\n[clusters.a.override."n3"]\npython = "p"\n',
        r"4: clusters\.a\.override\.n3: node 'n3' is not in this cluster's nodes",
    ),
    (
        '[clusters.a]\nnodes = "n[1-2]"\n[clusters.a.override."n[1-"]\npython = "p"\n',
        r"3: clusters\.a\.override\.\"n\[1-\"\: bad hostlist .*",
    ),
    (
        '[clusters.a]\nnodes = "n[1-2]"\n[clusters.a.override.n1]\nnodes = "x"\n',
        r"4: clusters\.a\.override\.n1\.nodes: nodes are named in .*",
    ),
    (
        '[clusters.a]\nnodes = "n[1-2]"\n[clusters.a.override.n1]\nvia = "local"\n',
        r"4: clusters\.a\.override\.n1\.via: a node cannot change its cluster's via",
    ),
    (
        # a key inside a multi-line array must not be taken for the key on the line
        '[clusters.a]\nsetup = [\n  "interval = 3",\n]\nnodes = "n1"\ninterval = -1\n',
        r"6: clusters\.a\.interval: must be within .*",
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_config_gives_one_line_with_path_and_line(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg
    prefix = f"{path}:"
    assert msg.startswith(prefix), msg
    import re

    assert re.fullmatch(expected, msg[len(prefix) :]), msg


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml: no such file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match=r": is a directory, not a config file"):
        load_config(tmp_path)
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin1\.toml: is not UTF-8 text"):
        load_config(bad)


def _gpuctl(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", *argv],
        capture_output=True,
        text=True,
        env=node_env(),
        cwd=REPO,
        timeout=60,
    )


def test_config_check_cli(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(GOOD.replace('ssh_config = "ssh/config"\n', ""))
    r = _gpuctl("--config", str(path), "config", "check")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["NODE", "CLUSTER", "VIA"]
    assert [ln.split()[0] for ln in lines[1:]] == [
        "gpu01",
        "gpu02",
        "gpu03",
        "dgx-a",
        "sim1",
        "sim2",
    ]
    assert "/usr/bin/python3.6" in lines[2]
    assert "2 cluster(s), 6 node(s), read-only" in r.stderr

    r = _gpuctl("--config", str(path), "config", "check", "--json")
    import json

    doc = json.loads(r.stdout)
    assert [n["name"] for n in doc["nodes"]][:2] == ["gpu01", "gpu02"]
    assert doc["read_only"] is True

    bad = tmp_path / "bad.toml"
    bad.write_text('[clusters.a]\nnodes = "n[1-"\n')
    r = _gpuctl("--config", str(bad), "config", "check")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"gpuctl: {bad}:2: clusters.a.nodes: bad hostlist 'n[1-': unbalanced brackets"
    ]
    # the same one line from any command that reads the config: no traceback
    r = _gpuctl("--config", str(bad), "status")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().endswith("bad hostlist 'n[1-': unbalanced brackets")


def test_config_check_reports_missing_files(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[clusters.a]\nnodes = "n1"\nidentity = "keys/id_x"\nknown_hosts = "kh"\n')
    r = _gpuctl("--config", str(path), "config", "check")
    assert r.returncode == 1
    assert f"gpuctl: clusters.a.identity: {tmp_path}/keys/id_x does not exist" in r.stderr
    assert "clusters.a.known_hosts" in r.stderr and "refused as unknown" in r.stderr


def test_nodes_from_sinfo_when_only_a_partition_is_named() -> None:
    config = parse_config('[clusters.hpc]\nvia = "ssh"\npartition = "gpu"\n')
    cluster = config.clusters["hpc"]
    assert cluster.discover and cluster.nodes == () and cluster.partition == "gpu"
    assert cluster.template is not None and cluster.template.via == "ssh"
    srun = parse_config('[clusters.s]\nvia = "srun"\n').clusters["s"]
    assert srun.discover and srun.template is not None and srun.template.slurm is True


# -- the site's config, read first and overridden key by key -----------------------------------


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A site config folder ($XDG_CONFIG_DIRS) and a user folder of the test's own."""
    monkeypatch.setenv("XDG_CONFIG_DIRS", f"{tmp_path / 'etc-xdg'}:{tmp_path / 'other'}")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "user"))
    monkeypatch.delenv("GPUCTL_CONFIG", raising=False)
    d = tmp_path / "etc-xdg" / "gpuctl"
    d.mkdir(parents=True)
    (tmp_path / "user" / "gpuctl").mkdir(parents=True)
    return d


SITE = """\
[clusters.hpc]
nodes = "gpu[01-04]"
python = "/usr/bin/python3"
ssh_config = "ssh_config"
interval = 2.0

[stress]
max_duration = 1800
engine = "torch"
"""


def test_the_site_config_names_the_nodes_for_everybody(site: Path) -> None:
    (site / "config.toml").write_text(SITE)
    config = load_config(None)
    assert [n.name for n in config.nodes()] == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert config.sources == (str(site / "config.toml"),)
    node = config.nodes()[0]
    # a relative login-side path in the site file is relative to the site file's folder
    assert node.ssh_config == str(site / "ssh_config")


def test_the_user_file_overrides_the_site_key_by_key(site: Path, tmp_path: Path) -> None:
    (site / "config.toml").write_text(SITE)
    user = tmp_path / "user" / "gpuctl" / "config.toml"
    user.write_text(
        '[clusters.hpc]\npython = "/opt/py/bin/python3"\n\n[stress]\nmax_duration = 600\n'
        '[clusters.mine]\nnodes = "box1"\n'
    )
    config = load_config(None)
    hpc = config.clusters["hpc"].nodes[0]
    assert hpc.python == "/opt/py/bin/python3"  # the user's value
    assert hpc.interval == 2.0  # the site's, untouched
    assert [n.name for n in config.clusters["mine"].nodes] == ["box1"]
    assert config.stress.given_values() == {"max_duration": 600.0, "engine": "torch"}
    assert config.sources == (str(site / "config.toml"), str(user))
    assert config.path == str(user)


def test_a_mistake_names_the_file_that_holds_it(site: Path, tmp_path: Path) -> None:
    (site / "config.toml").write_text(SITE.replace("interval = 2.0", "interval = 0"))
    (tmp_path / "user" / "gpuctl" / "config.toml").write_text('[tui]\ntheme = "light"\n')
    with pytest.raises(ConfigError) as info:
        load_config(None)
    assert str(info.value) == (
        f"{site / 'config.toml'}:5: clusters.hpc.interval: must be within 0.1..3600; got 0"
    )
    (site / "config.toml").write_text(SITE)
    (tmp_path / "user" / "gpuctl" / "config.toml").write_text("[stress]\nengine = 'cuda'\n")
    with pytest.raises(ConfigError, match=r"user/gpuctl/config\.toml:2: stress\.engine: "):
        load_config(None)


def test_site_folders_earlier_in_the_list_win(site: Path, tmp_path: Path) -> None:
    other = tmp_path / "other" / "gpuctl"
    other.mkdir(parents=True)
    (other / "config.toml").write_text('[clusters.hpc]\nnodes = "x[1-2]"\ninterval = 5.0\n')
    (site / "config.toml").write_text("[clusters.hpc]\ninterval = 3.0\n")
    config = load_config(None)
    assert [n.name for n in config.nodes()] == ["x1", "x2"]
    assert config.nodes()[0].interval == 3.0


def test_an_explicit_file_replaces_the_users_not_the_sites(site: Path, tmp_path: Path) -> None:
    (site / "config.toml").write_text(SITE)
    (tmp_path / "user" / "gpuctl" / "config.toml").write_text("this is not read = [\n")
    mine = tmp_path / "mine.toml"
    mine.write_text("read_only = true\n")
    config = load_config(mine)
    assert config.read_only and [n.name for n in config.nodes()][:1] == ["gpu01"]


# -- gpuctl config init -------------------------------------------------------------------------


def _init(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = node_env({"XDG_CONFIG_HOME": str(tmp_path / "xdg"), **env})
    full.pop("GPUCTL_CONFIG", None)
    return subprocess.run(
        [sys.executable, "-m", "gpuctl", "config", "init", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        timeout=60,
    )


def test_the_template_shows_every_key_its_default_and_meaning() -> None:
    from gpuctl.config.keys import CLUSTER_KEYS, PROMETHEUS_KEYS, SECTIONS
    from gpuctl.config.template import EXAMPLES, template, toml_value

    text = template(nodes="gpu[01-02]")
    keys = [*CLUSTER_KEYS.items(), *PROMETHEUS_KEYS.items()]
    for name, key in [*keys, *(kv for s in SECTIONS.values() for kv in s.items())]:
        assert f"# {key.help}\n" in text, name
        if name == "nodes":
            continue  # the template's own line: the hostlist given, else an example
        if key.default is None:  # an example of the right form, said to be one
            shown = f"{toml_value(EXAMPLES[name])}  # unset by default; an example"
        else:
            shown = toml_value(key.default)
        assert f"{name} = {shown}" in text, name
    assert "(unset)" not in text
    # every line is TOML that gpuctl accepts once uncommented: defaults and examples alike; a
    # store's token and its user and password are two ways, taken one at a time
    setting = re.compile(r"# ([a-z_]+) = ")
    for left_out in (("prometheus_token_file",), ("prometheus_user", "prometheus_password_file")):

        def uncommented(line: str, left_out: tuple[str, ...] = left_out) -> str:
            m = setting.match(line)
            return line[2:] if m and m.group(1) not in left_out else line

        config = parse_config("\n".join(map(uncommented, text.splitlines())))
        assert [n.name for n in config.nodes()] == ["gpu01", "gpu02"]
        assert config.nodes()[0].user == EXAMPLES["user"]  # the examples were taken, not skipped


def test_config_defaults_are_the_ones_the_code_uses() -> None:
    """config init shows the defaults; they must be what gpuctl really does without the key."""
    import dataclasses
    import inspect

    from gpuctl.accept.run import AcceptOptions
    from gpuctl.config import NodeConfig
    from gpuctl.config.keys import CLUSTER_KEYS, SECTIONS
    from gpuctl.fleet.fleet import Fleet

    fleet = inspect.signature(Fleet.__init__).parameters
    for name, key in SECTIONS["fleet"].items():
        assert fleet[name].default == key.default, name
    accept = {f.name: f.default for f in dataclasses.fields(AcceptOptions)}
    for name in ("timeout", "threshold", "allow_no_gpu", "expect_gpus", "python"):
        assert accept[name] == SECTIONS["accept"][name].default, name
    from gpuctl.node import protocol

    assert SECTIONS["stress"]["max_duration"].default == protocol.DEFAULT_MAX_DURATION
    assert SECTIONS["fleet"]["liveness_timeout"].default == protocol.DEFAULT_LIVENESS_S
    node = {f.name: f.default for f in dataclasses.fields(NodeConfig)}
    for name, key in CLUSTER_KEYS.items():
        if name in node:
            expected = tuple(key.default) if isinstance(key.default, list) else key.default
            assert node[name] == expected, name


def test_init_without_slurm_writes_a_file_that_configures_nothing_yet(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    r = _init(tmp_path, PATH=str(tmp_path / "bin"))  # no sinfo anywhere
    assert r.returncode == 0, r.stderr
    target = tmp_path / "xdg" / "gpuctl" / "config.toml"
    assert (
        r.stdout.strip() == f"wrote {target} (no nodes yet: fill them in); check it with: "
        "gpuctl config check"
    )
    assert "No Slurm here" in target.read_text()
    assert load_config(target).empty
    again = _init(tmp_path, PATH=str(tmp_path / "bin"))
    assert again.returncode == 2 and "exists: --force replaces it" in again.stderr
    assert _init(tmp_path, "--force", PATH=str(tmp_path / "bin")).returncode == 0


def test_init_writes_a_file_only_its_owner_can_write(tmp_path: Path) -> None:
    """Under umask 002 (many sites' default) the file would be group-writable, and refused."""
    (tmp_path / "bin").mkdir()
    old = os.umask(0o002)
    try:
        r = _init(tmp_path, PATH=str(tmp_path / "bin"))
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    target = tmp_path / "xdg" / "gpuctl" / "config.toml"
    assert target.stat().st_mode & 0o777 == 0o644
    assert load_config(target).empty


def test_init_into_a_folder_the_user_names_leaves_its_mode(tmp_path: Path) -> None:
    """``--config ~/gpuctl.toml config init`` must not make the home folder 0700 (38.8)."""
    (tmp_path / "bin").mkdir()
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o755)
    full = node_env({"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PATH": str(tmp_path / "bin")})
    full.pop("GPUCTL_CONFIG", None)
    r = subprocess.run(
        [sys.executable, "-m", "gpuctl", "--config", str(home / "gpuctl.toml"), "config", "init"],
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert load_config(home / "gpuctl.toml").empty
    assert home.stat().st_mode & 0o777 == 0o755


@pytest.mark.slurm
def test_init_with_slurm_names_its_gpu_nodes(tmp_path: Path, slurm_cluster: Any) -> None:
    r = _init(tmp_path, "--stdout", SLURM_CONF=slurm_cluster.env["SLURM_CONF"])
    assert r.returncode == 0, r.stderr
    config = parse_config(r.stdout)
    (cluster,) = config.clusters.values()
    assert [n.name for n in cluster.nodes] == ["localhost"]
    assert "sinfo listed when this file was written" in r.stdout


def test_fleet_table_reaches_the_fleet() -> None:
    from gpuctl.fleet.build import fleet_from_config

    config = parse_config(
        "[fleet]\nliveness_timeout = 5\nconcurrency = 4\n"
        '[clusters.x]\nvia = "local"\nsimulate = 1\n'
    )
    fleet = fleet_from_config(config)
    assert fleet.liveness_timeout == 5.0 and fleet._sem._value == 4
    with pytest.raises(ConfigError, match=r"fleet\.liveness_timeout: must be 0 \(never\) or"):
        parse_config("[fleet]\nliveness_timeout = 0.5\n")


def test_config_check_names_only_the_host_key_policies_that_were_set() -> None:
    from gpuctl.cli.config_cmd import render_inventory
    from gpuctl.config import NodeConfig

    table = render_inventory(
        [
            NodeConfig(name="gpu01", cluster="lab"),  # unset: as the ssh config says
            NodeConfig(name="gpu02", cluster="lab", host_key_policy="accept-new"),
        ],
        {},
    )
    gpu01, gpu02 = table.splitlines()[1:]
    assert "host_keys" not in gpu01 and "None" not in gpu01
    assert gpu02.endswith("host_keys=accept-new")


# -- the config is code: who may write it --------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "who"),
    [(0o666, "group and others"), (0o664, "its group"), (0o646, "others"), (0o606, "others")],
)
def test_a_config_others_can_write_is_refused(tmp_path: Path, mode: int, who: str) -> None:
    """Its ``setup`` lines run as this user on every node: like OpenSSH, one line naming the
    file and its mode (the --config file, $GPUCTL_CONFIG and the user's file alike)."""
    path = tmp_path / "config.toml"
    path.write_text('[clusters.lab]\nnodes = "a"\nsetup = ["touch /tmp/owned"]\n')
    path.chmod(mode)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: Bad owner or permissions (mode 0{mode:o}, writable by {who}")
    assert "\n" not in msg and "chmod go-w" in msg
    path.chmod(mode & ~0o022)  # the same file, writable by its owner only, is read
    assert [n.name for n in load_config(path).nodes()] == ["a"]


def test_a_config_in_a_folder_others_can_write_is_refused(tmp_path: Path) -> None:
    """Its own mode cannot stop another user who may write its folder: they rename their file
    over it. A sticky folder (as /tmp) lets nobody rename another's file."""
    folder = tmp_path / "shared"
    folder.mkdir()
    path = folder / "config.toml"
    path.write_text('[clusters.lab]\nnodes = "a"\n')
    path.chmod(0o644)
    folder.chmod(0o777)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"{path}: Bad owner or permissions: its folder {folder} (mode 0777) is writable by "
        "others than you, who could replace the file (chmod go-w the folder)"
    )
    folder.chmod(0o1777)  # sticky
    assert [n.name for n in load_config(path).nodes()] == ["a"]
    folder.chmod(0o755)
    assert [n.name for n in load_config(path).nodes()] == ["a"]
    if os.geteuid() == 0:  # a folder of another user (root can chown it to uid 65534)
        os.chown(folder, 65534, 65534)
        with pytest.raises(ConfigError, match=r"its folder .* is owned by uid 65534"):
            load_config(path)
        os.chown(folder, 0, 0)


def test_a_group_writable_user_file_and_site_file_are_refused(site: Path, tmp_path: Path) -> None:
    user = tmp_path / "user" / "gpuctl" / "config.toml"
    user.write_text('[tui]\ntheme = "light"\n')
    user.chmod(0o664)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(user))}: Bad owner or permissions"):
        load_config(None)
    user.chmod(0o644)
    (site / "config.toml").write_text(SITE)
    (site / "config.toml").chmod(0o666)
    with pytest.raises(ConfigError, match=r"etc-xdg/gpuctl/config\.toml: Bad owner .*mode 0666"):
        load_config(None)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root (chown)")
def test_a_config_owned_by_another_user_is_refused(site: Path, tmp_path: Path) -> None:
    """A site file owned by another user (uid 65534), even 0644, is theirs to rewrite; one owned
    by root (or by this user) is read."""
    (site / "config.toml").write_text(SITE)
    os.chown(site / "config.toml", 65534, 65534)
    with pytest.raises(ConfigError) as info:
        load_config(None)
    assert str(info.value) == (
        f"{site / 'config.toml'}: Bad owner or permissions (mode 0644, owned by uid 65534, "
        "neither you nor root): another user could run commands on every node through it; "
        "it must be yours or root's, writable only by its owner (chmod go-w)"
    )
    os.chown(site / "config.toml", 0, 0)
    assert len(load_config(None).nodes()) == 4


def test_the_cli_says_it_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[clusters.lab]\nnodes = "a"\n')
    path.chmod(0o666)
    r = _gpuctl("--config", str(path), "config", "check")
    assert r.returncode == 2, r
    assert r.stderr.count("\n") == 1 and f"{path}: Bad owner or permissions (mode 0666" in r.stderr


def test_a_clusters_prometheus_keys_are_what_the_store_client_reads(tmp_path: Path) -> None:
    """One definition (issue 29): ``[clusters.X] prometheus*`` parse into the very target the
    Prometheus client asks with, the selector's braces dropped and a token file read."""
    from gpuctl.fleet.prom import PromClient, PromSource, PromTarget

    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)  # a secret others cannot read (issue 38)
    config = parse_config(
        '[clusters.site]\nprometheus = "http://prom.example:9090/"\n'
        f'prometheus_match = \'{{cluster="a"}}\'\nprometheus_token_file = "{token}"\n'
        "prometheus_allow_plain_http_credentials = true\n"  # over http to another host
    )
    target = config.clusters["site"].prometheus
    assert isinstance(target, PromTarget)
    assert target.matchers() == 'cluster="a"' and target.timeout > 0
    client = PromClient(target)
    assert client.base == "http://prom.example:9090"
    assert client.headers["Authorization"] == "Bearer s3cret"
    source = PromSource(target)
    assert all('cluster="a"' in promql for _metric, promql in source.queries)


def test_a_prometheus_user_and_its_password_file_go_together() -> None:
    """Basic auth needs both (issue 29): a user without the file of its password (the client
    sent an empty one) or a password file without its user is one line naming the key; the
    command line's options are checked by the same code (``gpuctl_tests/cli``)."""
    head = '[clusters.site]\nprometheus = "http://prom:9090"\n'
    with pytest.raises(ConfigError, match=r"prometheus_user: needs prometheus_password_file"):
        parse_config(head + 'prometheus_user = "ops"\n')
    with pytest.raises(ConfigError, match=r"prometheus_password_file: needs prometheus_user"):
        parse_config(head + 'prometheus_password_file = "/etc/pw"\n')
    target = (
        parse_config(head + 'prometheus_user = "ops"\nprometheus_password_file = "/etc/pw"\n')
        .clusters["site"]
        .prometheus
    )
    assert target is not None and (target.user, target.password_file) == ("ops", "/etc/pw")
    assert target.name("prometheus_ca") == "prometheus_ca"  # lines name the config's keys
    # A token beside a user: one of the two would be dropped without a word; refused.
    with pytest.raises(
        ConfigError, match=r"prometheus_token_file: and prometheus_user both set: a store takes"
    ):
        parse_config(
            head + 'prometheus_user = "ops"\nprometheus_password_file = "/etc/pw"\n'
            'prometheus_token_file = "/etc/token"\n'
        )


def test_the_fleet_table_defaults_are_the_fleets_own() -> None:
    """``fleet_from_config`` hands every ``[fleet]`` setting to the fleet, default or not: the
    defaults must be the ones a fleet built without a config has."""
    import inspect
    from dataclasses import fields

    from gpuctl.config import FleetSettings
    from gpuctl.fleet.fleet import Fleet

    params = inspect.signature(Fleet.__init__).parameters
    settings = FleetSettings()
    for f in fields(settings):
        if f.name != "given":
            assert params[f.name].default == getattr(settings, f.name), f.name


def test_each_feature_table_has_a_typed_settings_class_with_its_keys_and_defaults() -> None:
    """``Config.fleet`` ... ``Config.jobs`` are typed (``gpuctl.config.Section``): a field per
    key of ``SECTIONS[name]``, no other, each with the key's default (a list default is a
    tuple), so that a key added to one and not the other fails here."""
    from dataclasses import fields

    from gpuctl.config.keys import SECTIONS

    config = Config()
    for name, keys in SECTIONS.items():
        settings = getattr(config, name)
        assert settings.name == name
        own = {f.name: getattr(settings, f.name) for f in fields(settings) if f.name != "given"}
        assert list(own) == list(keys), name
        for key, spec in keys.items():
            default = tuple(spec.default) if isinstance(spec.default, list) else spec.default
            assert own[key] == default, (name, key)
        assert settings.given_values() == {}


def test_typed_settings_hold_the_checked_values_and_which_keys_were_set(tmp_path: Path) -> None:
    config = parse_config(
        '[jobs]\nsetup = "module load x"\nmax_payload = "1G"\n[fleet]\nbackoff_max = 2\n'
        "[accept]\nexpect_gpus = 8\n",
        str(tmp_path / "c.toml"),
    )
    assert config.jobs.setup == ("module load x",) and config.jobs.max_payload == "1G"
    assert config.jobs.given == {"setup", "max_payload"}
    assert config.fleet.backoff_max == 2.0 and isinstance(config.fleet.backoff_max, float)
    assert config.fleet.concurrency == 32  # the default, not given
    assert config.fleet.given_values() == {"backoff_max": 2.0}
    assert config.accept.expect_gpus == 8


def test_key_lines_finds_each_key_and_skips_what_only_looks_like_one() -> None:
    """``gpuctl.tomllines.key_lines``: the lines tomllib does not give. A ``key =`` inside a
    multi-line string or array is not a key; dotted and quoted keys are split as TOML does."""
    from gpuctl.tomllines import key_lines

    text = "\n".join(
        [
            "read_only = false",  # 1
            "[clusters.lab]",  # 2
            'setup = """',  # 3
            "nodes = not a key",  # 4
            '"""',  # 5
            "nodes = [",  # 6
            '  "a[1-2]",  # python = "x"',  # 7
            "]",  # 8
            'override."node1".python = "p"',  # 9
            "[[jobs.array]]",  # 10
            "'quoted.key' = 1",  # 11
        ]
    )
    found = key_lines(text)
    assert found[("read_only",)] == 1
    assert found[("clusters", "lab")] == 2
    assert found[("clusters", "lab", "setup")] == 3
    assert found[("clusters", "lab", "nodes")] == 6  # not line 4, inside the string
    assert ("clusters", "lab", "python") not in found  # line 7 is inside the array
    assert found[("clusters", "lab", "override", "node1", "python")] == 9
    assert found[("jobs", "array")] == 10
    assert found[("jobs", "array", "quoted.key")] == 11


def test_a_key_after_multi_line_values_is_named_with_its_line(tmp_path: Path) -> None:
    path = str(tmp_path / "c.toml")
    text = '[clusters.lab]\nsetup = """\nport = 1\n"""\nnodes = ["a",\n "b"]\nport = 0\n'
    with pytest.raises(ConfigError) as e:
        parse_config(text, path)
    assert str(e.value) == f"{path}:7: clusters.lab.port: must be within 1..65535; got 0"
