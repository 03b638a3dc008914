"""A Static that only re-renders when its text changed, and asks for a layout pass only when
its height changed: a layout pass re-arranges the whole screen, while most updates
change a few digits in a readout whose size stays put."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from rich.text import Text
from textual.widgets import Static

if TYPE_CHECKING:
    from textual.css.styles import RulesMap


class Readout(Static):
    _shown: str | Text | None = None

    def show_text(self, content: str | Text) -> None:
        if content == self._shown:
            return
        self._shown = content
        self.update(content, layout=False)
        if self._height_changed():
            self.refresh(layout=True)

    def _height_changed(self) -> bool:
        """Whether the new content needs another height (only for `height: auto`)."""
        height = self.styles.height
        if height is not None and not height.is_auto:
            return False  # the stylesheet fixes the height
        width = self.content_size.width
        if not width or not self.display:
            return True  # not laid out yet: let layout decide
        # Textual's own widgets pass their RenderStyles where its signature says RulesMap
        styles = cast("RulesMap", self.styles)
        return self.visual.get_height(styles, width) != self.content_size.height
