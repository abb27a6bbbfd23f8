"""`gpudiag profile`: the session that runs a command and the bootstrap injected into it.

`session.run` / `session.merge_run` are the entry points; `bootstrap` is what runs inside
every Python process of the profiled command (stdlib only at import).
"""
