"""Terminal rendering (rich) of what gpudiag found: the summary and the diagnosis
(`diagnosis`), its training steps and host breakdown (`steps`), a job's stragglers
(`ranks`) and a comparison of runs (`compare`). Each reads `Diagnosis.to_dict()` (or a
`Comparison`); nothing here computes a diagnosis."""

from gpudiag.reports.terminal.diagnosis import print_diagnosis, print_summary

__all__ = ["print_diagnosis", "print_summary"]
