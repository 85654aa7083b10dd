"""An independent float64 attention, written from the semantics in the design
notes and nothing in course_lib: one query row at a time, plain loops over
keys.  Slow on purpose, so keep shapes small."""
import math

import numpy as np


def oracle_attention(q, k, v, *, causal=False, causal_align="bottom_right", window_size=(-1, -1),
                     softcap=0.0, alibi_slopes=None, softmax_scale=None):
    q, k, v = (np.asarray(x).astype(np.float64) for x in (q, k, v))
    batch, heads, nq, d = q.shape
    heads_k, nk = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    offset = nk - nq if causal_align == "bottom_right" else 0
    left, right = window_size
    if causal:
        right = 0
    out = np.zeros((batch, heads, nq, v.shape[3]))
    lse = np.full((batch, heads, nq), -np.inf)
    for b in range(batch):
        for h in range(heads):
            hk = h * heads_k // heads  # query heads are grouped in order onto K/V heads
            slope = 0.0
            if alibi_slopes is not None:
                slope = alibi_slopes[h] if alibi_slopes.ndim == 1 else alibi_slopes[b, h]
            for i in range(nq):
                keys, scores = [], []
                for j in range(nk):
                    if left >= 0 and j < i + offset - left:
                        continue
                    if right >= 0 and j > i + offset + right:
                        continue
                    s = scale * float(np.dot(q[b, h, i], k[b, hk, j]))
                    if softcap > 0:
                        s = softcap * math.tanh(s / softcap)
                    s -= slope * abs(i + offset - j)
                    keys.append(j)
                    scores.append(s)
                if not keys:
                    continue
                top = max(scores)
                weights = [math.exp(s - top) for s in scores]
                total = sum(weights)
                lse[b, h, i] = top + math.log(total)
                for j, w in zip(keys, weights):
                    out[b, h, i] += (w / total) * v[b, hk, j]
    return out, lse
