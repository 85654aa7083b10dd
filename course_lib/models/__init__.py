"""Models of the hardware and of the traffic, to hold against measurements.

- ``roofline``: hardware presets, the roofline bound, measuring this machine, its figures;
- ``iomodel``: FLOPs and HBM bytes of each schedule (naive, FA1, FA2, split-KV);
- ``sram``: what a tile keeps on chip, and whether it fits;
- ``memory``: peak host memory of a call (tracemalloc), and the bytes of S.
"""
