"""Export the current view: a small modal asking for the file name."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class ExportScreen(ModalScreen[str | None]):
    """Returns the path typed (``.jsonl`` or ``.csv``), or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]
    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    ExportScreen > Vertical { width: 80; height: auto; border: thick $primary; background: $surface; padding: 1 2; }
    """

    def __init__(self, count: int, default: str) -> None:
        super().__init__()
        self.count = count
        self.default = default

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Export the {self.count:,} exchanges of the current view (.jsonl or .csv):")
            yield Input(value=self.default, id="export-path")
            yield Label("Enter to write, Esc to cancel", classes="dim")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
