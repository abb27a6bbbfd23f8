"""torch CUDA memory snapshots through a restricted unpickler (`unpickler`, `reader`), their call
sites (`sites`) and `export_memory_timeline` files (`timeline`)."""
