"""Nsight Compute's outputs: the kernel x metric heatmap (`heatmap`) and ncu's rule results
as the pages list them (`rules`)."""
