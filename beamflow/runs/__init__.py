"""The run: one scan's flow run, from the request to its record.

The package's modules, bottom up (importing a module loads only what it needs; this file
imports nothing, so the run store does not pull in the backends):

- ``records`` the run record (``Run``, ``RunStatus``) and its steps, attempts and events;
- ``naming`` the names of scans and runs (scan key, run name, display labels);
- ``schema``, ``store`` the run store: SQLite in WAL mode, the single source of truth;
- ``request`` what a new run is asked (``RunRequest``), checked: the scan's one path, the
  flow and the reconstruction parameters;
- ``flow_input`` the flow's input for one run: the transfers' collection paths and the
  compute function's arguments, and where every file goes;
- ``compute_output`` what the reconstruct function answered, read from the flow's output;
- ``failures`` a failed run told cause first, and the kind of its fault;
- ``lifecycle`` the life of a run: create, launch, follow, retry, cancel, and the run
  backend the configuration names;
- ``retention`` what stays of a run's files, and for how long.
"""
