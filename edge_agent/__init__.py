"""The beamline daemon: watch the detector, decide readiness, start and follow runs."""
