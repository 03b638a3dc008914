"""What every dashboard panel is: a titled box that redraws itself from the `DashboardModel`.

The app knows panels only through this class: it places the registered ones (`PANELS` in
`specdash.ui.app`) in its grid and calls `show_numbers` on the numbers tick and `show_plot` on
the slower plot tick, so a new panel is its own file plus one line there.
"""

from __future__ import annotations

from typing import ClassVar

from textual.containers import Vertical

from specdash.ui.dashboard_model import DashboardModel


class Panel(Vertical):
    TITLE: ClassVar[str]
    """The border's title."""
    ID: ClassVar[str]
    """Its id, what the stylesheet and the tests select it by."""

    def __init__(self) -> None:
        super().__init__(id=self.ID)

    def on_mount(self) -> None:
        self.border_title = self.TITLE

    def show_numbers(self, m: DashboardModel) -> None:
        """Redraw the numbers (each second, and at once after a key)."""

    def show_plot(self, m: DashboardModel) -> None:
        """Redraw the plots, if it has any (every two seconds, while they are on screen)."""
