"""`gpudiag compare`'s outputs: its tables in words (`text`, what the terminal prints and
the page shows) and its figure (`figures`, each run's waterfall)."""
