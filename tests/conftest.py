"""What the test modules share: the repository's path, random q, k, v, random attention
problems for hypothesis, the scripts run in numba's simulator, the browser the real-browser tests drive, and the
markers that skip a test where this machine cannot run it.

A test module imports the names (``from conftest import REPO, make_qkv``); the markers need no
import:

- ``@pytest.mark.needs_sandbox``: the grader's bubblewrap sandbox starts here (probed once, and
  only when a test that needs it runs: starting one takes a fraction of a second);
- ``@pytest.mark.needs_root("why")``: the test runs as root;
- ``@pytest.mark.needs_chromium``: Debian's chromium is installed at ``CHROMIUM``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]

FLOAT_DTYPES = (np.float64, np.float32, np.float16, ml_dtypes.bfloat16)


def make_qkv(rng, batch, heads, heads_k, nq, nk, d, dv=None, dtype=np.float64, q_scale=1.0, k_scale=1.0):
    """Unit-normal q (batch, heads, nq, d), k (batch, heads_k, nk, d), v (batch, heads_k, nk, dv), drawn in that order.

    ``rng``: a numpy Generator, or a seed for a fresh one.  ``dv`` is ``d`` unless given.  ``q_scale``
    and ``k_scale`` widen q and k before the cast (scores far from 0: a softcap that bites, overflow).
    """
    rng = np.random.default_rng(rng)
    dv = d if dv is None else dv
    q = (q_scale * rng.standard_normal((batch, heads, nq, d))).astype(dtype)
    k = (k_scale * rng.standard_normal((batch, heads_k, nk, d))).astype(dtype)
    v = rng.standard_normal((batch, heads_k, nk, dv)).astype(dtype)
    return q, k, v


@st.composite
def attention_problems(draw, batch=st.integers(0, 2), seqlen=st.integers(0, 9), head_dim=st.integers(1, 16),
                       head_dim_v=st.integers(1, 7), heads_k=st.integers(1, 3), window=st.integers(-1, 4),
                       softcap=st.sampled_from([0.0, 0.7, 5.0]), softmax_scale=st.none(), block=None,
                       alibi=st.sampled_from([None, "heads", "batch_heads"]), dtype=st.sampled_from(FLOAT_DTYPES)):
    """A random attention problem ``(shape, options, dtype, seed)``; ``make_qkv(seed, dtype=dtype, **shape)`` makes it.

    Each argument is the strategy of one axis.  The shape has 1-3 query heads per K/V head, and Nq,
    Nk are drawn apart from ``seqlen``.  The options hold every mask (causal, either alignment, a
    window of ``window`` sides), a softcap, ALiBi slopes per head or per (batch, head) (``alibi``
    draws None, "heads" or "batch_heads") and, where ``block`` is a strategy, the tiles.
    """
    heads_k = draw(heads_k)
    shape = dict(batch=draw(batch), heads=heads_k * draw(st.integers(1, 3)), heads_k=heads_k,
                 nq=draw(seqlen), nk=draw(seqlen), d=draw(head_dim), dv=draw(head_dim_v))
    options = dict(causal=draw(st.booleans()), causal_align=draw(st.sampled_from(["bottom_right", "top_left"])),
                   window_size=(draw(window), draw(window)), softcap=draw(softcap))
    scale = draw(softmax_scale)
    if scale is not None:
        options["softmax_scale"] = scale
    if block is not None:
        options.update(block_q=draw(block), block_k=draw(block))
    layout = draw(alibi)
    if layout is not None:
        slopes_shape = {"heads": (shape["heads"],), "batch_heads": (shape["batch"], shape["heads"])}[layout]
        options["alibi_slopes"] = np.linspace(0.05, 0.7, int(np.prod(slopes_shape))).reshape(slopes_shape)
    return shape, options, draw(dtype), draw(st.integers(0, 2 ** 16))


# -- numba's simulator --------------------------------------------------------------------------

def simulator_verdicts(script: str, timeout: int = 900) -> dict:
    """Run ``tests/<script>`` in a subprocess with numba's simulator (NUMBA_ENABLE_CUDASIM=1 must be set
    before numba is imported) and return the verdicts it prints as its last line, a JSON object."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(REPO / "tests" / script)], capture_output=True, text=True,
                            env=env, cwd=REPO, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- the markers ----------------------------------------------------------------------------------

def pytest_configure(config):
    config.addinivalue_line("markers", "needs_sandbox: skip unless the grader's bubblewrap sandbox starts here")
    config.addinivalue_line("markers", "needs_root(why): skip unless the tests run as root; why says what needs it")
    config.addinivalue_line("markers", f"needs_chromium: skip unless {CHROMIUM} is installed")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skip before the test's fixtures are set up (a module's graded batch is not run for nothing)."""
    if item.get_closest_marker("needs_chromium") and not os.path.exists(CHROMIUM):
        pytest.skip(f"real-browser test skipped: {CHROMIUM} not found (install Debian's 'chromium' package; "
                    ".ci/run does)")
    root = item.get_closest_marker("needs_root")
    if root and (sys.platform != "linux" or os.geteuid() != 0):
        pytest.skip(f"needs root: {root.args[0]}")
    if item.get_closest_marker("needs_sandbox"):
        from course_lib.grading import sandbox
        if not sandbox.available():
            pytest.skip("no bubblewrap sandbox here (.ci/run installs it: apt-get install bubblewrap)")
