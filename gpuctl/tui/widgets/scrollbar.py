"""The app's horizontal scrollbars: a line, not a block of colour that reads as a selected row.

``GpuctlApp`` installs ``LineScrollBar`` as every scrollbar's renderer (``ScrollBar.renderer``,
Textual's documented way); it draws vertical scrollbars as Textual does.
"""

from __future__ import annotations

import inspect
from typing import Any

from rich.segment import Segment, Segments
from rich.style import Style
from textual.color import Color
from textual.scrollbar import ScrollBarRender


class LineScrollBar(ScrollBarRender):
    """A horizontal scrollbar drawn as a line, its thumb ``━`` on a dim ``─`` track: drawn as a
    block of colour as wide as the table above it (Textual's), it read as one more row, the
    selected one (the jobs and acceptance panes at 80 columns). Vertical ones are Textual's."""

    @classmethod
    def render_bar(cls, *args: Any, **kwargs: Any) -> Segments:
        drawn = super().render_bar(*args, **kwargs)
        given = inspect.signature(ScrollBarRender.render_bar).bind(*args, **kwargs)
        given.apply_defaults()
        if given.arguments["vertical"]:
            return drawn
        back_color, bar_color = given.arguments["back_color"], given.arguments["bar_color"]
        track = Color.from_rich_color(back_color).blend(Color.from_rich_color(bar_color), 0.4)
        line = []
        for seg in drawn.segments:
            if seg.control or seg.style is None:
                line.append(seg)  # the line's end
                continue
            thumb = seg.style.meta.get("@mouse.down") == "grab"
            colour = bar_color if thumb else track.rich_color
            style = Style(color=colour, bgcolor=back_color, meta=seg.style.meta)
            line.append(Segment(("━" if thumb else "─") * len(seg.text), style))
        return Segments(line, new_lines=False)
