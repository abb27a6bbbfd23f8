"""`python -m gpudiag` runs the CLI."""

from gpudiag.cli import main

if __name__ == "__main__":
    main()
