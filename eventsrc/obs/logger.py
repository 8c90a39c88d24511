"""Structured log lines: ``key=value`` text, or one JSON object per line.

Every line has the same keys in both formats: ``ts``, ``level``, ``logger``, ``msg``, the
fields of the call, and ``cid`` when the line is about a request. Log calls pass fields as
keywords, never %-formatted into the message::

    log = get_logger(__name__)  # each module logs under its own name
    log.info("pod admitted", pod=f"{ns}/{name}", uid=uid)

The correlation id is not passed around: the shell sets it where a request starts
(``with correlation(cid):``) and the formatter reads it. It is a context variable, so it
is per trio task (a task started inside the block inherits it). ``Daemon.record`` stamps
it on the records the request appends, so a log line and its records share one id.

Lines from other libraries (plain ``logging`` calls, %-formatted) come out in the same
format with their message as ``msg`` and no fields.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import IO, Any

from eventsrc.obs.text import escape

FORMATS = ("text", "json")

_correlation_id: ContextVar[str] = ContextVar("eventsrc_correlation_id", default="")
_RESERVED = frozenset({"ts", "level", "logger", "msg", "cid", "exc"})


def current_correlation_id() -> str:
    """The correlation id of the request this task works on ("" when none)."""
    return _correlation_id.get()


@contextlib.contextmanager
def correlation(cid: str) -> Iterator[str]:
    """Lines logged (and records appended) inside the block carry ``cid``."""
    token = _correlation_id.set(cid)
    try:
        yield cid
    finally:
        _correlation_id.reset(token)


class Logger:
    """A ``logging.Logger`` that takes the fields of a line as keywords."""

    __slots__ = ("_logger",)

    def __init__(self, name: str) -> None:
        self._logger = logging.getLogger(name)

    def _log(self, level: int, msg: str, fields: dict[str, Any], exc_info: bool = False) -> None:
        if self._logger.isEnabledFor(level):
            # stacklevel: the line names the caller of info()/warning(), not this module.
            self._logger.log(level, msg, extra={"fields": fields}, exc_info=exc_info, stacklevel=3)

    def debug(self, msg: str, /, **fields: Any) -> None:
        self._log(logging.DEBUG, msg, fields)

    def info(self, msg: str, /, **fields: Any) -> None:
        self._log(logging.INFO, msg, fields)

    def warning(self, msg: str, /, **fields: Any) -> None:
        self._log(logging.WARNING, msg, fields)

    def error(self, msg: str, /, **fields: Any) -> None:
        self._log(logging.ERROR, msg, fields)

    def exception(self, msg: str, /, **fields: Any) -> None:
        """An error with its traceback: only for what is truly unexpected (a bug)."""
        self._log(logging.ERROR, msg, fields, exc_info=True)


def get_logger(name: str) -> Logger:
    return Logger(name)


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def line_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The keys of one line, in order: ts, level, logger, msg, the call's fields, cid."""
    out: dict[str, Any] = {
        "ts": _timestamp(record),
        "level": record.levelname.lower(),
        "logger": record.name,
        "msg": record.getMessage(),
    }
    fields: Mapping[str, Any] = getattr(record, "fields", None) or {}
    for key, value in fields.items():
        if key != "cid":  # explicit or not, the correlation id comes last
            out[f"{key}_" if key in _RESERVED else key] = value
    cid = fields.get("cid") or _correlation_id.get()
    if cid:
        out["cid"] = cid
    return out


def _text_value(value: Any, always_quote: bool = False) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = ""
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, (list, tuple, set, frozenset)):
        text = ",".join(str(v) for v in value)
    elif isinstance(value, Mapping):
        text = json.dumps(_json_value(value), separators=(",", ":"), ensure_ascii=False)
    else:
        text = str(value)
    if always_quote or not text or any(c in text for c in ' "=\\') or not text.isprintable():
        return escape(json.dumps(text, ensure_ascii=False))  # JSON escapes controls only, not bidi
    return text


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


class TextFormatter(logging.Formatter):
    """``ts=... level=info logger=eventsrc.node.daemon msg="ready" root=/x cid=...``; values are
    quoted (as JSON strings) when they hold a space, a quote, ``=`` or a control character."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{k}={_text_value(v, always_quote=k == 'msg')}" for k, v in line_fields(record).items()]
        line = " ".join(parts)
        if record.exc_info:  # a bug: the traceback follows the line, for a person to read
            line += "\n" + self.formatException(record.exc_info)
        return line


class JSONFormatter(logging.Formatter):
    """One JSON object per line, with the keys of the text format (a traceback in ``exc``)."""

    def format(self, record: logging.LogRecord) -> str:
        obj = {k: _json_value(v) for k, v in line_fields(record).items()}
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, ensure_ascii=False)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``setup`` installs (and replaces when called again)."""


def setup(level: str = "info", fmt: str = "text", stream: IO[str] | None = None) -> None:
    """Send every logger's lines to ``stream`` (stderr) in ``fmt``, from ``level`` up."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}")
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
