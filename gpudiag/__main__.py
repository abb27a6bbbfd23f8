"""`python -m gpudiag` and the `gpudiag` command: the CLI, started so that a machine's limit
hit while importing it (pandas cannot be mapped under `ulimit -v`) is one line and status 2,
as it is once the CLI runs, not a traceback."""

import sys

from gpudiag.errors import exhausted


def run() -> None:
    """Import the CLI and run it."""
    try:
        from gpudiag.cli import main
    except Exception as exc:
        limit = exhausted(exc)
        if limit is None:
            raise
        sys.stderr.write(f"gpudiag: error: {limit}\n")
        sys.exit(limit.exit_code)
    main()


if __name__ == "__main__":
    run()
