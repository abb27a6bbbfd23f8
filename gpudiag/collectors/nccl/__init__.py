"""Collective timing: torch.distributed calls (`timing`), what a row says and how chunks are
written (`rows`), CUDA events and epoch anchors (`clock`), CuPy's NcclCommunicator
(`cupy_comm`, `cupy_patch`)."""
