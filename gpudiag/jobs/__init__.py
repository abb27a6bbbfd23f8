"""Many-rank jobs: where the per-rank work runs (`executors`: in this process, a local
process pool, or a Dask cluster), one interface for the analysis written on top of it."""
