"""Models of the hardware and of the traffic, to hold against measurements.

- ``roofline``: the roofline bound of some FLOPs and bytes on a machine (its figures: ``core.hardware``);
- ``measure``: this machine measured with numpy, for its own roofline;
- ``iomodel``: FLOPs and HBM bytes of each schedule (naive, FA1, FA2, split-KV);
- ``sram``: what a tile keeps on chip, and whether it fits;
- ``memory``: peak host memory of a call (tracemalloc), and the bytes of S.
"""
