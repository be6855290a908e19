"""The README is a front door and the docs site builds clean.

``mkdocs build --strict`` over ``mkdocs.yml`` (its ``validation`` turns a link to a missing page,
a missing anchor, an absolute link or an unrecognised one into a warning, and strict mode fails
on any warning), the README under 400 lines, and every relative link of the README pointing at a
file of the repository (GitHub shows the README outside the site, so mkdocs never checks it).
The keys tables name exactly the binding ids the screen has (``[tui.keys]`` takes those).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote

import pytest
from textual.binding import Binding, BindingType

from gpuctl.tui.app import GpuctlApp
from gpuctl.tui.replay import ReplayApp

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
README_MAX_LINES = 400

# [text](target) and ![alt](target), the target up to a space (a title) or the closing bracket
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def relative_links(markdown: str) -> list[str]:
    """The link targets of ``markdown`` outside code blocks and code spans that name a file of
    the repository (no scheme, no ``mailto:``, not an anchor of the page itself)."""
    text = _FENCE.sub("", markdown)
    text = re.sub(r"`[^`\n]*`", "", text)
    out = []
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        out.append(target)
    return out


def missing_targets(markdown: str, base: Path) -> list[str]:
    """The relative links of ``markdown`` whose file (the part before ``#``) is not there."""
    return [
        t
        for t in relative_links(markdown)
        if not (base / unquote(t.split("#", 1)[0])).resolve().exists()
    ]


def test_the_readme_stays_a_front_door() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines: keep it under {README_MAX_LINES}, "
        "and put the rest into a page of docs/ (mkdocs.yml's nav)"
    )


def test_every_relative_link_of_the_readme_names_a_file() -> None:
    text = README.read_text(encoding="utf-8")
    links = relative_links(text)
    assert "docs/screenshot.svg" in links and "docs/install.md" in links  # the reader works
    assert missing_targets(text, REPO) == []


def test_the_link_reader_finds_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "here.md").write_text("x")
    doc = (
        "[a](here.md) [b](gone.md#part) ![c](img/none.png) [d](https://example.org/x.md)\n"
        "[e](#local) `[f](in-code.md)`\n```\n[g](in-fence.md)\n```\n"
    )
    assert missing_targets(doc, tmp_path) == ["gone.md#part", "img/none.png"]


def key_table_ids(markdown: str) -> set[str]:
    """The binding ids of ``markdown``'s key tables (those headed ``| key | does |``): the
    backquoted words of each row's last column."""
    ids: set[str] = set()
    in_table = False
    for line in markdown.splitlines():
        if line.startswith("| key | does |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table:
            ids |= set(re.findall(r"`([a-z][a-z0-9_]*)`", line.rstrip("| ").rsplit("|", 1)[-1]))
    return ids


def binding_ids(bindings: Iterable[BindingType]) -> set[str]:
    return {b.id for b in bindings if isinstance(b, Binding) and b.id}


def test_the_readme_keys_table_names_every_binding_id_of_the_screen(tmp_path: Path) -> None:
    """The ids ``[tui.keys]`` takes are the ones the help screen lists (``help_rows``); the
    README's table (also the screen page's) must name each, and only those."""
    from gpuctl_tests.tui.conftest import replay_app

    screen = {row[2] for row in replay_app(tmp_path).help_rows()}
    assert key_table_ids(README.read_text(encoding="utf-8")) == screen


def test_the_replay_keys_table_names_every_replay_binding_id() -> None:
    page = (REPO / "docs" / "record-replay.md").read_text(encoding="utf-8")
    replay = binding_ids(ReplayApp.BINDINGS) - binding_ids(GpuctlApp.BINDINGS)
    assert replay and key_table_ids(page) == replay


def build_site(site: Path, config: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's banner about its successor
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config)]
    return subprocess.run(
        [*cmd, "--site-dir", str(site)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _needs_mkdocs() -> None:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
    except ImportError:
        pytest.skip("mkdocs and mkdocs-material are not installed (the `test` extra has them)")


def test_the_docs_site_builds_without_a_warning(tmp_path: Path) -> None:
    _needs_mkdocs()
    r = build_site(tmp_path / "site", REPO / "mkdocs.yml")
    warnings = [line for line in r.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert r.returncode == 0 and warnings == [], r.stderr
    screen = (tmp_path / "site" / "screen" / "index.html").read_text(encoding="utf-8")
    assert "cursor_up" in screen  # the README's keys table, included into the screen page


def test_a_broken_anchor_fails_the_build(tmp_path: Path) -> None:
    """The strictness the site's test relies on: a link to a heading that is not there."""
    _needs_mkdocs()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[there](other.md#no-such-heading)\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    config = re.sub(r"(?ms)^nav:.*", "", config).replace("docs_dir: docs", f"docs_dir: {docs}")
    (tmp_path / "mkdocs.yml").write_text(config)
    r = build_site(tmp_path / "site", tmp_path / "mkdocs.yml")
    assert r.returncode != 0 and "no-such-heading" in r.stderr, r.stderr
