"""Checks that tell a learner whether an answer is right, and if not, where.

Every check prints one deterministic line (nbval compares it with the stored
one), so a PASS line names the rule but never a measured error or the expected
value.  On failure it prints where it went wrong (the worst element, its row
and tile, the largest absolute and relative errors, the share of elements off,
a small text heat map of where they are) and raises ``CheckFailed``.

The tolerance rule of ``check_attention``, for the dtype the answer is expected
in (q's), never the dtype an answer happens to return:
- float64: |actual - expected| <= atol + rtol * |expected|, the tight bounds of
  ``tolerance(dtype)``;
- float16 / bfloat16 attention, FlashAttention's own rule: the largest error
  of the kernel may be at most twice the largest error of ``naive`` attention
  in the same dtype, plus a rounding term (the error of rounding the float64
  reference to that dtype near its values);
- float32 attention, grounded the same way: an element passes within
  atol + rtol * |expected| or within 2 x naive float32's largest error plus
  the float32 rounding term, whichever is larger.  Fixed bounds alone reject
  correct kernels on FlashAttention's own test inputs (softcap 50 with q
  scaled by 50, ALiBi), where float32 itself is off by more than 1e-5; the
  baseline term grows with what float32 can do on those inputs and nothing
  more, so planted mistakes still fail;
- float8_e4m3fn inputs (with descales; the output is float32): out is held to
  2 x the largest error of ``naive`` float8 (the same recipe: S in float32, P
  rounded to e4m3 before P V) plus float32's rounding term, and lse, which
  comes from float32 scores of the dequantised inputs, to float32's rule.
"""
from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass

import numpy as np

from .core import rules
from .core.backward_options import call_backward
from .core.options import call_forward
from .core.reference import attention_math
from .core.reference_backward import backward_math, naive_backward
from .kernels import naive

# (atol, rtol) per dtype the answer is asked for (never the dtype it comes in).  float32 leaves room for a different
# summation order over a few thousand keys; float64 for the same in double.
TOLERANCE = {
    "float64": (1e-10, 1e-9),
    "float32": (1e-5, 1e-4),
    "float16": (2e-3, 2e-3),
    "bfloat16": (1.6e-2, 1.6e-2),
    "float8_e4m3fn": (6.25e-2, 6.25e-2),  # half a spacing of e4m3's 4 significant bits
    "float8_e5m2": (1.25e-1, 1.25e-1),
}
HEAT_CHARS = " .:*#"  # share of elements off in a heat-map cell: 0, <25%, <50%, <75%, more


class CheckFailed(AssertionError):
    """An answer did not match; the message is the one-line verdict."""

    def _render_traceback_(self):
        """What IPython shows instead of a traceback into this file: the report above says where."""
        return [f"CheckFailed: {self}",
                "(the lines above say where; fix your answer, run its cell, then this check again)"]


@dataclass
class Verdict:
    passed: bool
    line: str
    report: str = ""

    def __str__(self):
        return self.line if self.passed else f"{self.line}\n{self.report}"


def tolerance(dtype) -> tuple:
    """(atol, rtol) for answers of this dtype (float64 for ints and unknowns)."""
    return TOLERANCE.get(np.dtype(dtype).name, TOLERANCE["float64"])


def _announce(verdict: Verdict) -> None:
    """Print the verdict; raise on failure.  Returns None so that a check as
    the last line of a cell displays nothing more (nbval ignores a ``;``)."""
    print(verdict.line)
    if not verdict.passed:
        print(verdict.report)
        raise CheckFailed(verdict.line)


def _shape(x) -> str:
    return "x".join(str(n) for n in x.shape) or "scalar"


# -- comparing arrays -------------------------------------------------------------

