"""The help screen (`?`): every key, the filter language in one glance."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

HELP = """\
# kwinspect TUI

## Exchange list
| key | action |
|---|---|
| `↑ ↓` `j k`, `PgUp PgDn`, `Home End` (`g G`) | move; `End` also follows the tail (live) |
| `Enter`, double click | open the selected exchange in the detail pane |
| `/` | edit the filter (Enter applies, Esc returns to the list) |
| `E` | toggle: errors and anomalies only |
| `a` | toggle: only the api of the selected exchange |
| `n` | toggle: only the connection of the selected exchange |
| `s` | toggle sort: capture order / slowest first |
| `Ctrl+R` | clear filter and toggles |
| `x` | export the current view to .jsonl or .csv |
| `Tab` | move focus: list, detail pane, filter |
| `1 2 3 4` | detail tabs: request, response, records, hex |
| `h` | hex view: switch between request and response frame |
| `d` | show/hide the detail pane (more rows) |

## Other views
| key | view |
|---|---|
| `e` | errors and anomalies (`Enter` jumps to the exchange) |
| `c` | connections and brokers (ApiVersions negotiated per connection) |
| `l` | latency percentiles per api and latency over time |
| `t` | traffic over time: requests/s and p99 latency per api |
| `D` | diagnosis: findings by severity, their detail and evidence (`Enter` jumps to the exchange) |
| `J` | deliveries: every acknowledged record and its journey: produce, ack, fetches, commit (`Enter` jumps to the exchange) |
| `?` | this help |
| `Esc` / `q` | back; `q` on the main view quits |

## Filter language (same as `--filter`)
`api == "Produce" and latency_ms > 50` · `error` · `topic ~ "orders.*"` ·
`not (status == "paired")` · `client_id in ("a", "b")` · `broker == "10.0.0.1:9092"`

Columns: stream, client, broker, api_key, api_name (`api`), api_version,
correlation_id, client_id, request_ts, response_ts, latency_ms, request_size,
response_size, status, error_codes, error_names, topics (`topic`), throttle_time_ms,
long_poll.

Everything that comes off the wire (client ids, topics, keys, values) is shown
with control characters escaped (`\\x1b`), so a capture cannot drive your terminal.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; height: 90%; border: thick $primary; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Markdown(HELP)
