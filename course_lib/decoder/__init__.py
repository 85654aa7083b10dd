"""Chapter 13: a small real language model, run in numpy with the course's attention kernels."""
