"""A small decoder-only transformer in numpy whose attention is any impl of the course.

The network is nanoGPT's shape with two modern parts: rotary positions (a query
and a key are rotated by their positions, so their dot product sees only the
distance) and grouped-query attention (``n_heads`` query heads share
``n_kv_heads`` K / V heads, which the course's kernels take as they are).

    x = tok_emb[tokens]
    per layer:  x += Wo attention(rope(Wq n1(x)), rope(Wk n1(x)), Wv n1(x), causal)
                x += W2 gelu(W1 n2(x))
    logits = n_f(x) tok_emb^T                    # tied input and output embedding

Everything but attention runs in float32; attention gets q, k and v in the
``dtype`` asked for (the KV cache stores that dtype) and any impl of
``course_lib.available_impls()``, or a function with ``course_lib.attention``'s
signature, so that a kernel's mistake shows up as a change in the model's
quality, which is the brief's point.  ``forward`` takes a KV cache
(``kv_cache.KVCache`` or ``kv_cache.PagedKVCache``): the prompt is one forward
call over all its tokens (prefill), every new token one call over one token
(decode) whose query meets all the cached keys; FlashAttention's bottom-right
causal alignment is exactly what makes one call serve both.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from ..api import attention
from . import kv_cache as kvc

DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "byte_lm.npz"
LAYER_WEIGHTS = ("norm1", "wq", "wk", "wv", "wo", "norm2", "w1", "w2")


@dataclasses.dataclass(frozen=True)
class Config:
    """The shape of the network: bytes in, next-byte logits out."""
    vocab: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2  # grouped-query attention: 2 query heads share one K/V head
    head_dim: int = 32
    d_ff: int = 512
    context: int = 256
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def rotary_tables(self, length, start=0):
        """cos and sin (length, head_dim // 2), float32, of positions start .. start + length - 1."""
        return self.rotary_at(np.arange(start, start + length))

    def rotary_at(self, positions):
        """cos and sin (*positions.shape, head_dim // 2), float32, of the given positions."""
        half = self.head_dim // 2
        freq = self.rope_theta ** (-np.arange(half, dtype=np.float64) / half)
        angle = np.asarray(positions, dtype=np.float64)[..., None] * freq
        return np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)


def rms_norm(x, weight, eps):
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * weight


def gelu(x):  # the tanh form, as torch's approximate="tanh"
    return 0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x * x * x)))


