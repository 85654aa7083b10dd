"""Chapter 12's side of the library: what the backward pass moves, what recomputing costs, and a training run.

- ``traffic``: the backward run on the counted memory (FA2's and FA1's orders, and a naive backward
  that reads a stored P), and the closed-form model of the same bytes;
- ``cost``: the FLOPs the backward spends recomputing S against the bytes of P it does not store;
- ``training``: one attention layer fitted with the course's forward and backward.
"""
