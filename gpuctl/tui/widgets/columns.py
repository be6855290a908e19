"""The column model of the GPU list: a column (``Column``: its title, cells by the list's
width, how it draws a value, the sort its title marks), its cells at a width (``Cell``), the
titles over them (``titles``), and the component classes a cell's colour comes from. The GPU
rows' columns are ``gpu_columns.COLUMNS``, a node's compact line's ``node_columns``; the list
that paints them is ``overview.NodeList``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from rich.segment import Segment
from rich.style import Style

from gpuctl.core.model import NodeState

# A badge's colour: faults in the alarm colour, slowdowns as a warning, the rest (a power cap,
# sync boost) quiet.
BADGE_CLASSES = {
    "LOST": "nodelist--badge",
    "XID": "nodelist--badge",
    "ECC": "nodelist--badge",
    "REMAP": "nodelist--badge",
    "THERM": "nodelist--slow",
    "HWTHERM": "nodelist--slow",
    "HWSLOW": "nodelist--slow",
    "PWRBRAKE": "nodelist--slow",
    "IDLE": "nodelist--slow",  # allocated but idle: "IDLE 42m" (``gpuctl.fleet.idle``)
}
LEVEL_CLASSES = ("nodelist--ok", "nodelist--warm", "nodelist--hot")
STATE_CLASSES = {
    NodeState.LIVE: "nodelist--live",
    NodeState.STALE: "nodelist--stale",
    NodeState.UNREACHABLE: "nodelist--down",
    NodeState.CONNECTING: "nodelist--dim",
}
LIVE_OR_STALE = (NodeState.LIVE, NodeState.STALE)
TEXT_LIMIT = 300  # characters of one node string on a line (the line is cut at the edge anyway)


PLAIN = Style()  # no style (one for every row: a Style costs ~1 us to make, a row ~65 us)


# (row, cells, gap) -> the column's segments: ``cells`` wide, then the gap's spaces. The row is
# a ``Row`` (a GPU's line: ``COLUMNS``) or a ``NodeLine`` (a node's compact line).
Draw = Callable[[Any, int, str], list[Segment]]
# (list width, whether a shown node has GPUs of several models) -> cells; 0: not shown
Cells = Callable[[int, bool], int]


def from_width(*steps: tuple[int, int]) -> Cells:
    """A column's cells by the list's width: ``steps`` are (list width, cells), widest first;
    a list narrower than the last step does not show it."""

    def cells(width: int, _mixed: bool) -> int:
        for at, n in steps:
            if width >= at:
                return n
        return 0

    return cells


class Column(NamedTuple):
    """One column of the GPU list: its title, from which width and how wide it shows, how it
    draws a GPU's value, and the sort its title marks. ``COLUMNS`` holds them in their order
    (``COMPACT_COLUMNS`` the compact list's, a node a line); the rows (``NodeList._gpu``,
    ``_compact``) and the titles (``column_titles``) are both drawn from it, so a column is
    added or moved in one place, and a title cannot drift from its figures.

    Narrow, the model goes first (the same on every row of a node and in its header; a node of
    several models keeps a short tag), then the bars, sparkline and SM clock, so that badges,
    the Slurm job, a burn and the owners stay on an 80-column terminal; wide, bars grow (at 200
    columns 8-cell bars left ~45% of the screen empty) and the registry's other list columns
    come in (fan and P-state from 160 columns, the video engines and PCIe from 190)."""

    key: str  # a metric registry key (``metrics.BY_KEY``) for a reading, else the column's word
    title: str
    cells: Cells
    draw: Draw
    # the title over the cells: ">" right-aligned, "<" left; "bar": left over a bar, right over
    # the bare figure (``figure`` cells) when the list is too narrow for the bar
    align: str = ">"
    figure: int = 0
    gap: int = 2  # spaces after the cells
    sort: str | None = None  # the sort's column word (``gpusort.SORTS``) that marks the title
    reading: bool = True  # shows a reading: a lost GPU's row says LOST from the first such
    # the last column (not None): it takes the rest of the line; its title words after the mark
    rest: str | None = None


class Cell(NamedTuple):
    column: Column
    width: int
    gap: str


def titles(cells: tuple[Cell, ...], mark: dict[str, str], width: int | None = None) -> str:
    """Each column's title over its cells (``Column``'s ``align``); a title wider than its
    cells (a sort's mark) takes its gap's first cells, never the next column's. The last
    title's words close up (" · " to "·") where the list's ``width`` is too narrow for them
    spaced: "OWNERS" was cut at 80 columns with a node of two models (the tag column's 6
    cells) and at 120 columns (the model column and sparkline), by 5 and 8 cells."""
    out: list[str] = []
    for cell in cells:
        c, w = cell.column, cell.width
        title = c.title + mark.get(c.sort, "") if c.sort else c.title
        if c.rest is not None:
            rest = c.rest
            if width is not None and sum(map(len, out)) + len(title) + len(rest) > width:
                rest = rest.replace(" · ", "·")
            out.append(title + rest)
            break
        left = c.align == "<" or (c.align == "bar" and w > c.figure)
        text = f"{title:<{w}}" if left else f"{title:>{w}}"
        out.append(text + " " * max(min(1, c.gap), w + c.gap - len(text)))
    return "".join(out)
