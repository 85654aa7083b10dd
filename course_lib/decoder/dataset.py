"""The text chapter 13's model learns from and is scored on: the standard library's own sources.

Every Python ships them and nobody on the course wrote them.  The lists are
fixed; ``manifest`` records each file's size and SHA-256, so a run says
exactly which text it saw (another Python version has other bytes, and the
record shows it).
"""
from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import numpy as np

TRAIN_FILES = (
    "argparse.py", "inspect.py", "typing.py", "tarfile.py", "zipfile.py", "datetime.py",
    "subprocess.py", "difflib.py", "enum.py", "ipaddress.py", "pickle.py", "pdb.py", "ast.py",
    "optparse.py", "dataclasses.py", "threading.py", "shutil.py", "configparser.py", "pathlib.py",
    "statistics.py", "traceback.py", "os.py", "functools.py", "socket.py", "codecs.py",
    "random.py", "tempfile.py", "tokenize.py", "contextlib.py", "calendar.py", "gzip.py",
    "_collections_abc.py", "ftplib.py", "smtplib.py", "platform.py", "uuid.py",
)
HELDOUT_FILES = ("fractions.py", "heapq.py", "pprint.py")  # never trained on


def stdlib_dir() -> Path:
    """Where this Python's pure-Python standard library lives."""
    return Path(sysconfig.get_paths()["stdlib"])


def read(names) -> bytes:
    """The files' bytes, concatenated in order (each file ends in a newline)."""
    return b"".join((stdlib_dir() / name).read_bytes() for name in names)


def manifest(names) -> list:
    """[{file, bytes, sha256}] for each file: what a run read."""
    rows = []
    for name in names:
        data = (stdlib_dir() / name).read_bytes()
        rows.append({"file": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return rows


def unigram_perplexity(train: bytes, text: bytes) -> float:
    """The baseline: exp(cross-entropy) of ``text`` under the byte frequencies of ``train`` (add-one)."""
    counts = np.bincount(np.frombuffer(train, dtype=np.uint8), minlength=256).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(np.exp(-logp[np.frombuffer(text, dtype=np.uint8)].mean()))
