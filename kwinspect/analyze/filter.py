"""The ``--filter`` expression language (grammar and semantics: docs/filter.md).

    api == "Produce" and latency_ms > 50
    topic ~ "orders.*" or error
    not (status == "paired") and client_id in ("a", "b")

A hand-written tokenizer and recursive-descent parser compile an expression
once into a tree of closures over row dicts (``Exchange.row()`` etc.); nothing
is ever passed to ``eval``.  Type errors, unknown columns and bad regular
expressions are found at compile time and raised as :class:`FilterError` with
a one-line message that names the 1-based character position.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kwinspect.analyze.schema_values import ANY_PATH, DECODED_ENCODINGS

Row = dict[str, Any]
Predicate = Callable[[Row], bool]

# Column kinds.  Columns not listed here (a caller's extra columns) are "any":
# compared without compile-time type checks.
STR, INT, FLOAT, BOOL, TS, LIST_STR, LIST_INT, HEADERS, ANY = (
    "text", "integer", "number", "boolean", "timestamp", "list of text",
    "list of integers", "headers", "any",
)

COLUMN_KINDS: dict[str, str] = {
    # exchanges
    "stream": STR, "client": STR, "broker": STR, "api_key": INT, "api_name": STR,
    "api_version": INT, "correlation_id": INT, "client_id": STR, "request_ts": TS,
    "response_ts": TS, "latency_ms": FLOAT, "request_size": INT, "response_size": INT,
    "status": STR, "error_codes": LIST_INT, "error_names": LIST_STR, "topics": LIST_STR,
    "throttle_time_ms": INT, "long_poll": BOOL,
    # records
    "direction": STR, "topic": STR, "partition": INT, "offset": INT, "timestamp": TS,
    "timestamp_type": STR, "key": STR, "key_encoding": STR, "value": STR,
    "value_encoding": STR, "headers": HEADERS, "compression": STR, "magic": INT,
    "crc_ok": BOOL, "producer_id": INT, "producer_epoch": INT, "sequence": INT,
    "is_transactional": BOOL, "is_control": BOOL, "control_type": STR,
    "key_schema_id": INT, "value_schema_id": INT, "value_format": STR,
    # errors
    "kind": STR, "code": INT, "name": STR, "retriable": BOOL, "path": STR,
    "message": STR, "ts": TS,
    # deliveries
    "value_digest": STR, "value_size": INT, "producer_client_id": STR, "produce_ts": TS, "ack_ts": TS,
    "produce_attempts": INT, "error": STR, "times_fetched": INT, "first_fetch_ts": TS,
    "fetch_clients": LIST_STR, "fetch_groups": LIST_STR, "fetch_streams": LIST_STR,
    "fetch_correlation_ids": LIST_INT, "commit_group": STR, "commit_offset": INT, "commit_ts": TS,
    "produce_to_ack_ms": FLOAT, "ack_to_first_fetch_ms": FLOAT, "end_to_end_ms": FLOAT,
    "committed_after_ms": FLOAT, "produce_stream": STR, "produce_correlation_id": INT,
}

_NUMERIC_KINDS = (INT, FLOAT, LIST_INT, TS)
_TEXT_KINDS = (STR, LIST_STR)
_LIST_KINDS = (LIST_STR, LIST_INT, HEADERS)


class FilterError(ValueError):
    """A bad filter expression.  ``str(err)`` is one line; ``position`` is 1-based."""

    def __init__(
        self, message: str, position: int | None = None, expr: str = "", hint: str | None = None
    ) -> None:
        self.message = message
        self.position = position
        self.expr = expr
        self.hint = hint
        text = message if position is None else f"{message} at column {position}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)

    def caret(self) -> str:
        """The expression with a ``^`` under the offending position (two lines)."""
        if self.position is None:
            return self.expr
        return f"{self.expr}\n{' ' * (self.position - 1)}^"


# ---------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class Token:
    kind: str  # IDENT STRING NUMBER OP LPAREN RPAREN COMMA AND OR NOT IN TRUE FALSE NULL EOF
    value: Any
    pos: int  # 0-based offset into the expression
    text: str


_KEYWORDS = {
    "and": "AND", "or": "OR", "not": "NOT", "in": "IN",
    "true": "TRUE", "false": "FALSE", "null": "NULL", "none": "NULL",
}
_NUMBER = re.compile(r"-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")  # a.b: a field path
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'"}


def tokenize(expr: str) -> list[Token]:
    tokens: list[Token] = []
    i, n = 0, len(expr)
    while i < n:
        ch = expr[i]
        if ch.isspace():
            i += 1
            continue
        two = expr[i : i + 2]
        if two in ("==", "!=", "<=", ">=", "!~"):
            tokens.append(Token("OP", two, i, two))
            i += 2
        elif two == "&&":
            tokens.append(Token("AND", "and", i, two))
            i += 2
        elif two == "||":
            tokens.append(Token("OR", "or", i, two))
            i += 2
        elif ch in "<>~":
            tokens.append(Token("OP", ch, i, ch))
            i += 1
        elif ch == "!":
            tokens.append(Token("NOT", "not", i, ch))
            i += 1
        elif ch == "=":
            raise FilterError("'=' is not an operator; use '==' to compare", i + 1, expr)
        elif ch in "([":
            tokens.append(Token("LPAREN", ch, i, ch))
            i += 1
        elif ch in ")]":
            tokens.append(Token("RPAREN", ch, i, ch))
            i += 1
        elif ch == ",":
            tokens.append(Token("COMMA", ch, i, ch))
            i += 1
        elif ch in "\"'":
            value, end = _read_string(expr, i)
            tokens.append(Token("STRING", value, i, expr[i:end]))
            i = end
        elif (m := _NUMBER.match(expr, i)) is not None and (
            ch != "-" or not tokens or tokens[-1].kind in ("OP", "LPAREN", "COMMA", "IN")
        ):
            text = m.group(0)
            after = m.end()
            if after < n and (expr[after].isalnum() or expr[after] == "_"):
                raise FilterError(f"bad number {expr[i:after + 1]!r}", i + 1, expr)
            value: float | int = float(text) if any(c in text for c in ".eE") else int(text)
            tokens.append(Token("NUMBER", value, i, text))
            i = after
        elif (m := _IDENT.match(expr, i)) is not None:
            word = m.group(0)
            kw = _KEYWORDS.get(word.lower())
            if kw is not None:
                val = {"TRUE": True, "FALSE": False, "NULL": None}.get(kw, word.lower())
                tokens.append(Token(kw, val, i, word))
            else:
                tokens.append(Token("IDENT", word, i, word))
            i = m.end()
        else:
            raise FilterError(f"unexpected character {ch!r}", i + 1, expr)
    tokens.append(Token("EOF", None, n, "end of expression"))
    return tokens


def _read_string(expr: str, start: int) -> tuple[str, int]:
    quote = expr[start]
    out: list[str] = []
    i = start + 1
    n = len(expr)
    while i < n:
        ch = expr[i]
        if ch == quote:
            return "".join(out), i + 1
        if ch == "\\" and i + 1 < n:
            nxt = expr[i + 1]
            if nxt in _ESCAPES:
                out.append(_ESCAPES[nxt])
                i += 2
                continue
            if nxt in "xu":
                width = 2 if nxt == "x" else 4
                digits = expr[i + 2 : i + 2 + width]
                if len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits):
                    out.append(chr(int(digits, 16)))
                    i += 2 + width
                    continue
            # Any other backslash sequence is kept as written, so regexes such as
            # "orders\.v1" or "\d+" read naturally.
            out.append(ch)
            out.append(nxt)
            i += 2
            continue
        out.append(ch)
        i += 1
    raise FilterError("unterminated string", start + 1, expr)


# ---------------------------------------------------------------------------
# Parser / compiler
# ---------------------------------------------------------------------------


def _describe(tok: Token) -> str:
    if tok.kind == "EOF":
        return "the end of the expression"
    return repr(tok.text)


def _table_of(columns: Sequence[str]) -> str:
    cols = set(columns)
    if "status" in cols and "latency_ms" in cols:
        return "exchanges"
    if "kind" in cols and "code" in cols:
        return "errors"
    if "crc_ok" in cols:
        return "records"
    return "other"


def _has_error_exchange(row: Row) -> bool:
    codes = row.get("error_codes") or ()
    if any(c for c in codes):
        return True
    return row.get("status") not in ("paired", "no_response_expected", None)


def _has_error_record(row: Row) -> bool:
    return row.get("crc_ok") is False


def _always(_row: Row) -> bool:
    return True


def _never(_row: Row) -> bool:
    return False


def _truthy(col: str) -> Predicate:
    def pred(row: Row) -> bool:
        v = row.get(col)
        return v is not None and v is not False and v != 0 and v != "" and v != []

    return pred


def _parse_ts_literal(text: str) -> float | None:
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# Roots of field paths (value.order_id): the records table's decoded keys and values.
PATH_ROOTS = ("key", "value")


class _Parser:
    def __init__(self, expr: str, columns: Sequence[str],
                 fields: Mapping[str, str] | None = None, record_paths: bool = False) -> None:
        self.expr = expr
        self.fields = fields
        self.record_paths = record_paths  # paths allowed outside the records table (the TUI's exchanges)
        self.paths: list[str] = []  # the field paths the expression names
        self.tokens = tokenize(expr)
        self.i = 0
        self.columns = tuple(columns)
        self.table = _table_of(self.columns)
        self.aliases: dict[str, str] = {}
        if "api_name" in self.columns:
            self.aliases["api"] = "api_name"
        if "topics" in self.columns and "topic" not in self.columns:
            self.aliases["topic"] = "topics"

    # -- token helpers ---------------------------------------------------
    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def advance(self) -> Token:
        tok = self.tokens[self.i]
        if tok.kind != "EOF":
            self.i += 1
        return tok

    def error(self, message: str, tok: Token | None = None, hint: str | None = None) -> FilterError:
        tok = tok if tok is not None else self.tok
        return FilterError(message, tok.pos + 1, self.expr, hint)

    # -- grammar ---------------------------------------------------------
    def parse(self) -> Predicate:
        if self.tok.kind == "EOF":
            raise self.error("empty filter expression")
        pred = self.parse_or()
        if self.tok.kind != "EOF":
            tok = self.tok
            if tok.kind == "RPAREN":
                raise self.error("unmatched ')'")
            raise self.error(f"expected 'and', 'or' or the end of the expression, got {_describe(tok)}")
        return pred

    def parse_or(self) -> Predicate:
        parts = [self.parse_and()]
        while self.tok.kind == "OR":
            op = self.advance()
            if self.tok.kind in ("EOF", "RPAREN", "AND", "OR"):
                raise self.error(f"expected a condition after {op.text!r}")
            parts.append(self.parse_and())
        if len(parts) == 1:
            return parts[0]
        preds = tuple(parts)
        return lambda row: any(p(row) for p in preds)

    def parse_and(self) -> Predicate:
        parts = [self.parse_unary()]
        while self.tok.kind == "AND":
            op = self.advance()
            if self.tok.kind in ("EOF", "RPAREN", "AND", "OR"):
                raise self.error(f"expected a condition after {op.text!r}")
            parts.append(self.parse_unary())
        if len(parts) == 1:
            return parts[0]
        preds = tuple(parts)
        return lambda row: all(p(row) for p in preds)

    def parse_unary(self) -> Predicate:
        if self.tok.kind == "NOT":
            op = self.advance()
            if self.tok.kind in ("EOF", "RPAREN", "AND", "OR"):
                raise self.error(f"expected a condition after {op.text!r}")
            inner = self.parse_unary()
            return lambda row: not inner(row)
        return self.parse_primary()

    def parse_primary(self) -> Predicate:
        tok = self.tok
        if tok.kind == "LPAREN":
            self.advance()
            if self.tok.kind == "RPAREN":
                raise self.error("empty parentheses")
            inner = self.parse_or()
            if self.tok.kind != "RPAREN":
                raise self.error(f"expected ')' to close the '(' at column {tok.pos + 1}, got {_describe(self.tok)}")
            self.advance()
            return inner
        if tok.kind == "IDENT":
            return self.parse_comparison()
        if tok.kind in ("TRUE", "FALSE"):
            self.advance()
            return _always if tok.value else _never
        if tok.kind in ("STRING", "NUMBER", "NULL"):
            raise self.error(
                f"expected a column name, got the value {tok.text}",
                hint="write the column first, e.g. latency_ms > 50",
            )
        if tok.kind == "OP":
            raise self.error(f"expected a column name before {tok.text!r}")
        if tok.kind == "EOF":
            raise self.error("expected a condition")
        raise self.error(f"expected a condition, got {_describe(tok)}")

    def resolve_column(self, tok: Token) -> str:
        name = tok.value
        if name in self.columns:
            return name
        if name in self.aliases:
            return self.aliases[name]
        low = name.lower()
        if low in self.columns:
            return low
        if low in self.aliases:
            return self.aliases[low]
        candidates = list(self.columns) + list(self.aliases) + ["error"]
        close = difflib.get_close_matches(low, candidates, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else None
        raise FilterError(f"unknown column {name!r}", tok.pos + 1, self.expr, hint)

    def resolve_path(self, tok: Token) -> tuple[str, str]:
        """``value.order_id``: a field of decoded keys/values, and its kind."""
        name = tok.value
        root = name.split(".", 1)[0]
        if root.lower() not in PATH_ROOTS or (self.table != "records" and not self.record_paths):
            raise FilterError(f"unknown column {name!r}", tok.pos + 1, self.expr,
                              "fields (a.b) exist only for key and value in the records table")
        name = root.lower() + name[len(root):]
        if self.fields is None:
            raise FilterError(f"unknown column {name!r}", tok.pos + 1, self.expr,
                              "fields of keys and values need --schemas or --schema-registry")
        kind = self.fields.get(name)
        if kind is not None:
            return name, kind
        if ANY_PATH in self.fields:
            return name, ANY
        known = [f for f in self.fields if f.startswith(root.lower() + ".")]
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else (
            f"the schemas have no {root.lower()} fields" if not known else None)
        raise FilterError(f"unknown column {name!r}", tok.pos + 1, self.expr, hint)

    def parse_comparison(self) -> Predicate:
        if "." in self.tok.value:
            path_tok = self.tok
            col, kind = self.resolve_path(path_tok)
            self.paths.append(col)
            pred = self.parse_condition(path_tok, col, kind)
            return _on_path(col, pred)
        name_tok = self.advance()
        if name_tok.value.lower() == "error" and "error" not in self.columns:
            if self.tok.kind in ("OP", "IN"):
                raise self.error(
                    "'error' is a condition, not a column",
                    hint="use it alone (error, not error) or compare error_codes, error_names or kind",
                )
            if self.table == "exchanges":
                return _has_error_exchange
            if self.table == "records":
                return _has_error_record
            return _always  # every row of the errors table is an error
        col = self.resolve_column(name_tok)
        return self.parse_condition(name_tok, col, COLUMN_KINDS.get(col, ANY), advanced=True)

    def parse_condition(self, name_tok: Token, col: str, kind: str,
                        advanced: bool = False) -> Predicate:
        if not advanced:
            self.advance()
        tok = self.tok
        if tok.kind == "OP":
            op = self.advance()
            lit_tok = self.tok
            if lit_tok.kind not in ("STRING", "NUMBER", "TRUE", "FALSE", "NULL"):
                raise self.error(f"expected a value after {op.text!r}")
            self.advance()
            return self.compile_op(col, kind, op, lit_tok)
        if tok.kind == "IN":
            self.advance()
            if self.tok.kind != "LPAREN":
                raise self.error("expected '(' after 'in'", hint='e.g. api in ("Produce", "Fetch")')
            self.advance()
            preds: list[Predicate] = []
            eq = Token("OP", "==", tok.pos, "in")
            while True:
                lit_tok = self.tok
                if lit_tok.kind not in ("STRING", "NUMBER", "TRUE", "FALSE", "NULL"):
                    raise self.error("expected a value in the 'in' list")
                self.advance()
                preds.append(self.compile_op(col, kind, eq, lit_tok))
                if self.tok.kind == "COMMA":
                    self.advance()
                    continue
                if self.tok.kind == "RPAREN":
                    self.advance()
                    break
                raise self.error(f"expected ',' or ')' in the 'in' list, got {_describe(self.tok)}")
            alts = tuple(preds)
            return lambda row: any(p(row) for p in alts)
        if tok.kind in ("STRING", "NUMBER", "IDENT", "TRUE", "FALSE", "NULL"):
            raise self.error(
                f"expected an operator after {name_tok.text!r}",
                hint="one of == != < <= > >= ~ !~ in",
            )
        return _truthy(col)

    # -- typed comparisons ----------------------------------------------
    def compile_op(self, col: str, kind: str, op: Token, lit: Token) -> Predicate:
        value = lit.value
        sym = op.value
        if sym in ("~", "!~"):
            return self.compile_regex(col, kind, op, lit)
        if value is None:
            if sym not in ("==", "!="):
                raise self.error(f"null can only be compared with == or !=, not {sym!r}", op)
            is_null = _null_test(col, kind)
            return is_null if sym == "==" else (lambda row: not is_null(row))
        value = self.coerce(col, kind, op, lit)
        is_list = kind in _LIST_KINDS
        if sym in ("==", "!="):
            if kind == HEADERS:
                raise self.error("headers can only be matched with ~ or !~ (or tested for null)", op)
            eq = _list_eq(col, value) if is_list else _scalar_eq(col, value)
            return eq if sym == "==" else (lambda row: not eq(row))
        if kind == BOOL:
            raise self.error(f"cannot order boolean column {col!r} with {sym!r}", op)
        if kind == HEADERS:
            raise self.error("headers can only be matched with ~ or !~ (or tested for null)", op)
        cmp = _ORDER[sym]
        if is_list:
            return lambda row: any(
                x is not None and _safe_cmp(cmp, x, value) for x in (row.get(col) or ())
            )

        def ordered(row: Row) -> bool:
            v = row.get(col)
            return v is not None and _safe_cmp(cmp, v, value)

        return ordered

    def coerce(self, col: str, kind: str, op: Token, lit: Token) -> Any:
        value = lit.value
        is_bool = isinstance(value, bool)
        is_num = isinstance(value, int | float) and not is_bool
        is_str = isinstance(value, str)
        if kind == ANY:
            return value
        if kind == TS:
            if is_num:
                return float(value)
            if is_str:
                ts = _parse_ts_literal(value)
                if ts is None:
                    raise self.error(
                        f"cannot read {lit.text} as a timestamp", lit,
                        hint='use ISO-8601 like "2024-01-02T03:04:05Z" or epoch seconds')
                return ts
            raise self.error(
                f"column {col!r} is a timestamp, got {lit.text}", lit,
                hint='compare it with a date like "2024-01-02T03:04:05Z" or epoch seconds')
        if kind in (INT, FLOAT, LIST_INT):
            if is_num:
                return value
            hint = "did you mean api_name?" if col == "api_key" and is_str else None
            raise self.error(f"column {col!r} holds numbers, got {lit.text}", lit, hint)
        if kind in _TEXT_KINDS:
            if is_str:
                return value
            raise self.error(
                f"column {col!r} holds text, got {lit.text}", lit,
                hint=f'quote the value, e.g. {col} == "{lit.text}"')
        if kind == BOOL:
            if is_bool:
                return value
            raise self.error(f"column {col!r} is true/false, got {lit.text}", lit)
        if kind == HEADERS:
            return value
        return value

    def compile_regex(self, col: str, kind: str, op: Token, lit: Token) -> Predicate:
        if lit.kind != "STRING":
            raise self.error(f"{op.value!r} needs a quoted regular expression", lit)
        if kind not in (STR, LIST_STR, HEADERS, ANY):
            raise self.error(f"{op.value!r} matches text, but column {col!r} holds {kind}", op)
        try:
            rx = re.compile(lit.value)
        except re.error as e:
            pos = lit.pos + 2 + (e.pos or 0)
            raise FilterError(f"bad regular expression {lit.text}: {e.msg}", pos, self.expr) from None
        search = rx.search
        if kind == HEADERS:
            def match(row: Row) -> bool:
                for h in row.get(col) or ():
                    k, v = h.get("key"), h.get("value")
                    if (k is not None and search(str(k))) or (v is not None and search(str(v))):
                        return True
                return False
        elif kind == LIST_STR:
            def match(row: Row) -> bool:
                return any(x is not None and search(str(x)) for x in (row.get(col) or ()))
        else:
            def match(row: Row) -> bool:
                v = row.get(col)
                if v is None:
                    return False
                if isinstance(v, list):
                    return any(x is not None and search(str(x)) for x in v)
                return search(v if isinstance(v, str) else str(v)) is not None

        if op.value == "~":
            return match
        return lambda row: not match(row)


_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}


def _safe_cmp(cmp: Callable[[Any, Any], bool], a: Any, b: Any) -> bool:
    try:
        return bool(cmp(a, b))
    except TypeError:
        return False


def _same(a: Any, b: Any) -> bool:
    # true == 1 must not hold across types; numbers compare by value (1 == 1.0).
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    return a == b


def _scalar_eq(col: str, value: Any) -> Predicate:
    def eq(row: Row) -> bool:
        v = row.get(col)
        if isinstance(v, list):
            return any(_same(x, value) for x in v)
        return v is not None and _same(v, value)

    return eq


def _list_eq(col: str, value: Any) -> Predicate:
    return lambda row: any(_same(x, value) for x in (row.get(col) or ()))


def _on_path(col: str, pred: Predicate) -> Predicate:
    """A condition on ``value.a.b``, applied to that field of the decoded key/value
    (JSON text with encoding avro/protobuf/json_schema); a missing field is null."""
    root, *parts = col.split(".")
    enc_col = f"{root}_encoding"

    def on_path(row: Row) -> bool:
        v: Any = None
        if row.get(enc_col) in DECODED_ENCODINGS:
            text = row.get(root)
            try:
                v = json.loads(text) if isinstance(text, str) else text
            except ValueError:
                v = None
            for part in parts:
                v = v.get(part) if isinstance(v, dict) else None
        return pred({col: v})

    return on_path


def _null_test(col: str, kind: str) -> Predicate:
    if kind in _LIST_KINDS:
        return lambda row: not row.get(col)
    return lambda row: row.get(col) is None


class CompiledFilter:
    """A compiled expression: call it with a row dict to get True/False."""

    __slots__ = ("expr", "columns", "paths", "_pred")

    def __init__(self, expr: str, columns: tuple[str, ...], pred: Predicate,
                 paths: tuple[str, ...] = ()) -> None:
        self.expr = expr
        self.columns = columns
        self.paths = paths  # field paths of decoded keys/values it names ("value.order_id")
        self._pred = pred

    def __call__(self, row: Row) -> bool:
        return bool(self._pred(row))

    def __repr__(self) -> str:
        return f"CompiledFilter({self.expr!r})"


def compile_filter(expr: str, columns: Iterable[str],
                   fields: Mapping[str, str] | None = None,
                   record_paths: bool = False) -> CompiledFilter:
    """Compile ``expr`` for rows with these ``columns`` (e.g. ``model.EXCHANGE_COLUMNS``).

    The table (exchanges/records/errors) is recognised from the columns; it
    decides what the ``error`` shorthand and the ``topic``/``api`` aliases mean.
    ``fields``: the paths of decoded keys and values the schemas define
    (``{"value.order_id": "integer", ...}``; ``ANY_PATH`` allows any), which
    ``value.order_id == 7`` may name; None: no schemas, so no fields.
    ``record_paths``: allow those paths in a table other than records (the TUI's
    exchanges, whose rows it then gives ``key``/``value`` and their encodings
    of one record at a time); ``CompiledFilter.paths`` lists the ones used.
    Raises FilterError on any problem with the expression.
    """
    cols = tuple(columns)
    parser = _Parser(expr, cols, fields, record_paths)
    pred = parser.parse()
    return CompiledFilter(expr, cols, pred, tuple(dict.fromkeys(parser.paths)))


def names_read(expr: str) -> set[str]:
    """The column names (and field-path roots: ``value`` of ``value.a``) an expression
    names, lower-cased; the ``error`` shorthand included."""
    return {tok.value.split(".", 1)[0].lower() for tok in tokenize(expr) if tok.kind == "IDENT"}


def filter_rows(items: Iterable[Any], flt: Callable[[Row], bool] | None) -> Iterable[Any]:
    """Yield the model rows (anything with ``.row()``, or dicts) that match ``flt``."""
    if flt is None:
        yield from items
        return
    for item in items:
        row = item.row() if hasattr(item, "row") else item
        if flt(row):
            yield item


__all__ = ["ANY_PATH", "COLUMN_KINDS", "CompiledFilter", "FilterError", "compile_filter", "filter_rows",
           "names_read", "tokenize"]
