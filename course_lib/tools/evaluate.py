"""Judge the kernels inside chapter 13's model, the brief's checklist as measured tables.

    python -m course_lib.tools.evaluate [--quick] [--impls reference flash_numpy ...] [--only quality ...] [--out FILE]

Tables, every row a JSON-line record (``--out``) carrying the impl, the
precision, the phase (prefill | decode), the attention shape (B, H, H_kv, Nq,
Nk, D), the mask, the KV cache, what the time measures (``layer``) and where
it ran:

1. quality: held-out perplexity with every impl and precision, scored as
   prefill (whole windows) and as decode (one byte at a time through the KV
   cache, contiguous and paged), beside the byte-unigram baseline; fp8 and
   "auto" (chapter 11's fallback, each call's choice recorded per layer) join
   float32 / float16 / bfloat16 for the impls that take fp8;
2. prefill vs decode: time to first token of a short and a long prompt, time
   per output token with a contiguous cache, a paged cache and none;
3. the layers of one decode step: the kernel alone, the Python call
   (``course_lib.attention``: validation, then the kernel), the whole token;
4. split-KV decode: the keys of one query split over the cores, merged by lse;
5. custom masks: a document mask and a prefix-LM mask, the tile-skipping
   rewrite against the dense slow path: same quality, tiles, time.

Times are medians of repeats after a warm-up on a shared machine: compare rows
of one run only, as ratios.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np

from .. import kernels, lowp
from ..api import attention, available_impls
from ..bench.records import environment, new_run, write_records
from ..bench.timing import time_interleaved, time_it
from ..core.options import attention_options
from ..decoder import custom_masks, dataset
from ..decoder.split_kv import split_kv_decode
from ..decoder.transformer import Transformer
from ..views.text import wrapped

# The precision table's rows: the dtype attention's q, k, v and the KV cache
# are stored in.
PRECISIONS = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# And two rows through chapter 11's hook (``lowp``): "fp8", q, k, v quantised to
# e4m3 with descales per (batch, heads_k) at every attention call (the KV cache
# keeps float32 and the cached K / V are quantised afresh with the new token's),
# and "auto", the fallback choosing fp8 / fp16 / fp32 per call for ``AUTO_BUDGET``.
LOWP_PRECISIONS = ("fp8", "auto")
FP8_IMPLS = ("reference", "naive", "flash_numpy", "flash_numba_cpu")  # the impls that take descales
# The largest absolute error of a layer's attention output "auto" accepts.  Its
# rows (|V| reaches about 3) sit between what the probe predicts for fp8 on the
# short rows of decode (0.1 to 0.25) and on 64-byte prefill windows (0.3 to 0.55),
# so one run shows both branches: a deployment sets it from its quality target.
AUTO_BUDGET = 0.25
GROUPS = ("quality", "prefill", "decode", "layers", "split", "masks")
# What a record's time covers, from one attention call up to a whole scoring pass of the model
# (the kernel benchmarks' own layers are bench.LAYERS).
LAYERS = ("kernel", "kernel + split and merge", "Python call", "one attention call", "whole token",
          "time per output token", "time to first token", "whole forward pass", "whole scoring pass")
SIMULATED = "flash_numba_cuda"  # runs in numba's CUDA simulator here: tiny shapes only
PAGED = "paged block-table reader"  # the paged cache's own decode attention
DEFAULT_OUT = Path("notebooks/records/model_eval.jsonl")
TEXT_START = 2048  # past the files' licence headers: scored text is code


def make_record(table, *, impl, dtype="float32", phase, shape, seconds=None, perplexity=None,
                unigram_perplexity=None, kv_cache=None, mask="causal", layer=None, run, env, **extra) -> dict:
    """One row: what was run (impl, precision, phase, shape, mask, cache), what came out, where."""
    B, H, Hk, Nq, Nk, D = (int(n) for n in shape)
    return {"table": table, "impl": impl, "dtype": str(np.dtype(dtype)) if not isinstance(dtype, str) else dtype,
            "phase": phase, "perplexity": perplexity, "unigram_perplexity": unigram_perplexity,
            "seconds": seconds, "layer": layer, "kv_cache": kv_cache, "mask": mask,
            "shape": {"batch": B, "heads": H, "heads_k": Hk, "seqlen_q": Nq, "seqlen_k": Nk, "head_dim": D},
            **extra, "run": run, "environment": env}


class Evaluation:
    """The model, the held-out text and the settings of one run."""

    def __init__(self, model=None, *, quick=False, impls=None, repeats=None):
        self.model = model or Transformer.load()
        self.quick = quick
        self.impls = list(impls) if impls else available_impls()
        unknown = [name for name in self.impls if name not in kernels.IMPLS]
        if unknown:
            raise ValueError(f"unknown impls {unknown}; choose from {available_impls()}")
        self.repeats = repeats or (3 if quick else 7)
        self.text = dataset.read(dataset.HELDOUT_FILES)
        self.unigram = dataset.unigram_perplexity(dataset.read(dataset.TRAIN_FILES), self.text)
        self.run, self.env = new_run(), environment()
        c = self.model.config
        self.heads = (c.n_heads, c.n_kv_heads, c.head_dim)

    def shape(self, batch, nq, nk):
        H, Hk, D = self.heads
        return (batch, H, Hk, nq, nk, D)

    def rec(self, table, **fields):
        fields.setdefault("unigram_perplexity", self.unigram)
        return make_record(table, run=self.run, env=self.env, **fields)

    # -- 1. quality ---------------------------------------------------------------

    def quality_plan(self):
        """(impl, precision, phase, kv_cache) rows of the quality table, cheap ones first."""
        rows = []
        for impl in self.impls:
            for name in PRECISIONS:
                if impl == SIMULATED and name != "float32":
                    continue  # the CUDA kernel is float32 only
                rows.append((impl, name, "prefill", None))
            if not (impl == SIMULATED and self.quick):
                rows.append((impl, "float32", "decode", "contiguous"))
            if impl in FP8_IMPLS:
                rows += [(impl, name, phase, kv) for name in LOWP_PRECISIONS
                         for phase, kv in (("prefill", None), ("decode", "contiguous"))]
        # The paged cache's decode reads K / V through the block table with its own
        # loop (kv_cache.paged_decode_attention), whatever the impl of the prefill.
        rows += [(PAGED, name, "decode", "paged") for name in PRECISIONS]
        return rows

    def quality_row(self, impl, precision, phase, kv_cache):
        c = self.model.config
        extra, attend = {}, impl
        if precision in LOWP_PRECISIONS:
            dtype = np.float32  # the model hands float32 to the hook, which stores q, k, v as it says
            attend = (lowp.precision_attention("fp8", impl=impl) if precision == "fp8"
                      else lowp.AutoAttention(AUTO_BUDGET, impl=impl))
            extra = {"attention_inputs": "float8_e4m3fn, descales per (batch, heads_k), quantised at every call",
                     "kv_cache_stores": "float32" if phase == "decode" else None}
        else:
            dtype = PRECISIONS[precision]
        if impl == SIMULATED:  # one Python thread per CUDA thread: a few bytes only
            length, windows = (16, 1) if phase == "prefill" else (8, 1)
        else:
            length = 64 if self.quick else c.context
            windows = (2 if self.quick else 16) if phase == "prefill" else 1
        text = self.text[TEXT_START:TEXT_START + windows * length + 1]
        start = time.perf_counter()
        if phase == "prefill":
            ppl = self.model.perplexity(text, impl=attend, dtype=dtype, length=length)
            shape = self.shape(min(windows, 8), length, length)
        else:
            ppl = self.model.decode_perplexity(text, impl="reference" if impl == PAGED else attend,
                                               dtype=dtype, kv_cache=kv_cache)
            shape = self.shape(1, 1, length)
        seconds = time.perf_counter() - start
        if precision == "auto":
            extra.update(budget=AUTO_BUDGET, **choices_by_layer(attend.choices, c.n_layers))
        truth = (self.model.perplexity(text, length=length) if phase == "prefill"
                 else self.model.perplexity(text, length=len(text) - 1))
        unigram = dataset.unigram_perplexity(dataset.read(dataset.TRAIN_FILES), text)
        return self.rec("quality", impl=impl, dtype=precision, phase=phase, shape=shape, perplexity=ppl,
                        unigram_perplexity=unigram,
                        kv_cache=kv_cache, seconds=seconds, layer="whole scoring pass", text_bytes=len(text),
                        reference_perplexity=truth, relative_change=ppl / truth - 1.0, **extra)

    # -- 2. prefill vs decode, 3. the layers of a decode step -----------------------

    def timing_impls(self):
        return [impl for impl in self.impls if impl != SIMULATED and impl != "flash_numpy_fa1"]

    def prefill_rows(self, impl):
        """Time to first token: the prompt's forward pass into an empty cache."""
        m, rows = self.model, []
        for n in (16, m.config.context - 1):
            prompt = np.frombuffer(self.text[:n], dtype=np.uint8)
            seconds = time_it(lambda: m.prefill(prompt, m.new_cache(1), impl=impl), repeats=self.repeats)
            rows.append(self.rec("prefill vs decode", impl=impl, phase="prefill", shape=self.shape(1, n, n),
                                 seconds=seconds, layer="time to first token", kv_cache="contiguous",
                                 prompt_tokens=n))
        return rows

    def decode_rows(self, impl):
        """Time per output token after a prompt of ``context // 2``: each cache kind, and none."""
        m, rows = self.model, []
        n = m.config.context // 2
        prompt = np.frombuffer(self.text[:n], dtype=np.uint8)
        for kv_cache in ("contiguous", "paged", None):
            if kv_cache is None:
                tokens = np.frombuffer(self.text[:n + 1], dtype=np.uint8).astype(np.int64)[None]
                step = lambda: m.forward(tokens, impl=impl)
                shape = self.shape(1, n + 1, n + 1)
            else:
                cache = m.new_cache(1, paged=kv_cache == "paged")
                m.prefill(prompt, cache, impl=impl)
                step = _rewinding_step(m, cache, impl, prompt[-1])
                shape = self.shape(1, 1, n + 1)
            seconds = time_it(step, repeats=self.repeats)
            rows.append(self.rec("prefill vs decode", impl=impl, phase="decode", shape=shape, seconds=seconds,
                                 layer="time per output token", kv_cache=kv_cache or "none (rerun)",
                                 cached_tokens=n))
        return rows

    def layer_rows(self, impl):
        """One decode step's attention, measured three ways: which layer each number is."""
        m = self.model
        n = m.config.context // 2
        B, H, Hk, _, Nk, D = self.shape(1, 1, n + 1)
        rng = np.random.default_rng(13)
        q = rng.standard_normal((B, H, 1, D)).astype(np.float32)
        k, v = (rng.standard_normal((B, Hk, Nk, D)).astype(np.float32) for _ in range(2))
        forward = kernels.load(impl)
        opts = attention_options(batch=B, heads=H, head_dim=D, causal=True)
        mask = opts.mask(1, Nk)
        cache = m.new_cache(1)
        m.prefill(np.frombuffer(self.text[:n], dtype=np.uint8), cache, impl=impl)
        times = time_interleaved({
            "kernel": lambda: forward(q, k, v, opts, mask),
            "Python call": lambda: attention(q, k, v, impl=impl, causal=True),
            "whole token": _rewinding_step(m, cache, impl, 10),
        }, repeats=self.repeats)
        layers = m.config.n_layers
        rows = []
        for layer, seconds in times.items():
            per = "one attention call" if layer != "whole token" else f"all {layers} layers, MLPs, logits"
            rows.append(self.rec("decode layers", impl=impl, phase="decode", shape=self.shape(1, 1, Nk),
                                 seconds=seconds, layer=layer, kv_cache="contiguous", measures=per,
                                 attention_share=(times["Python call"] * layers / times["whole token"]
                                                  if layer == "whole token" else None)))
        return rows

    # -- 4. split-KV decode ---------------------------------------------------------

    def split_rows(self):
        rows = []
        rng = np.random.default_rng(14)
        H, Hk, D = self.heads
        lengths = (256, 8192) if self.quick else (256, 4096, 32768)
        impls = [i for i in ("flash_numpy", "flash_numba_cpu") if i in self.impls]
        for impl in impls:
            for nk in lengths:
                q = rng.standard_normal((1, H, 1, D)).astype(np.float32)
                k, v = (rng.standard_normal((1, Hk, nk, D)).astype(np.float32) for _ in range(2))
                whole = split_kv_decode(q, k, v, splits=1, impl=impl, workers=1)
                calls = {s: (lambda s=s: split_kv_decode(q, k, v, splits=s, impl=impl, workers=s))
                         for s in (1, 2, 4)}
                times = time_interleaved(calls, repeats=self.repeats)
                for s, seconds in times.items():
                    out = split_kv_decode(q, k, v, splits=s, impl=impl, workers=s)
                    rows.append(self.rec("split-KV decode", impl=impl, phase="decode", shape=self.shape(1, 1, nk),
                                         seconds=seconds, layer="kernel + split and merge", splits=s,
                                         speedup_vs_one_split=times[1] / seconds,
                                         max_abs_diff_vs_one_split=float(np.abs(out - whole).max())))
        return rows

    # -- 5. custom masks -------------------------------------------------------------

    def mask_rows(self, impl):
        m, rows = self.model, []
        n = 128 if self.quick else m.config.context
        tokens = np.frombuffer(self.text[:n + 1], dtype=np.uint8).astype(np.int64)[None]
        for mask in (custom_masks.DocumentMask((n // 4, n // 4, n // 2)), custom_masks.PrefixLMMask(n // 2)):
            tiles = custom_masks.tile_counts(mask, n, 32, 32)
            for path in ("fast", "dense"):
                attend = custom_masks.masked_attend(mask, path, impl)
                seconds = time_it(lambda: m.forward(tokens[:, :-1], impl=attend), repeats=self.repeats)
                logits = m.forward(tokens[:, :-1], impl=attend).astype(np.float64)
                z = logits[0] - logits[0].max(-1, keepdims=True)
                nll = np.log(np.exp(z).sum(-1)) - z[np.arange(n), tokens[0, 1:]]
                name = type(mask).__name__
                rows.append(self.rec("custom masks", impl=impl if path == "fast" else "dense numpy (slow path)",
                                     phase="prefill", shape=self.shape(1, n, n), seconds=seconds,
                                     layer="whole forward pass", mask=f"{name} {_mask_args(mask)}", path=path,
                                     perplexity=float(np.exp(nll.mean())), tiles_computed=tiles[path], tile=(32, 32),
                                     tiles_with_a_visible_pair=tiles["with_a_visible_pair"],
                                     tiles_in_all=tiles["dense"]))
        rows += self.mask_kernel_rows(impl)
        return rows

    def mask_kernel_rows(self, impl):
        """The same masks at a longer length, attention alone: where skipping starts to pay."""
        rows = []
        H, Hk, D = self.heads
        n = 1024 if self.quick else 2048
        rng = np.random.default_rng(15)
        q = rng.standard_normal((1, H, n, D)).astype(np.float32)
        k, v = (rng.standard_normal((1, Hk, n, D)).astype(np.float32) for _ in range(2))
        for mask in (custom_masks.DocumentMask((n // 4, n // 4, n // 2)), custom_masks.PrefixLMMask(n // 2)):
            tiles = custom_masks.tile_counts(mask, n)
            # each path's function is built here, once: the rounds time the call, not the set-up
            calls = {path: (lambda f=custom_masks.masked_attend(mask, path, impl): f(q, k, v))  # noqa: B008
                     for path in ("fast", "dense")}
            times = time_interleaved(calls, repeats=self.repeats)
            diff = float(np.abs(calls["fast"]() - calls["dense"]()).max())
            for path, seconds in times.items():
                rows.append(self.rec("custom masks", impl=impl if path == "fast" else "dense numpy (slow path)",
                                     phase="prefill", shape=self.shape(1, n, n), seconds=seconds,
                                     layer="one attention call", mask=f"{type(mask).__name__} {_mask_args(mask)}",
                                     path=path, tiles_computed=tiles[path], tile=(64, 64),
                                     tiles_with_a_visible_pair=tiles["with_a_visible_pair"],
                                     tiles_in_all=tiles["dense"], max_abs_diff_fast_vs_dense=diff,
                                     speedup_vs_dense=times["dense"] / seconds))
        return rows

    # -- the run --------------------------------------------------------------------

    def tasks(self, only=GROUPS):
        """Every measurement of the ``only`` groups as (label, zero-argument function returning records)."""
        tasks = [(f"quality {impl} {p} {phase} {kv or ''}", (lambda a=(impl, p, phase, kv): [self.quality_row(*a)]))
                 for impl, p, phase, kv in self.quality_plan()]
        for impl in self.timing_impls():
            tasks.append((f"prefill {impl}", lambda impl=impl: self.prefill_rows(impl)))
            tasks.append((f"decode {impl}", lambda impl=impl: self.decode_rows(impl)))
            tasks.append((f"layers {impl}", lambda impl=impl: self.layer_rows(impl)))
        tasks.append(("split-KV decode", self.split_rows))
        mask_impl = "flash_numba_cpu" if "flash_numba_cpu" in self.impls else self.timing_impls()[0]
        tasks.append((f"masks {mask_impl}", lambda: self.mask_rows(mask_impl)))
        return [(label, task) for label, task in tasks if label.split()[0].removesuffix("-KV") in only]


def choices_by_layer(choices, n_layers) -> dict:
    """What "auto" ran, per layer: the model calls attention once per layer per forward, in
    order, so call i is layer i % n_layers.  {chosen: {layer: {precision: calls}}, reasons: the
    first call's reason for each precision, by_call: the precision of every call in order}."""
    chosen = {str(layer): {} for layer in range(n_layers)}
    reasons = {}
    for i, choice in enumerate(choices):
        per = chosen[str(i % n_layers)]
        per[choice.precision] = per.get(choice.precision, 0) + 1
        reasons.setdefault(choice.precision, choice.reason)
    return {"chosen": chosen, "reasons": reasons, "calls": len(choices),
            "by_call": [choice.precision for choice in choices]}


def _rewinding_step(model, cache, impl, token):
    """A decode step that leaves the cache as it found it, so it can be timed again and again."""
    def step():
        model.decode_step(token, cache, impl=impl)
        if hasattr(cache, "length"):
            cache.length -= 1
        else:
            cache.lengths -= 1
    return step


def _mask_args(mask):
    return f"lengths {list(mask.lengths)}" if hasattr(mask, "lengths") else f"prefix {mask.prefix}"


SHAPE_COLUMNS = {"B": "batch", "H": "heads", "Hk": "heads_k", "Nq": "seqlen_q", "Nk": "seqlen_k", "D": "head_dim"}
NUMBER_COLUMNS = {*SHAPE_COLUMNS, "N", "ppl", "seconds", "vs reference", "byte-unigram", "splits", "x one split", "tiles"}


def _columns(r) -> dict:
    """One record's cells, by column name, as strings."""
    s = r["shape"]
    cells = {"impl": r["impl"], "dtype": r["dtype"], "phase": r["phase"], "kv cache": str(r["kv_cache"] or "-"),
             **{name: str(s[key]) for name, key in SHAPE_COLUMNS.items()},
             "mask": r["mask"], "ppl": "" if r["perplexity"] is None else f"{r['perplexity']:.4f}",
             "seconds": "" if r["seconds"] is None else f"{r['seconds']:.2e}", "layer": r["layer"] or ""}
    if "relative_change" in r:
        cells["vs reference"] = f"{r['relative_change']:+.2e}"
        cells["byte-unigram"] = f"{r['unigram_perplexity']:.2f}"
    if "splits" in r:
        cells["splits"] = str(r["splits"])
        cells["x one split"] = f"{r['speedup_vs_one_split']:.2f}"
    if "tiles_computed" in r:
        cells["tiles"] = f"{r['tiles_computed']}/{r['tiles_in_all']}"
    return cells


def _chosen(r) -> str:
    totals = {}
    for per in r["chosen"].values():
        for p, n in per.items():
            totals[p] = totals.get(p, 0) + n
    return f"budget {r['budget']:g}: " + ", ".join(f"{p} {n}" for p, n in sorted(totals.items()))


def format_tables(records) -> str:
    """The records as one plain-text table per ``table``: a line names what every row shares (shape,
    precision, mask, ...), the columns show what differs, and ``auto``'s choices follow its row.  The
    lines fit a notebook's 110 characters (ppl: the perplexity; a mask's description is cut at 36)."""
    lines = []
    for table in dict.fromkeys(r["table"] for r in records):
        rows = [r for r in records if r["table"] == table]
        cells = [_columns(r) for r in rows]
        if all(c["Nq"] == c["Nk"] for c in cells):         # prefill alone: one length
            cells = [{**{k: v for k, v in c.items() if k not in ("Nq", "Nk")}, "N": c["Nq"]} for c in cells]
        names = list(dict.fromkeys(name for c in cells for name in c))
        shared = [n for n in names if len({c.get(n, "") for c in cells}) == 1 and len(cells) > 1]
        shown = [n for n in names if n not in shared]
        for c in cells:
            c["mask"] = c["mask"][:36]
        width = {n: max(len(n), *(len(c.get(n, "")) for c in cells)) for n in shown}
        lines.append(f"\n== {table} ==")
        if shared:
            lines.append(wrapped("every row: " + "; ".join(f"{n} {cells[0][n]}" for n in shared if cells[0][n])))
        fmt = lambda n, v: f"{v:>{width[n]}}" if n in NUMBER_COLUMNS else f"{v:<{width[n]}}"
        lines.append(" ".join(fmt(n, n) for n in shown).rstrip())
        for r, c in zip(rows, cells):
            lines.append(" ".join(fmt(n, c.get(n, "")) for n in shown).rstrip())
            if "chosen" in r:
                lines.append(f"    {r['impl']} {r['dtype']} {r['phase']} chose, {_chosen(r)}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m course_lib.tools.evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short texts and few repeats (a few minutes)")
    parser.add_argument("--impls", nargs="+", help=f"impls to judge (default: {', '.join(available_impls())})")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per number (default 3 quick, 7 full)")
    parser.add_argument("--only", nargs="+", choices=GROUPS, default=list(GROUPS),
                        help="measure only these groups (default: all), e.g. --only quality")
    parser.add_argument("--out", default=None, help=f"append JSON-line records here (e.g. {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    from tqdm.auto import tqdm
    ev = Evaluation(quick=args.quick, impls=args.impls, repeats=args.repeats)
    records = []
    tasks = ev.tasks(args.only)
    with tqdm(tasks, desc="evaluate", unit="task", file=sys.stderr) as bar:
        for label, task in bar:
            bar.set_postfix_str(label[:40])
            records.extend(task())
    if args.out:
        write_records(args.out, records)
    print(format_tables(records))
    return records


if __name__ == "__main__":
    main()
