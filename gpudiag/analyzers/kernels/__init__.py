"""Kernels: theoretical occupancy (`occupancy`), waves, small grids, tails and launch overhead
(`launch`), and Nsight Compute's per-kernel metrics and rules (`metrics`)."""
