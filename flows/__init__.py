"""Flow definitions in the Globus Flows language, shipped as package data."""
