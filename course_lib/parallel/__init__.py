"""Attention across several devices (chapter 14): the sequence sharded over ranks of torch.distributed.

    sharding         which positions each rank holds (contiguous, zigzag, striped) and the causal
                     work that gives each rank at each ring step
    shard_attention  one rank's partial (out, lse) on one K/V shard, the local causal offset, the
                     merge (chapter 04's merge_lse); a ring simulated in one process
    ring             ring attention: K/V shards travel, isend / irecv overlapped with compute
    ulysses          all-to-all over heads (DeepSpeed-Ulysses)
    costmodel        alpha-beta: bytes and messages of both, the ping-pong that measures alpha, beta
    launch           N spawned ranks, gloo or NCCL, and a run that fails instead of hanging
    run              one run (or several on one group of ranks), and its check against the reference

``python -m course_lib.parallel --world-size N --strategy ring|ulysses [--causal] [--check]``.
"""
