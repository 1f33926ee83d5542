"""`python -m beamflow.cli`: the same as the `beamflow` script."""

from beamflow.cli import main

main()
