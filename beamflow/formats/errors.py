"""The one error type for bad scan and product files."""

from __future__ import annotations

from pathlib import Path

from beamflow.error_kinds import ErrorKind

#: The ``dataset`` of a problem of the file itself (missing, not HDF5, empty, ...).
WHOLE_FILE = "/"


class ScanFormatError(ValueError):
    """A scan or product file that cannot be used, and why.

    ``str(err)`` is ``"<file>: <dataset or key>: <problem>"`` so that the CLI, the status page
    and the agent's log can show it as is; the parts are kept as attributes for programs.
    A problem of the file itself (``dataset`` :data:`WHOLE_FILE`) reads as a sentence about
    the file: ``<file>: <problem>``, or ``<file> is not ...`` / ``<file> is a ...``.
    """

    kind = ErrorKind.BAD_INPUT  # the file is at fault: a retry would read it again

    def __init__(self, file: str | Path, dataset: str, problem: str) -> None:
        self.file = str(file)
        self.dataset = dataset
        self.problem = problem
        super().__init__(self.text(self.file, dataset, problem))

    @staticmethod
    def text(file: str, dataset: str, problem: str) -> str:
        if dataset != WHOLE_FILE:
            return f"{file}: {dataset}: {problem}"
        if problem.startswith("not "):
            return f"{file} is {problem}"
        if problem.startswith("is "):
            return f"{file} {problem}"
        return f"{file}: {problem}"

    def __reduce__(self):  # keep the three parts across pickling (process pools, Compute)
        return (type(self), (self.file, self.dataset, self.problem))