def rotate(x, cos, sin):
    """Rotary positions: x (B, H, T, D), cos / sin (B, 1, T, D/2); the two halves of D rotate as pairs."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def as_tokens(text) -> np.ndarray:
    """Bytes (or a str, UTF-8 encoded, or a sequence of ints) as a token array, int64."""
    if isinstance(text, str):
        text = text.encode("utf-8")
    if isinstance(text, (bytes, bytearray)):
        return np.frombuffer(bytes(text), dtype=np.uint8).astype(np.int64)
    tokens = np.asarray(text)
    if tokens.dtype.kind not in "iu":
        raise TypeError(f"tokens must be bytes, a str or integers, got dtype {tokens.dtype}")
    return tokens.astype(np.int64)


class Transformer:
    """The trained network, its weights in a dict of float32 arrays."""

    def __init__(self, config: Config, weights: dict):
        self.config = config
        missing = [name for name in self.weight_names() if name not in weights]
        if missing:
            raise ValueError(f"weights lack {missing[:4]}{' ...' if len(missing) > 4 else ''}")
        self.weights = {name: np.asarray(weights[name], dtype=np.float32) for name in self.weight_names()}

    def weight_names(self) -> list:
        names = ["tok_emb", "norm_f"]
        return names + [f"layers.{i}.{w}" for i in range(self.config.n_layers) for w in LAYER_WEIGHTS]

    @classmethod
    def load(cls, path=DEFAULT_WEIGHTS) -> "Transformer":
        """The committed weights (``python -m course_lib.tools.train`` wrote them)."""
        with np.load(path) as data:
            config = Config(**json.loads(str(data["config"])))
            return cls(config, {name: data[name] for name in data.files if name != "config"})

    @classmethod
    def random(cls, config: Config, seed=0) -> "Transformer":
        """Untrained weights of the right shapes (for counting what a step reads, not for text)."""
        rng = np.random.default_rng(seed)
        c, HD, KD = config, config.n_heads * config.head_dim, config.n_kv_heads * config.head_dim
        shapes = {"tok_emb": (c.vocab, c.d_model), "norm_f": (c.d_model,)}
        for i in range(c.n_layers):
            shapes.update({f"layers.{i}.{name}": shape for name, shape in (
                ("norm1", (c.d_model,)), ("wq", (c.d_model, HD)), ("wk", (c.d_model, KD)), ("wv", (c.d_model, KD)),
                ("wo", (HD, c.d_model)), ("norm2", (c.d_model,)), ("w1", (c.d_model, c.d_ff)),
                ("w2", (c.d_ff, c.d_model)))})
        return cls(config, {name: (np.ones(shape) if len(shape) == 1 else
                                   rng.standard_normal(shape) / np.sqrt(shape[0])) for name, shape in shapes.items()})

    def parameters(self) -> int:
        return int(sum(w.size for w in self.weights.values()))

    # -- the forward pass ---------------------------------------------------------

    def new_cache(self, batch=1, *, dtype=np.float32, paged=False, block_size=16, num_blocks=None):
        """An empty KV cache for ``batch`` sequences, contiguous or paged."""
        c = self.config
        if paged:
            return kvc.PagedKVCache(c.n_layers, c.n_kv_heads, c.head_dim, batch=batch, block_size=block_size,
                                    num_blocks=num_blocks, max_len=c.context, dtype=dtype)
        return kvc.KVCache(c.n_layers, batch, c.n_kv_heads, c.context, c.head_dim, dtype=dtype)

    def forward(self, tokens, *, impl="reference", dtype=np.float32, cache=None):
        """Logits (B, T, vocab), float32, of tokens (B, T) that follow what ``cache`` holds.

        Without a cache the tokens are whole sequences (positions 0 .. T-1);
        with one they continue it and their K / V are appended to it.
        """
        c, W = self.config, self.weights
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or tokens.dtype.kind not in "iu":
            raise ValueError(f"tokens must be integers of shape (batch, T), got {tokens.dtype} {tokens.shape}")
        B, T = tokens.shape
        if T == 0:
            raise ValueError("no tokens: a forward pass needs at least one")
        if tokens.min() < 0 or tokens.max() >= c.vocab:
            raise ValueError(f"tokens must lie in [0, {c.vocab}), got {tokens.min()} .. {tokens.max()}")
        dtype = np.dtype(dtype)
        if cache is None:
            positions = np.broadcast_to(np.arange(T), (B, T))
        else:
            kvc.check_cache(cache, n_layers=c.n_layers, batch=B, n_kv_heads=c.n_kv_heads,
                            head_dim=c.head_dim, dtype=dtype)
            positions = cache.positions(T)
        if positions.max() >= c.context:
            raise ValueError(f"position {positions.max()} is past the model's context of {c.context} tokens")
        cos, sin = (t[:, None] for t in c.rotary_at(positions))  # (B, 1, T, D/2)
        attend = self._attention_fn(impl)
        x = W["tok_emb"][tokens]  # (B, T, d)
        for i in range(c.n_layers):
            p = f"layers.{i}."
            h = rms_norm(x, W[p + "norm1"], c.norm_eps)
            q = (h @ W[p + "wq"]).reshape(B, T, c.n_heads, c.head_dim).transpose(0, 2, 1, 3)
            k = (h @ W[p + "wk"]).reshape(B, T, c.n_kv_heads, c.head_dim).transpose(0, 2, 1, 3)
            v = (h @ W[p + "wv"]).reshape(B, T, c.n_kv_heads, c.head_dim).transpose(0, 2, 1, 3)
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
            q, k, v = (a.astype(dtype) for a in (q, k, v))
            if cache is None:
                a = attend(q, k, v)
            else:
                a = cache.append_and_attend(i, q, k, v, attend)  # (B, H, T, D)
            a = a.astype(np.float32).transpose(0, 2, 1, 3).reshape(B, T, c.n_heads * c.head_dim)
            x = x + a @ W[p + "wo"]
            x = x + gelu(rms_norm(x, W[p + "norm2"], c.norm_eps) @ W[p + "w1"]) @ W[p + "w2"]
        if cache is not None:
            cache.advance(T)
        return rms_norm(x, W["norm_f"], c.norm_eps) @ W["tok_emb"].T

    @staticmethod
    def _attention_fn(impl):
        """attend(q, k, v) -> out: causal, bottom-right aligned (decode's one query sees every key)."""
        if callable(impl):
            return lambda q, k, v: impl(q, k, v, causal=True)
        return lambda q, k, v: attention(q, k, v, impl=impl, causal=True)

    # -- quality ------------------------------------------------------------------

    def nll(self, windows, *, impl="reference", dtype=np.float32) -> np.ndarray:
        """Negative log-likelihood (nats) of each next byte: windows (B, T+1) -> (B, T), float64."""
        windows = np.asarray(windows)
        logits = self.forward(windows[:, :-1], impl=impl, dtype=dtype).astype(np.float64)
        shift = logits.max(axis=-1, keepdims=True)
        logz = shift[..., 0] + np.log(np.exp(logits - shift).sum(axis=-1))
        return logz - np.take_along_axis(logits, windows[:, 1:, None], axis=-1)[..., 0]

    def perplexity(self, text, *, impl="reference", dtype=np.float32, length=None, batch=8) -> float:
        """exp(mean next-byte NLL) over ``text`` cut into windows of ``length + 1`` bytes."""
        tokens = as_tokens(text)
        length = self.config.context if length is None else int(length)
        if not 1 <= length <= self.config.context:
            raise ValueError(f"length must be in [1, {self.config.context}] (the context), got {length}")
        n = (len(tokens) - 1) // length
        if n == 0:
            raise ValueError(f"text of {len(tokens)} bytes is too short for one window of {length + 1}")
        windows = np.stack([tokens[i * length:i * length + length + 1] for i in range(n)])
        total = sum(self.nll(windows[s:s + batch], impl=impl, dtype=dtype).sum() for s in range(0, n, batch))
        return float(np.exp(total / (n * length)))

    def decode_perplexity(self, text, *, impl="reference", dtype=np.float32, kv_cache="contiguous",
                          prefill=1, block_size=16) -> float:
        """The same score, the decode way: prefill ``prefill`` bytes, then feed the text one byte at a
        time through the KV cache (teacher forcing), scoring each next byte.

        Equal to ``perplexity`` over one window when the cache and the decode
        path are right: the check that decode computes what prefill computes.
        """
        tokens = self.check_prompt(text)
        if not 1 <= prefill < len(tokens):
            raise ValueError(f"prefill must be in [1, {len(tokens) - 1}], got {prefill}")
        cache = self.new_cache(1, dtype=dtype, paged=kv_cache == "paged", block_size=block_size)
        logits = [self.forward(tokens[None, :prefill], impl=impl, dtype=dtype, cache=cache)[0]]
        for t in range(prefill, len(tokens) - 1):
            logits.append(self.decode_step(tokens[t], cache, impl=impl, dtype=dtype))
        z = np.concatenate(logits).astype(np.float64)  # (len - 1, vocab): predictions of tokens 1 ..
        shift = z.max(axis=-1, keepdims=True)
        nll = shift[:, 0] + np.log(np.exp(z - shift).sum(axis=-1)) - z[np.arange(len(z)), tokens[1:]]
        return float(np.exp(nll.mean()))

    # -- generation ---------------------------------------------------------------

    def check_prompt(self, prompt, max_new_tokens=0) -> np.ndarray:
        tokens = as_tokens(prompt)
        if tokens.ndim != 1:
            raise ValueError(f"a prompt is one sequence of tokens, got shape {tokens.shape}")
        if len(tokens) == 0:
            raise ValueError("the prompt is empty: give at least one byte to continue")
        if len(tokens) + max_new_tokens > self.config.context:
            raise ValueError(f"prompt of {len(tokens)} tokens plus {max_new_tokens} new ones is longer than "
                             f"the model's context of {self.config.context}; shorten the prompt")
        return tokens

    def prefill(self, prompt, cache, *, impl="reference", dtype=np.float32) -> np.ndarray:
        """Run the prompt (1-D tokens) through the model into ``cache``; the last position's logits."""
        tokens = self.check_prompt(prompt)
        return self.forward(tokens[None], impl=impl, dtype=dtype, cache=cache)[0, -1]

    def decode_step(self, token, cache, *, impl="reference", dtype=np.float32) -> np.ndarray:
        """One new token (B,) through the model against the cache: next logits (B, vocab)."""
        token = np.asarray(token).reshape(-1, 1)
        return self.forward(token, impl=impl, dtype=dtype, cache=cache)[:, -1]

    def generate(self, prompt, max_new_tokens=32, *, impl="reference", dtype=np.float32,
                 kv_cache="contiguous", temperature=0.0, seed=0, block_size=16) -> bytes:
        """Continue ``prompt``: prefill once, then decode one token at a time with a KV cache.

        ``kv_cache``: "contiguous", "paged" (blocks and a block table) or None
        (no cache: every step reruns the whole sequence, the cost a cache saves).
        ``temperature`` 0 is greedy; above 0 samples with ``seed``.
        """
        tokens = self.check_prompt(prompt, max_new_tokens)
        rng = np.random.default_rng(seed)
        out = list(tokens)
        if kv_cache is None:
            for _ in range(max_new_tokens):
                logits = self.forward(np.array([out]), impl=impl, dtype=dtype)[0, -1]
                out.append(pick(logits, temperature, rng))
            return bytes(np.array(out[len(tokens):], dtype=np.uint8))
        if kv_cache not in ("contiguous", "paged"):
            raise ValueError(f"kv_cache must be 'contiguous', 'paged' or None, got {kv_cache!r}")
        cache = self.new_cache(1, dtype=dtype, paged=kv_cache == "paged", block_size=block_size)
        logits = self.prefill(tokens, cache, impl=impl, dtype=dtype)
        for step in range(max_new_tokens):
            out.append(pick(logits, temperature, rng))
            if step + 1 < max_new_tokens:
                logits = self.decode_step(out[-1], cache, impl=impl, dtype=dtype)[0]
        return bytes(np.array(out[len(tokens):], dtype=np.uint8))


def pick(logits, temperature, rng) -> int:
    """The next token: the most likely one (temperature 0) or a sample."""
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(len(p), p=p / p.sum()))
