"""The rules and facts every kernel shares, at the bottom of the library (nothing here imports above it).

- ``rules``: the scalar rules (mask of one pair, ALiBi, softcap, online-softmax step, finalize,
  dtype rules), written once so numpy, ``numba.njit`` and ``numba.cuda`` all compile them;
- ``masks``: the mask of a problem (``MaskSpec``) and tile classification (empty, partial, full);
- ``reference``: the float64 ground truth every impl and exercise is checked against;
- ``online_softmax``: the running max / sum update and the logsumexp merge, on arrays;
- ``varlen``: packing and unpacking variable-length batches (``cu_seqlens``);
- ``conventions``: other libraries' conventions (PyTorch's ``is_causal``) in the course's terms;
- ``hardware``: the machine presets (peaks, bandwidth, SRAM, per-SM limits), each figure with its source,
  and ``occupancy``, the blocks one SM holds;
- ``flops``: the one FLOP convention (the pairs a mask lets through);
- ``machine``: what this machine is (CPU, cores, GPU or simulator), read when asked;
- ``options``: validation of a call's inputs and options, shared by every impl;
- ``reference_backward``: the float64 gradient (P materialised) and the tile functions of the backward;
- ``backward_options``: validation of a backward call (out, lse, dout and the lse's cheap consistency checks).
"""
