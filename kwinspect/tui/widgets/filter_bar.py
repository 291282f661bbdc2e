"""The filter bar: the `--filter` expression language, checked as you type.

With schemas, ``value.<path>`` and ``key.<path>`` name fields of decoded record
keys and values (``tui.record_match``): such a filter selects the exchanges with
at least one matching record."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Input, Static

from kwinspect.analyze.filter import FilterError
from kwinspect.analyze.termsafe import term_safe


class FilterBar(Horizontal):
    """``/`` focuses it; Enter applies, Escape leaves; errors show below without applying."""

    DEFAULT_CSS = """
    FilterBar { height: 1; }
    FilterBar Input { width: 1fr; height: 1; border: none; padding: 0 1; }
    FilterBar Input:focus { border: none; background: $boost; }
    FilterBar #filter-state { width: auto; max-width: 60%; padding: 0 1; color: $text-muted; }
    FilterBar.-invalid #filter-state { color: $error; }
    """

    class Applied(Message):
        """A valid expression (or "" for none) was submitted; ``predicate`` is compiled."""

        def __init__(self, expr: str, predicate) -> None:  # noqa: ANN001
            super().__init__()
            self.expr = expr
            self.predicate = predicate

    def compose(self) -> ComposeResult:
        yield Input(placeholder='filter (/):  api == "Produce" and latency_ms > 50   ·   error   ·   topic ~ "orders.*"',
                    id="filter-input")
        yield Static("", id="filter-state")

    def _compile(self, expr: str):  # noqa: ANN202
        # the app's compiler: exchange columns, plus key./value. fields with --schemas
        return self.app.record_filtering.compile(expr)

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        state = self.query_one("#filter-state", Static)
        try:
            self._compile(event.value)
        except FilterError as exc:
            self.add_class("-invalid")
            state.update(term_safe(str(exc), 120))
            return
        self.remove_class("-invalid")
        state.update("Enter to apply" if event.value.strip() else "")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            pred = self._compile(event.value)
        except FilterError as exc:
            self.app.notify(term_safe(str(exc), 200), title="bad filter", severity="error")
            return
        self.query_one("#filter-state", Static).update("")
        self.post_message(self.Applied(event.value.strip(), pred))

    def set_expr(self, expr: str) -> None:
        self.query_one("#filter-input", Input).value = expr
