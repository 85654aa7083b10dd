"""Chapter 11: low precision and FlashAttention-3's ideas, measured without a GPU.

- ``formats``: float16, bfloat16, float8 e4m3 / e5m2: range, spacing; scales
  per tensor, per (batch, head), per block; incoherent processing (Hadamard);
- ``study``: the error study's tiled forward with each rounding as a switch,
  the KL divergence of attention rows;
- ``precision``: ``attention_at(precision, q, k, v, ...)`` and
  ``precision_attention(precision)``, the hook a model uses to change its
  attention's precision;
- ``fallback``: ``choose_precision(q, k, v, budget)`` -> fp8 / fp16 / fp32 and why;
- ``conversion``: conversion in the hot loop, per tile, or once before it;
- ``overlap``: FA3's producer / consumer overlap (serial, intra-warpgroup,
  ping-pong) as a checkable schedule model;
- ``figures``: the chapter's figures.
"""
from .fallback import Choice, choose_precision
from .formats import FORMATS, amax, dequantize, descale_for, incoherent, quantize
from .precision import PRECISIONS, AutoAttention, attention_at, precision_attention

__all__ = ["AutoAttention", "Choice", "choose_precision", "FORMATS", "amax", "dequantize", "descale_for", "incoherent",
           "quantize", "PRECISIONS", "attention_at", "precision_attention"]
