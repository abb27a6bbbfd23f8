"""The session's NVML sampler (`sampler`) and what each reading asks NVML, for the GPUs the job
sees (`source`)."""
