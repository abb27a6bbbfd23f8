"""Nsight Compute `.ncu-rep` through ncu_report (`reader`, `metrics`), read in a child process so
a native crash is one line (`isolated`)."""
