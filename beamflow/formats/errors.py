"""The one error type for bad scan and product files."""

from __future__ import annotations

from pathlib import Path

from beamflow.error_kinds import ErrorKind


class ScanFormatError(ValueError):
    """A scan or product file that cannot be used, and why.

    ``str(err)`` is ``"<file>: <dataset or key>: <problem>"`` so that the CLI, the status page
    and the agent's log can show it as is; the parts are kept as attributes for programs.
    """

    kind = ErrorKind.BAD_INPUT  # the file is at fault: a retry would read it again

    def __init__(self, file: str | Path, dataset: str, problem: str) -> None:
        self.file = str(file)
        self.dataset = dataset
        self.problem = problem
        super().__init__(f"{self.file}: {dataset}: {problem}")

    def __reduce__(self):  # keep the three parts across pickling (process pools, Compute)
        return (type(self), (self.file, self.dataset, self.problem))
