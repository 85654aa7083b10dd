"""Benchmarks' tools: timing, regression records, the peers, the environment and the CLI.

A benchmark is a script, never a test.  It times a call with ``time_it`` and
appends one JSON line per measurement with ``append_record``; the chapters read
the records back with ``load_records`` and plot them.

    from course_lib import bench
    t = bench.time_it(course_lib.attention, q, k, v, impl="flash_numpy", causal=True)
    bench.append_record("notebooks/records/mine.jsonl", benchmark="mine", impl="flash_numpy",
                        shape=(B, H, Nq, Nk, D), dtype="float32", causal=True, time_s=t)

A speed-up is only quoted as a ratio of two records of the same ``run``: two
timings taken minutes apart on a shared machine are not comparable.

- ``timing``: ``time_it``, ``time_interleaved``, ``interleaved_rounds``, ``cuda_time_it``, ``spread``
  (min / median / max of rounds), ``verdict`` (a check's one line) and ``log``;
- ``records``: ``record``, ``append_record``, ``RecordFile`` and ``write_records`` (the one writer of
  every record file), ``load_records``, ``latest_run``, ``new_run``, ``environment`` and
  ``gpu_environment``, ``attention_bytes``, and the layers a time can measure;
- ``cases``: the awkward attention cases every CUDA kernel is checked on, in the simulator and on a GPU;
- ``ncu``: the command that runs a benchmark's child under Nsight Compute, and the rows it prints;
- ``peers``: PyTorch's naive attention and SDPA backends, the peers of every comparison;
- ``envreport``: the versions and devices of this machine, printed;
- ``simd``: a compiled loop's FMAs counted by register width, lanes and operand (chapter 08);
- ``cli``: ``python -m course_lib.bench``, the shape buckets and their report;
- ``matrix``: ``--matrix``, the regression matrix over three paths and its comparison with the records.
"""
from .peers import torch_naive
from .records import (
                      LAYERS,
                      RecordFile,
                      append_record,
                      attention_bytes,
                      environment,
                      gpu_environment,
                      latest_run,
                      load_records,
                      new_run,
                      record,
                      write_records,
)
from .timing import cuda_time_it, interleaved_rounds, log, spread, time_interleaved, time_it, verdict

__all__ = ["LAYERS", "RecordFile", "append_record", "attention_bytes", "cuda_time_it", "environment",
           "gpu_environment", "interleaved_rounds", "latest_run", "load_records", "log", "new_run", "record",
           "spread", "time_interleaved", "time_it", "torch_naive", "verdict", "write_records"]
