"""Printed lines that fit a notebook: JupyterLab shows 110 characters of an output line before it wraps
the line wherever the window ends, mid-word.

    from course_lib.views.text import fitted, say, wrapped
    say(f"a long sentence with {numbers} ...")   # wrapped at spaces, continuation lines indented
    with fitted():                               # what a block prints (a check's verdict), wrapped the same
        checks.check_attention(out, q, k, v)
    print(wrapped(report))                       # a text in hand

A table should be printed narrow instead (fewer, shorter columns); ``say`` is for sentences.
"""
from __future__ import annotations

import contextlib
import io
import textwrap

WIDTH = 110   # JupyterLab's output width in its default layout, in characters


def wrapped(text: str, width: int = WIDTH, indent: str = "    ") -> str:
    """``text`` with each of its lines broken at spaces to ``width`` characters, continuations indented by
    ``indent`` beyond the line's own leading spaces."""
    out = []
    for line in str(text).split("\n"):
        lead = line[:len(line) - len(line.lstrip(" "))]
        out.append(textwrap.fill(line, width=width, initial_indent="", subsequent_indent=lead + indent,
                                 break_long_words=False, break_on_hyphens=False, drop_whitespace=True,
                                 replace_whitespace=False) if len(line) > width else line)
    return "\n".join(out)


def say(*parts, sep=" ", width: int = WIDTH) -> None:
    """``print(*parts)``, each line wrapped at spaces to ``width`` characters (``wrapped``)."""
    print(wrapped(sep.join(str(p) for p in parts), width))


@contextlib.contextmanager
def fitted(width: int = WIDTH):
    """Print what the ``with`` block prints, each line ``wrapped``; a block that raises still shows what it
    printed before it did."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            yield
    finally:
        if said.getvalue():
            print(wrapped(said.getvalue(), width), end="")
