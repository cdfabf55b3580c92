"""`python -m hub` runs the gpufleet CLI (used where the console script is not on PATH)."""

from hub.cli import main

main()