def _errors(actual, expected):
    """Absolute errors in float64; NaN or inf where the two disagree on them."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected).astype(np.float64)
    same_special = (np.isnan(a) & np.isnan(e)) | ((a == e) & np.isinf(e))
    with np.errstate(invalid="ignore"):
        err = np.abs(a - e)
    err = np.where(same_special, 0.0, err)
    return a, e, np.where(np.isnan(err), np.inf, err)


def _heat_map(bad: np.ndarray, rows=12, cols=32, row_axis=None) -> str:
    """Text picture of where the mismatches are.

    For an attention output (``row_axis`` given: the query axis) the picture keeps
    the head axis: query rows down, heads across, so a head that reads the wrong
    K/V head shows as one bad column and a tail tile as the bottom rows.  Any
    other array: rows down, last axis across, leading axes folded.
    """
    r = None if row_axis is None else row_axis % bad.ndim
    if r is not None and r >= 1:  # (..., heads, rows, ...): rows down, heads across, the rest folded
        per = np.moveaxis(bad, (r - 1, r), (0, 1))
        grid = per.reshape(per.shape[0], per.shape[1], -1).any(axis=2).T
        across = "heads"
    else:
        grid = bad.reshape(-1, bad.shape[-1]) if bad.ndim >= 2 else bad.reshape(1, -1)
        if bad.ndim > 2:  # fold leading axes (batch, heads) onto the rows they belong to
            grid = bad.reshape(-1, bad.shape[-2], bad.shape[-1]).any(axis=0)
        across = "last axis" if grid.shape[1] > 1 else "value"
    r_edges = np.linspace(0, grid.shape[0], min(rows, grid.shape[0]) + 1).astype(int)
    c_edges = np.linspace(0, grid.shape[1], min(cols, grid.shape[1]) + 1).astype(int)
    lines = []
    for r0, r1 in zip(r_edges[:-1], r_edges[1:]):
        cells = []
        for c0, c1 in zip(c_edges[:-1], c_edges[1:]):
            share = grid[r0:r1, c0:c1].mean()
            cells.append(HEAT_CHARS[0] if share == 0 else HEAT_CHARS[min(4, 1 + int(share * 4))])
        lines.append(f"  rows {r0:>5}-{r1 - 1:<5} |{''.join(cells)}|")
    head = f"  where the errors are ({across} across, '{HEAT_CHARS}' = none .. all off):"
    if across == "heads":
        off = [int(h) for h in np.flatnonzero(grid.any(axis=0))]
        shown = ", ".join(map(str, off[:12])) + (", ..." if len(off) > 12 else "")
        head = (f"  errors in {len(off)} of {grid.shape[1]} heads ({shown}); "
                f"rows down, heads across ('{HEAT_CHARS}' = none .. all off):")
    return "\n".join([head] + lines)


def compare(name, actual, expected, *, bound=None, atol=0.0, rtol=0.0, rule="", block_q=None, row_axis=-2,
            attention=False) -> Verdict:
    """The verdict of ``actual`` against ``expected`` without printing or raising.

    An element is off when its error exceeds both ``bound`` (a single number,
    when given) and ``atol + rtol * |expected|``.  For attention outputs
    (``attention``, or ``block_q`` given; ``row_axis`` is then their query axis)
    the report names the query row of the worst element and draws rows against
    heads; ``block_q``, the answer's query tile, also names its tile.
    """
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.dtype.kind not in "biuf" and actual.dtype.name != "bfloat16":
        return Verdict(False, f"FAIL {name}: expected a numeric array, got dtype {actual.dtype}",
                       "  hint: return a numpy array of numbers")
    if actual.shape != expected.shape:
        return Verdict(False, f"FAIL {name}: shape {actual.shape}, expected {expected.shape}",
                       "  hint: check which axes you summed over or transposed")
    if actual.size == 0:
        return Verdict(True, f"PASS {name}: empty {_shape(actual)} as expected")
    a, e, err = _errors(actual, expected)
    limit = atol + rtol * np.abs(np.nan_to_num(e, posinf=0, neginf=0))
    if bound is not None:  # a baseline's error: the larger of the two allowances holds
        limit = np.maximum(limit, bound)
    bad = err > limit
    if not bad.any():
        return Verdict(True, f"PASS {name}: {_shape(actual)} {actual.dtype.name} within {rule}")
    worst = np.unravel_index(np.argmax(np.where(bad, err / np.maximum(limit, 1e-300), -1)), err.shape)
    lines = [f"  worst element {tuple(int(i) for i in worst)}: got {a[worst]:.6g}, expected {e[worst]:.6g}"]
    tiled = (attention or block_q is not None) and a.ndim >= max(1, -row_axis)
    if tiled:
        row = int(worst[row_axis])
        tile = f", in query tile {row // block_q} of {block_q} rows" if block_q else ""
        lines.append(f"  that is query row {row}{tile}")
    special = ~np.isfinite(err)  # NaN or inf where the expected value differs: no relative error means anything
    if special.any():
        lines.append(f"  {int(special.sum())} element(s) NaN or inf where a different value was expected "
                     f"(max abs error inf; allowed: {rule})")
        finite = bad & ~special
        if finite.any():
            lines.append(f"  among the finite ones, max abs error {err[finite].max():.3g}")
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.where(bad, err / np.abs(e), 0.0)
        lines.append(f"  max abs error {err.max():.3g}, max rel error {rel.max():.3g} (allowed: {rule})")
    lines.append(f"  {int(bad.sum())} of {bad.size} elements off ({100 * bad.mean():.1f}%)")
    if np.isnan(a).any() and not np.isnan(e).any():
        lines.append(f"  {int(np.isnan(a).sum())} NaN in your answer: a 0/0 or inf - inf somewhere?")
    if a.ndim >= 1:
        lines.append(_heat_map(bad, row_axis=row_axis if tiled else None))
    return Verdict(False, f"FAIL {name}: {int(bad.sum())} of {bad.size} elements differ", "\n".join(lines))


def check_close(name, actual, expected, *, dtype=None, atol=None, rtol=None, block_q=None, row_axis=-2) -> None:
    """Check an array elementwise against the expected one (compute that in float64).

    The tolerance is that of ``dtype``, the dtype the exercise asks for
    (default: the expected array's), never that of the answer: a float16
    answer to a float32 case is held to float32's bounds.  Give ``block_q``
    (and ``row_axis``, the query axis) only for an attention output or its lse:
    a failure then names the query tile and draws the rows against the heads.
    """
    dtype = np.dtype(np.asarray(expected).dtype if dtype is None else dtype)
    default_atol, default_rtol = tolerance(dtype if dtype.kind == "f" or dtype.name == "bfloat16" else np.float64)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    return _announce(compare(name, actual, expected, atol=atol, rtol=rtol,
                             rule=f"atol {atol:g}, rtol {rtol:g}", block_q=block_q, row_axis=row_axis))


def check_value(name, actual, expected, *, rtol=1e-6, atol=0.0) -> None:
    """Check a number (an intensity, a byte count, a ridge point)."""
    try:
        value = float(actual)
    except (TypeError, ValueError):
        return _announce(Verdict(False, f"FAIL {name}: expected a number, got {type(actual).__name__}",
                                 "  hint: return a single int or float"))
    ok = abs(value - expected) <= atol + rtol * abs(expected)
    if ok:
        return _announce(Verdict(True, f"PASS {name}: matches within rtol {rtol:g}"))
    ratio = value / expected if expected else float("inf")
    return _announce(Verdict(False, f"FAIL {name}: value is off",
                             f"  got {value:.6g}, expected {expected:.6g} (ratio {ratio:.4g})"))


# -- attention ------------------------------------------------------------------

def _reference64(q, k, v, opts, mask):
    return attention_math(q, k, v, opts, mask, np.float64)


def _describe(q, k, v, options) -> str:
    parts = [q.dtype.name, f"q {_shape(q)}", f"k/v {_shape(k)}/{_shape(v)}"]
    if options.get("causal"):
        parts.append("causal" + (" top-left" if options.get("causal_align") == "top_left" else ""))
    if tuple(options.get("window_size", (-1, -1))) != (-1, -1):
        parts.append(f"window {tuple(options['window_size'])}")
    if options.get("softcap"):
        parts.append(f"softcap {options['softcap']:g}")
    if options.get("alibi_slopes") is not None:
        parts.append("alibi")
    return ", ".join(parts)


def _rounding(expected, dtype) -> float:
    """FlashAttention's rounding term: twice what rounding to ``dtype`` costs near the values."""
    expected = np.nan_to_num(expected, nan=0.0, posinf=0.0, neginf=0.0)
    rounded = expected.astype(dtype)
    return 2 * float(np.max(np.abs((rounded + dtype.type(0.3) - dtype.type(0.3)).astype(np.float64) - expected),
                            initial=0.0))


def _largest(err) -> float:
    """The largest finite error: a baseline that overflowed (inf, NaN) must not open the bound to everything."""
    return float(np.max(err[np.isfinite(err)], initial=0.0))


def _grounded(q, k, v, expected, expected_lse, **options):
    """(bound on out, bound on lse): 2 x naive's largest error in q's dtype, plus the rounding term."""
    baseline, baseline_lse = call_forward(naive.attention_forward, q, k, v, return_lse=True, **options)
    _, _, out_err = _errors(baseline, expected)
    _, _, lse_err = _errors(baseline_lse, expected_lse)
    return (2 * _largest(out_err) + _rounding(expected, rules.out_dtype(q.dtype)),
            2 * _largest(lse_err) + _rounding(expected_lse, np.dtype(rules.lse_dtype(q.dtype))))


def tolerances(q, k, v, expected, expected_lse, **options):
    """The rules for out and for lse, each (bound or None, atol, rtol, rule text), for answers
    expected in q's dtype; naive attention (the baseline) runs at most once."""
    name = q.dtype.name
    atol, rtol = tolerance(q.dtype)
    fixed = (None, atol, rtol, f"atol {atol:g}, rtol {rtol:g}")
    if rules.is_fp8(q.dtype):
        out_bound, lse_bound = _grounded(q, k, v, expected, expected_lse, **options)
        f32_atol, f32_rtol = tolerance(np.float32)
        return ((out_bound, 0.0, 0.0, f"2 x naive {name} error + rounding"),
                (lse_bound, f32_atol, f32_rtol, f"atol {f32_atol:g}, rtol {f32_rtol:g} or 2 x naive error"))
    if rules.is_low_precision(q.dtype):  # lse is float32 there, from rounded scores: fixed bounds
        out_bound, _ = _grounded(q, k, v, expected, expected_lse, **options)
        return (out_bound, 0.0, 0.0, f"2 x naive {name} error + rounding"), fixed
    if q.dtype == np.float32:
        out_bound, lse_bound = _grounded(q, k, v, expected, expected_lse, **options)
        rule = f"atol {atol:g}, rtol {rtol:g} or 2 x naive float32 error + rounding"
        return (out_bound, atol, rtol, rule), (lse_bound, atol, rtol, rule)
    return fixed, fixed


def attention_tolerance(q, k, v, expected, expected_lse=None, **options):
    """(bound or None, atol, rtol, rule text) for attention outputs expected in q's dtype."""
    if expected_lse is None:
        _, expected_lse = call_forward(_reference64, q, k, v, return_lse=True, **options)
    return tolerances(q, k, v, expected, expected_lse, **options)[0]


def check_attention(actual, q, k, v, *, name="attention", lse=None, **options) -> None:
    """Check an attention output (and optionally its lse) against the float64 reference.

    ``options`` are ``course_lib.attention``'s (causal, window_size, ...);
    ``block_q``, the answer's query tile, also names the tile of the worst row on failure.
    """
    expected, expected_lse = call_forward(_reference64, q, k, v, return_lse=True, **options)
    (bound, atol, rtol, rule), for_lse = tolerances(q, k, v, expected, expected_lse, **options)
    label = f"{name} ({_describe(q, k, v, options)})"
    block_q = options.get("block_q")
    verdict = compare(label, actual, expected, bound=bound, atol=atol, rtol=rtol, rule=rule, block_q=block_q,
                      attention=True)
    if verdict.passed and lse is not None:
        lse_bound, lse_atol, lse_rtol, lse_rule = for_lse
        verdict = compare(f"{label} lse", lse, expected_lse, bound=lse_bound, atol=lse_atol, rtol=lse_rtol,
                          rule=lse_rule, block_q=block_q, row_axis=-1, attention=True)
        if verdict.passed:
            verdict.line = f"PASS {label}: out and lse within {rule}"
    return _announce(verdict)


def quietly(check, *args, **kwargs) -> tuple:
    """Run ``check(*args, **kwargs)`` without printing its line: (PASS, the rule it passed within), for a
    lecture that prints many checks as one table.  A failure prints the check's report and raises, as the
    check itself does."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            check(*args, **kwargs)
    except CheckFailed:
        print(said.getvalue(), end="")
        raise
    line = said.getvalue().strip()
    return line.split()[0], line.split(" within ")[-1]


def readonly(*arrays):
    """Read-only copies, for check cells: an answer cannot pass by changing
    the inputs that the expected values are computed from."""
    frozen = []
    for x in arrays:
        x = np.array(x, copy=True)
        x.setflags(write=False)
        frozen.append(x)
    return frozen[0] if len(frozen) == 1 else tuple(frozen)


# -- gradients (chapter 12) --------------------------------------------------------

GRAD_NAMES = ("dq", "dk", "dv")


def gradient_tolerances(q, k, v, out, lse, dout, expected, **options):
    """Per gradient (bound or None, atol, rtol, rule text), for gradients expected in q's dtype.

    FlashAttention's gradient rule: the largest error may be at most twice the largest error of
    the naive backward in the same dtype (P materialised, same precision rule), plus the rounding
    term; float32 also passes within the fixed bounds.  float64: the fixed bounds alone."""
    atol, rtol = tolerance(q.dtype)
    if q.dtype == np.float64:
        return [(None, atol, rtol, f"atol {atol:g}, rtol {rtol:g}")] * 3
    baseline = call_backward(naive_backward, q, k, v, out, lse, dout, **options)
    rules_ = []
    for base, exp in zip(baseline, expected):
        bound = 2 * _largest(_errors(base, exp)[2]) + _rounding(exp, q.dtype)
        if rules.is_low_precision(q.dtype):
            rules_.append((bound, 0.0, 0.0, f"2 x naive {q.dtype.name} backward error + rounding"))
        else:
            rules_.append((bound, atol, rtol, f"atol {atol:g}, rtol {rtol:g} or 2 x naive float32 backward "
                                              "error + rounding"))
    return rules_


def check_attention_backward(grads, q, k, v, out, lse, dout, *, name="backward", **options) -> None:
    """Check (dq, dk, dv) against the float64 gradient of the same out, lse and dout.

    ``options`` are ``course_lib.attention_backward``'s.  The expected gradients come from
    ``reference_backward`` in float64, the tolerance from q's dtype (``gradient_tolerances``)."""
    if not isinstance(grads, (tuple, list)) or len(grads) != 3:
        return _announce(Verdict(False, f"FAIL {name}: expected (dq, dk, dv), got {type(grads).__name__}",
                                 "  hint: return a tuple of three arrays shaped like q, k and v"))
    expected = call_backward(backward_math, q, k, v, out, lse, dout, **options)
    label = f"{name} ({_describe(q, k, v, options)})"
    for grad_name, actual, exp, (bound, atol, rtol, rule) in zip(
            GRAD_NAMES, grads, expected, gradient_tolerances(q, k, v, out, lse, dout, expected, **options)):
        verdict = compare(f"{label} {grad_name}", actual, exp, bound=bound, atol=atol, rtol=rtol, rule=rule,
                          attention=True)
        if not verdict.passed:
            return _announce(verdict)
    return _announce(Verdict(True, f"PASS {label}: dq, dk, dv within {rule}"))
