"""A site, (code, line), is where in the kernel's source an access or a barrier happened; a finding quotes it."""
from __future__ import annotations

import linecache
import re


def site(frame):
    """The site a frame of the kernel is at."""
    return frame.f_code, frame.f_lineno


def where(site):
    """'line 17 of reverse (`out[i] = tile[t]`)'."""
    code, line = site
    text = linecache.getline(code.co_filename, line).split("  #")[0].strip()
    return f"line {line} of {code.co_name}" + (f" (`{text}`)" if text else "")


def declared_name(site, fallback):
    """The variable a ``cuda.shared.array`` / ``cuda.local.array`` line assigns to."""
    code, line = site
    m = re.match(r"\s*(\w+)\s*(?::[^=]*)?=", linecache.getline(code.co_filename, line))
    return m.group(1) if m else fallback
