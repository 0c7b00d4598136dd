"""Benchmark children that read compiled bytecode, as a package installed from a wheel has it.

This environment may set ``PYTHONDONTWRITEBYTECODE=1``: then every child would compile ``telegram_fence`` from
source (telebot and psycopg are read from the bytecode their installs wrote), and the compiler's time and garbage
would count against the fence alone. :func:`child_env` gives a child a ``PYTHONPYCACHEPREFIX`` of the run's own
instead; one unrecorded child per variant writes the bytecode the recorded ones read. ``cache=None`` (the
benchmarks' ``--source``) keeps the environment as it is.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping


def cache_dir(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A temporary folder for the children's bytecode, removed when the returned object is cleaned up."""
    return tempfile.TemporaryDirectory(prefix=prefix)


def child_env(cache: str | None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with compiled bytecode kept in ``cache`` whatever
    ``PYTHONDONTWRITEBYTECODE`` says; unchanged when ``cache`` is None."""
    env = dict(os.environ if base is None else base)
    if cache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache
    return env
