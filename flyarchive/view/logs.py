"""The viewer's log (logger ``flyarchive.view``; aiohttp's own lines under
``flyarchive.view.http``): one line per event. Anything a client sends (a path, a header,
a filter) may reach a line, so every line is made safe for a terminal here
(:class:`SafeLines`): control and other non-printing characters are written as escapes
(``\\x1b``, ``\\u202e``), an exception becomes its last line, and the access token is
never printed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

#: The viewer's logger, and the one aiohttp's request handlers write to.
LOGGER = "flyarchive.view"
HTTP_LOGGER = "flyarchive.view.http"


def visible(text: str, limit: int | None = None) -> str:
    """``text`` with every non-printing character (C0 and C1 controls, line and paragraph
    separators, bidirectional marks, ...: all that :meth:`str.isprintable` refuses, the
    space aside) written as a Python escape; cut to ``limit`` characters (then ``...``)."""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c == " " else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class SafeLines(logging.Filter):
    """Rewrites each record of the loggers it is attached to as one safe line.

    Args:
        secrets: Texts never printed (the access token); each is written ``<token>``.
    """

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(s for s in secrets if s)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            err = record.exc_info[1]
            text = f"{text}: {type(err).__name__}: {err}"
        for secret in self.secrets:
            text = text.replace(secret, "<token>")
        record.msg, record.args = visible(text), None
        record.exc_info = record.exc_text = None
        record.stack_info = None
        return True

    def attach(self) -> None:
        """Filter the viewer's loggers (:data:`LOGGER`, :data:`HTTP_LOGGER`)."""
        for name in (LOGGER, HTTP_LOGGER):
            logging.getLogger(name).addFilter(self)

    def detach(self) -> None:
        for name in (LOGGER, HTTP_LOGGER):
            logging.getLogger(name).removeFilter(self)
