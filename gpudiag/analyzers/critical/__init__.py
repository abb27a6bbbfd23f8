"""The critical path of a trace: which chain of host ops, launches, GPU work and waits set
its length (`graph.build`, `path.critical_path`)."""
