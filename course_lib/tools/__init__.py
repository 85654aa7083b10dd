"""Chapter 13's command-line tools: training its model and judging the kernels inside it.

    python -m course_lib.tools.train      # the byte-level model, with PyTorch on the CPU (the weights are committed)
    python -m course_lib.tools.evaluate   # quality, prefill vs decode, the layers of a token, split-KV, custom masks

They measure, as ``course_lib.bench`` does, and write their records through it;
a learner reads their tables in chapter 13 and never needs to open them.
"""
