"""Chapter 15: edge accelerators, where software moves every tile and the SRAM is small.

``schedule``    the DMA / compute schedule of a scratchpad accelerator: 1, 2 or 3 buffers per
                operand, the steady state, prologue and epilogue, and attention's plan on an NPU
``dma``         the same schedule run for real on this CPU: a paced "DRAM", a loader thread as
                the DMA engine and a compiled, GIL-free tile loop
``fixed_point`` int8 scores with int32 accumulation, a lookup-table exp in fixed point, and
                the loops an NPU without a matrix unit runs (scalar or vector)
``manycore``    many small cores around one shared SRAM and one DMA
``mask_fusion`` a mask as a separate pass over S, or fused into the tile loop: counted bytes
``figures``     the timeline and the cluster pictures
"""
