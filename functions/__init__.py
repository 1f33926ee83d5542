"""Globus Compute functions that the flows call (self-contained bodies)."""
