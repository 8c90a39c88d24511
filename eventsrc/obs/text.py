"""Text from peers made safe to show: one escaper for the CLI's output, the daemon's log and the
node API's messages.

``escape`` writes every control, format (bidi overrides and isolates, zero-width characters),
surrogate and line-separator character as an escape (``\\n``, ``\\x1b``, ``\\u202e``), so a
value can neither split a line, forge one, move the cursor, colour the terminal nor reorder
what is shown. Everything else is left as it is.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories written as escapes: control (Cc), format (Cf: U+202A-U+202E,
#: U+2066-U+2069, zero-width characters...), lone surrogates (Cs; they cannot even be encoded)
#: and the line and paragraph separators (Zl, Zp), which some terminals break lines at.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(char: str) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape(text: str) -> str:
    """``text`` safe to show on a terminal, on one line (see the module's docstring)."""
    if text.isprintable():  # the usual case: nothing to escape
        return text
    return "".join(_escaped(c) if unicodedata.category(c) in _ESCAPED_CATEGORIES else c for c in text)
