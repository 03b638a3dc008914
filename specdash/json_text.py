"""JSON from a user's file, with every way Python's `json` fails on it said in one line.

Valid JSON can still be beyond the reader: nesting deeper than the interpreter's recursion
limit, or an integer longer than Python converts from text (4,300 digits). Both, like bad
JSON and bytes that are not UTF-8, become one `JsonTextError` whose message a person can
read, so each caller needs a single `except` to turn it into its error line.
"""

from __future__ import annotations

import json
from typing import Any


class JsonTextError(ValueError):
    """Text that `loads` cannot turn into a value; `str()` says why in a few words."""


def loads(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise JsonTextError(e.msg) from None
    except UnicodeDecodeError as e:
        raise JsonTextError(f"not UTF-8: {e.reason}") from None
    except RecursionError:
        raise JsonTextError("nested too deeply to read") from None
    except ValueError as e:  # an integer too long to convert; the rest names a Python call
        raise JsonTextError(str(e).split(";")[0]) from None
