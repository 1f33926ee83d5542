"""beamflow: a ptychography beamline as a live analysis instrument."""

__version__ = "0.1.0"
