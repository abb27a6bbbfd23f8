"""How `diagnose` runs the analyzers, for one trace and for a job alike: the registry of
analyzers (`registry`), the map over one part (`parts`), the reduce of the parts into the
Diagnosis (`reduce`, `answer`), its notes (`notes`) and the ranking of its findings
(`ranking`). `analyzers.diagnosis.diagnose` and `gpudiag.jobs` are its two callers."""
