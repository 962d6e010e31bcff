"""Engine arguments (``vllm serve ...``) read by option name, as vLLM's parser reads them.

Why one place: the served A/B builds the server's command line, the worker completes it and the
report describes it; each asks what the user gave after ``--``. Matching by name, in both
spellings (``--name V`` and ``--name=V``), keeps ``--data-parallel-size-local`` from counting as
``--data-parallel-size``.
"""

from __future__ import annotations


def option(args: list[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in ``args`` (the last one), or None."""
    value = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def has_option(args: list[str], *names: str) -> bool:
    """Whether an argument names one of ``names`` (``--name V`` or ``--name=V``)."""
    return any(arg.split("=", 1)[0] in names for arg in args)
