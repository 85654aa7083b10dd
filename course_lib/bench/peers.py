"""The peers the course's kernels are measured against: PyTorch's naive attention and its SDPA backends.

Each peer is a zero-argument callable on torch tensors (either device), made
by ``torch_calls``; the kernels never import torch, only the benchmarks do.
"""
from __future__ import annotations

TORCH_PEERS = ("torch_naive", "torch_sdpa_efficient", "torch_sdpa_math", "torch_sdpa_flash", "torch_sdpa_cudnn")
PEER_DTYPES = {"torch_sdpa_flash": ("float16",), "torch_sdpa_cudnn": ("float16",)}  # what a peer takes
# What does a peer's products on a GPU, (for float32 inputs, for halves), TF32 off as the benchmarks set it: a
# ratio to a course kernel means something only beside the units both ran on.  SDPA's efficient kernel takes
# float32 on the tensor cores all the same, in 3xTF32; its math backend upcasts halves to float32 first.
PEER_RUNS_ON = {
    "torch_naive": ("cuBLAS SIMT (TF32 off) + softmax, S in HBM", "cuBLAS fp16/bf16 tensor cores + softmax, S in HBM"),
    "torch_sdpa_efficient": ("CUTLASS, 3xTF32 tensor cores", "CUTLASS, fp16/bf16 tensor cores"),
    "torch_sdpa_math": ("cuBLAS SIMT (TF32 off) + softmax, S in HBM",
                        "upcast to fp32: cuBLAS SIMT (TF32 off) + softmax, S in HBM"),
    "torch_sdpa_flash": ("FlashAttention-2, fp16/bf16 tensor cores",) * 2,
    "torch_sdpa_cudnn": ("cuDNN, fp16/bf16 tensor cores",) * 2,
}


def peer_runs_on(peer, dtype) -> str:
    """What ``peer`` runs on, on a GPU, for inputs of ``dtype`` (``PEER_RUNS_ON``)."""
    single, halves = PEER_RUNS_ON[peer]
    return single if str(dtype) == "float32" else halves


def torch_or_none():
    """torch, or None where it is not installed."""
    try:
        import torch
        return torch
    except ModuleNotFoundError:
        return None


def gpu_here() -> bool:
    """True when torch sees a CUDA GPU."""
    torch = torch_or_none()
    return bool(torch is not None and torch.cuda.is_available())


def torch_naive(q, k, v, causal):
    """The ``torch_naive`` peer: S = QK^T scaled, causal aligned bottom right, softmax, then P @ V."""
    import torch
    with torch.no_grad():
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            n, m = s.shape[-2:]
            s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=s.device).triu(1 + m - n), -torch.inf)
        return torch.softmax(s, -1) @ v


def torch_calls(q, k, v, causal):
    """{peer: zero-argument callable} on torch tensors (either device)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def naive():
        return torch_naive(q, k, v, causal)

    def sdpa(backend):
        def go():
            with sdpa_kernel(backend), torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal and q.shape[2] > 1)
        return go
    return {"torch_naive": naive, "torch_sdpa_efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
            "torch_sdpa_math": sdpa(SDPBackend.MATH), "torch_sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
            "torch_sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION)}
