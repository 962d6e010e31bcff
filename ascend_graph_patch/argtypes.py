"""Argument types for the commands: a bad value is a usage error before any work starts.

Why: an A/B arm costs a minute or more (a vLLM engine per arm); an option that cannot work
(``--timeout -5``, a model folder that does not exist, ``--json`` naming a directory) must not
start one, nor be found out after the run, losing its results. Each function here is an
``argparse`` ``type=``: it returns the converted value or raises ``ArgumentTypeError``, which
argparse turns into one line on stderr and exit status 2 (no traceback).

Stdlib only: the CLI imports it on every start.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

#: Longest part of a value quoted in a message (a prefix, then the length).
QUOTE_LIMIT = 60


def quote(value: str, limit: int = QUOTE_LIMIT) -> str:
    """``value`` for a message: non-printable characters escaped, long values cut to a prefix
    and their length (a 5,000-character environment value is not echoed whole)."""
    text = value if value.isprintable() else value.encode("unicode_escape").decode("ascii")
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(value)} characters)"


def _number(kind: Callable[[str], float], name: str, text: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {name} value: {quote(text)}") from None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An integer ``>= minimum``."""

    def convert(text: str) -> int:
        value = int(_number(int, "int", text))
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, not {value}")
        return value

    convert.__name__ = f"int >= {minimum}"
    return convert


def positive_float(text: str) -> float:
    """A finite number ``> 0`` (seconds, tolerances)."""
    value = float(_number(float, "number", text))
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, not {quote(text)}")
    return value


def rate(text: str) -> float:
    """A rate ``> 0``; ``inf`` (all at once) as vLLM's benchmark client allows."""
    value = float(_number(float, "number", text))
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), not {quote(text)}")
    return value


def probability(text: str) -> float:
    """A probability mass in ``(0, 1]`` (top-p)."""
    value = float(_number(float, "number", text))
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], not {quote(text)}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number ``>= 0`` (a tolerance, a request rate)."""
    value = float(_number(float, "number", text))
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, not {quote(text)}")
    return value


def _looks_local(text: str) -> bool:
    """A path as users write local ones (absolute, ``./``, ``../``, ``~``), or one that names
    more than the ``org/name`` of a Hugging Face hub id."""
    if text.startswith(("/", "./", "../", "~")) or text in (".", ".."):
        return True
    return text.count("/") > 1 or os.sep != "/" and os.sep in text


def model(text: str) -> str:
    """``--model``: a local folder must exist and hold a ``config.json``; a hub id
    (``org/name``) without a local folder of that name is left to vLLM, as ``vllm serve``
    does."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty model name")
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise argparse.ArgumentTypeError(f"{quote(text)} is a folder without a config.json")
        return str(path)
    if path.exists():
        raise argparse.ArgumentTypeError(f"{quote(text)} is a file, not a model folder")
    if _looks_local(text):
        raise argparse.ArgumentTypeError(f"no such model folder: {quote(text)}")
    return text


def _writable_ancestor(path: Path) -> None:
    """The nearest existing ancestor of ``path`` is a directory this user may write into."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{quote(str(parent))} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write into {quote(str(parent))}")


def input_file(text: str) -> str:
    """A file to read: it exists and is a regular file."""
    path = Path(text).expanduser()
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "no such file"
        raise argparse.ArgumentTypeError(f"{why}: {quote(text)}")
    return str(path)


def output_dir(text: str) -> str:
    """A report folder: an existing writable directory, or one that can be created."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{quote(text)} exists and is not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"cannot write into {quote(text)}")
        return str(path)
    _writable_ancestor(path)
    return str(path)


def output_file(text: str) -> str:
    """A file to write (``--json FILE``, soak's ``--out``): not a directory; its folder exists,
    or can be created (the command creates it), and is writable."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty path")
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{quote(text)} is a directory, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"cannot write {quote(text)}")
    if path.parent.exists() and not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{quote(str(path.parent))} is not a directory")
    _writable_ancestor(path)
    return str(path)
