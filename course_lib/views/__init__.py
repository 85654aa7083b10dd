"""What a learner looks at: the interactive widgets and the figures that are their static twins.

- ``figstyle``: one figure style for every chapter;
- ``widgets``: the tile-size and roofline explorers and the shared figure-in-a-widget helpers;
- ``roofline_plot``: the roofs of machines and kernels as points on them;
- ``stepthrough``: the online-softmax step-through;
- ``tilemap``: which tiles a mask leaves empty, partial or full;
- ``text``: printed lines that fit a notebook's 110 characters (``say``, ``wrapped``, ``fitted``).
"""
