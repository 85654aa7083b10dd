"""MathJax for the website, served from the site itself so that its pages load nothing from the network.

Sphinx and myst-nb would load MathJax from a CDN.  The copy comes from MathJax's own package on the
npm registry, fetched with Python's urllib (no Node.js, no npm) and checked against the sha512 the
registry publishes for that version, so a tampered or truncated download stops the build.  Only
what a page can load is kept: the combined TeX + MathML + CHTML component and the parts it loads on
demand (TeX extensions, the CHTML fonts, the menu, the accessibility explorer and its speech rules).
"""
from __future__ import annotations

import base64
import hashlib
import io
import shutil
import sys
import tarfile
import urllib.request
from pathlib import Path

VERSION = "3.2.2"
TARBALL = f"https://registry.npmjs.org/mathjax/-/mathjax-{VERSION}.tgz"
# The registry's "integrity" field of mathjax@3.2.2 (npm view mathjax@3.2.2 dist.integrity).
INTEGRITY = "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw=="
ENTRY = "tex-mml-chtml.js"  # what the pages load; the other combined components are never asked for
ON_DEMAND = ("a11y", "adaptors", "input", "output", "sre", "ui")  # folders ENTRY loads from, as needed


def verified(blob: bytes) -> bytes:
    """``blob`` if its sha512 is INTEGRITY (npm's ``sha512-<base64>``), else SystemExit saying so."""
    algorithm, _, expected = INTEGRITY.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, blob).digest()).decode("ascii")
    if got != expected:
        raise SystemExit(f"{TARBALL}: {algorithm} is {got}, expected {expected}: not MathJax {VERSION} as published; "
                         "nothing was installed")
    return blob


def install(static: Path, blob: bytes | None = None) -> Path:
    """Put MathJax under ``static/mathjax`` (once: a copy of this version is kept) and return that folder.

    ``blob``: the tarball's bytes, downloaded when not given.
    """
    target = static / "mathjax"
    stamp = target / ".version"
    if stamp.is_file() and stamp.read_text() == VERSION and (target / ENTRY).is_file():
        return target
    if blob is None:
        with urllib.request.urlopen(TARBALL, timeout=120) as reply:
            blob = reply.read()
    verified(blob)
    shutil.rmtree(target, ignore_errors=True)
    prefix = "package/es5/"
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            rel = member.name[len(prefix):]
            if rel != ENTRY and rel.split("/")[0] not in ON_DEMAND:
                continue
            path = target / rel
            if ".." in Path(rel).parts or not path.resolve().is_relative_to(target.resolve()):
                raise SystemExit(f"{TARBALL}: refusing the member {member.name!r}, which points outside the package")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(tar.extractfile(member).read())
    stamp.write_text(VERSION)
    return target


if __name__ == "__main__":
    print(install(Path(sys.argv[1])))
