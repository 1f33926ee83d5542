"""On-disk checkpoint format, atomic commit, verification, restore and retention.

One HDF5 file per checkpoint, ``ckpt-<iteration:09d>-<sha256 of the file, 16 hex>.h5``::

    attrs: format="beamflow-checkpoint", schema_version, iteration, time,
           meta_json, fingerprint_json, header_json, content_sha256
    /arrays/<name>   one dataset per array (fletcher32; complex stored natively)

Every file is hashed before HDF5 parses a byte of it: against the full sha256 in
`LATEST.json`, or (fallback, LATEST lost or garbled) against the sha256 prefix in its own
name. This matters: the HDF5 library can abort() the whole process on some damaged files,
so a damaged checkpoint must never reach it. Inside, `content_sha256` covers the header
(names, dtypes, shapes), iteration, meta and fingerprint, and fletcher32 guards each chunk
of array data: a second, independent check of what is returned.

Commit order (each step a hook point, for crash tests)::

    temp written -> fsync -> rename -> fsync dir -> LATEST temp written+fsync -> rename
    -> fsync dir -> retention

A crash at any point leaves either the previous commit or the new one readable; temp files
are never read (they do not match the checkpoint name pattern).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from beamflow.processes import pid_alive

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
FORMAT_NAME = "beamflow-checkpoint"
LATEST_NAME = "LATEST.json"
_FILE_RE = re.compile(r"^ckpt-(\d{9,})-([0-9a-f]{16})\.h5$")
_SHA_IN_NAME = 16
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TMP_PREFIX = ".tmp-"
_HOST = socket.gethostname().replace("-", "_")

#: hook(step, path): called at each commit step; tests use it to pause or inject faults.
CommitHook = Callable[[str, Path], None]
COMMIT_STEPS = (
    "temp_written",
    "temp_fsynced",
    "renamed",
    "dir_fsynced",
    "latest_temp_written",
    "latest_renamed",
    "committed",
)


class CorruptCheckpoint(Exception):
    """A checkpoint file (or LATEST.json) failed verification; the message says why."""


@dataclass
class Checkpoint:
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    iteration: int
    path: Path
    fingerprint: dict[str, Any] | None
    time: float = 0.0
    sha256: str = ""
    #: why newer candidates were skipped on the way to this one (empty on the happy path)
    warnings: list[str] = field(default_factory=list)


@dataclass
class LatestRecord:
    file: str
    iteration: int
    sha256: str
    schema_version: int
    fingerprint: dict[str, Any] | None
    time: float
    size: int | None = None

    def path(self, directory: Path) -> Path:
        return Path(directory) / self.file


def checkpoint_name(iteration: int, sha256: str) -> str:
    return f"ckpt-{iteration:09d}-{sha256[:_SHA_IN_NAME]}.h5"


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"checkpoint metadata value of type {type(o).__name__} is not JSON: {o!r}")


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, sort_keys=True)


# --------------------------------------------------------------------------- writing


def check_arrays(arrays: Mapping[str, np.ndarray]) -> None:
    for name, a in arrays.items():
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"checkpoint array name {name!r}: use letters, digits, '_', '.', '-'")
        if not isinstance(a, np.ndarray):
            raise TypeError(f"checkpoint array {name!r} is {type(a).__name__}, not a host ndarray")
        if a.dtype.kind not in "biufc":
            raise TypeError(f"checkpoint array {name!r} has dtype {a.dtype}; only numbers/bool")


def _content_digest(header: str, iteration: int, meta_json: str, fp_json: str) -> str:
    # Array bytes are covered by fletcher32 (per chunk) and by the file's sha256; hashing them
    # a third time would double the writer's CPU cost for little gain.
    h = hashlib.sha256()
    for part in (header, str(iteration), meta_json, fp_json):
        b = part.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _header(arrays: Mapping[str, np.ndarray]) -> str:
    return json.dumps([[k, a.dtype.str, list(a.shape)] for k, a in arrays.items()])


def _chunks(a: np.ndarray) -> tuple[int, ...]:
    # Chunks of at most about 1 MiB along the first axis: few chunks (each has filter
    # overhead) yet bounded memory when a reader reads one dataset; at least 16 KiB, so that
    # an array that grows by a row per checkpoint (the loss history) grows inside its chunk.
    row = max(1, a.nbytes // max(1, a.shape[0]))
    rows = max(1, min(max(a.shape[0], (16 << 10) // row), (1 << 20) // row))
    return (rows, *a.shape[1:])


def _layout(arrays: Mapping[str, np.ndarray]) -> list[Any]:
    """What must match for a file to be rewritten: all but the length of the first axis."""
    return [[k, a.dtype.str, a.ndim, list(a.shape[1:]), a.size == 0] for k, a in arrays.items()]


class FileImages:
    """Builds checkpoint file images, rewriting one in-memory HDF5 file while the layout holds.

    Creating an HDF5 file, its attributes and its datasets costs a few milliseconds whatever
    the data, as much as everything else in a small commit together. So successive
    checkpoints with the same arrays (names, dtypes, shapes but the first axis's length)
    rewrite the datasets and the changed attributes of the file they last built (in place:
    chunks keep their size, attributes their type, so the file does not grow; a longer or
    shorter first axis resizes the dataset) and take its image again. A new layout starts a
    new file. Files above `keep_below` bytes are not kept: for them the fixed costs are small
    and a second copy of the state in memory is not. The rewrites go through h5py's low-level
    handles: 0.4 ms for 4 attributes and 4 datasets of a small state, against 1.9 ms through
    `attrs.modify` and `write_direct`. One thread at a time (the writer process's `_Images`
    serialises its levels).
    """

    def __init__(self, keep_below: int = 64 << 20) -> None:
        self.keep_below = keep_below
        self._file: h5py.File | None = None
        self._layout: list[Any] | None = None
        self._attrs: dict[str, Any] = {}
        self._attr_ids: dict[str, Any] = {}  # h5py.h5a.AttrID by name
        self._dataset_ids: dict[str, Any] = {}  # h5py.h5d.DatasetID by name

    def build(self, iteration: int, arrays: Mapping[str, np.ndarray], meta_json: str,
              fingerprint_json: str, created: float | None = None) -> bytes:
        """The complete HDF5 file image of one checkpoint."""
        check_arrays(arrays)
        header = _header(arrays)
        attrs = {
            "format": FORMAT_NAME,
            "schema_version": SCHEMA_VERSION,
            "iteration": int(iteration),
            "time": float(time.time() if created is None else created),
            "meta_json": meta_json,
            "fingerprint_json": fingerprint_json,
            "header_json": header,
            "content_sha256": _content_digest(header, iteration, meta_json, fingerprint_json),
        }
        layout = _layout(arrays)
        if self._file is None or layout != self._layout:
            self._new_file(layout, attrs, arrays)
        else:
            self._rewrite(attrs, arrays)
        f = self._file
        assert f is not None
        f.flush()
        image = f.id.get_file_image()
        if len(image) > self.keep_below:
            self._close()
        return image

    def _new_file(self, layout: list[Any], attrs: dict[str, Any],
                  arrays: Mapping[str, np.ndarray]) -> None:
        self._close()
        # the core driver keeps the whole file in C memory (no Python callbacks per write, as
        # a file-like object would need); the name only identifies it while open.
        name = f"beamflow-ckpt-{os.getpid()}-{id(self)}-{secrets.token_hex(4)}.h5"
        f = h5py.File(name, "w", driver="core", backing_store=False)
        try:
            for key, value in attrs.items():
                f.attrs[key] = value
            g = f.create_group("arrays")
            for key, a in arrays.items():
                # fletcher32 needs chunked storage; scalars and empty arrays cannot be chunked
                # (the file's sha256 still covers them).
                if a.ndim == 0 or a.size == 0:
                    g.create_dataset(key, data=a)
                else:
                    g.create_dataset(key, data=a, fletcher32=True, chunks=_chunks(a),
                                     maxshape=(None, *a.shape[1:]))
            attr_ids = {key: h5py.h5a.open(f.id, key.encode()) for key in attrs}
            dataset_ids = {key: g[key].id for key in arrays}
        except BaseException:
            f.close()
            raise
        self._file, self._layout, self._attrs = f, layout, attrs
        self._attr_ids, self._dataset_ids = attr_ids, dataset_ids

    def _rewrite(self, attrs: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
        try:
            for key, value in attrs.items():
                if value != self._attrs[key]:
                    attr = self._attr_ids[key]
                    attr.write(np.array(value, dtype=attr.dtype))
            for key, a in arrays.items():
                if a.size:
                    dataset = self._dataset_ids[key]
                    if dataset.shape != a.shape:
                        dataset.set_extent(a.shape)
                    dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(a))
        except BaseException:
            self._close()  # half rewritten: never take an image of it
            raise
        self._attrs = attrs

    def _close(self) -> None:
        self._attr_ids, self._dataset_ids = {}, {}
        if self._file is not None:
            self._file.close()
        self._file, self._layout, self._attrs = None, None, {}


def _fsync(path: Path) -> None:
    """fsync a file or a directory (its entries: a rename in it), raising if it cannot: a
    checkpoint is committed only once it would survive a power cut."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tmp_path(directory: Path, final_name: str, owner: int) -> Path:
    # host and pid in the name let a later process tell a dead writer's leftovers from a live one
    return directory / f"{_TMP_PREFIX}{final_name}.{_HOST}-{owner}-{secrets.token_hex(4)}"


def _write_durable(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)


def commit(
    directory: Path | str,
    iteration: int,
    image: bytes,
    *,
    fingerprint: Mapping[str, Any] | None,
    keep: int,
    protect: Iterable[Path] = (),
    hook: CommitHook | None = None,
    sha256: str | None = None,
    owner: int | None = None,
) -> LatestRecord:
    """Atomically write one serialized checkpoint into `directory` and point LATEST.json at it.

    `owner`: the pid named in temp files (default this process's): a writer process gives its
    parent's, whose death ends the write, so that a restarted job can tell its leftovers.
    """
    owner = os.getpid() if owner is None else owner
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    digest = sha256 or hashlib.sha256(image).hexdigest()
    name = checkpoint_name(iteration, digest)
    final = directory / name
    tmp = _tmp_path(directory, name, owner)

    def step(s: str, p: Path) -> None:
        if hook is not None:
            hook(s, p)

    try:
        _write_durable(tmp, image)
        step("temp_written", tmp)
        _fsync(tmp)
        step("temp_fsynced", tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    step("renamed", final)
    _fsync(directory)
    step("dir_fsynced", final)

    record = LatestRecord(file=name, iteration=int(iteration), sha256=digest,
                          schema_version=SCHEMA_VERSION,
                          fingerprint=dict(fingerprint) if fingerprint is not None else None,
                          time=time.time(), size=len(image))
    latest_tmp = _tmp_path(directory, LATEST_NAME, owner)
    try:
        _write_durable(latest_tmp, dumps(record.__dict__).encode())
        _fsync(latest_tmp)
        step("latest_temp_written", latest_tmp)
        os.replace(latest_tmp, directory / LATEST_NAME)
    except BaseException:
        with contextlib.suppress(OSError):
            latest_tmp.unlink()
        raise
    step("latest_renamed", directory / LATEST_NAME)
    _fsync(directory)
    apply_retention(directory, keep=keep, current_iteration=int(iteration),
                    protect=[final, *protect], latest_file=name)
    step("committed", final)
    return record


# --------------------------------------------------------------------------- listing, retention


def list_checkpoints(directory: Path | str) -> list[tuple[int, Path]]:
    """(iteration, path) of every checkpoint-named file, newest first (ties: newest mtime)."""
    directory = Path(directory)
    try:
        entries = list(os.scandir(directory))
    except OSError:  # missing, not a directory, unreadable: no checkpoints there
        return []
    out = []
    for e in entries:
        m = _FILE_RE.match(e.name)
        if m:
            try:
                mtime = e.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            out.append((int(m.group(1)), mtime, Path(e.path)))
    out.sort(key=lambda t: (t[0], t[1]), reverse=True)
    return [(it, p) for it, _, p in out]


def apply_retention(directory: Path | str, *, keep: int, current_iteration: int | None = None,
                    protect: Iterable[Path] = (), latest_file: str | None = None) -> list[Path]:
    """Keep the newest `keep` checkpoints; never delete protected files or LATEST's target.

    Files from iterations after `current_iteration` belong to an abandoned line of history
    (for example a corrupt newer file that a resume skipped), and older copies of
    `current_iteration` itself are superseded; both are removed so that a later fallback
    cannot pick them. `latest_file`: the name LATEST.json holds, when the caller knows it.
    """
    directory = Path(directory)
    # checkpoint files live directly in `directory`: compare names (no realpath per file)
    protected = {Path(p).name for p in protect
                 if Path(p).parent.resolve() == directory.resolve()}
    if latest_file is None:
        rec = read_latest_record(directory, quiet=True)
        latest_file = rec.file if rec is not None else None
    if latest_file is not None:
        protected.add(latest_file)
    kept = 0
    removed = []
    for it, path in list_checkpoints(directory):
        if path.name in protected:
            kept += 1
            continue
        if current_iteration is not None and it >= current_iteration:
            pass  # abandoned future, or a superseded copy of this iteration: remove
        elif kept < keep:
            kept += 1
            continue
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    return removed


def clean_stale_temps(directory: Path | str, *, max_age_s: float = 24 * 3600) -> list[Path]:
    """Delete temp files left by dead writers on this host (or older than `max_age_s`)."""
    directory = Path(directory)
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    now = time.time()
    for e in entries:
        if not e.name.startswith(_TMP_PREFIX):
            continue
        stale = False
        m = re.search(r"\.([^.]+)-(\d+)-[0-9a-f]+$", e.name)
        if m and m.group(1) == _HOST:
            pid = int(m.group(2))
            stale = pid != os.getpid() and not pid_alive(pid)
        with contextlib.suppress(FileNotFoundError):
            if not stale and now - e.stat().st_mtime > max_age_s:
                stale = True
            if stale:
                os.unlink(e.path)
                removed.append(Path(e.path))
    return removed


# --------------------------------------------------------------------------- reading


def read_latest_record(directory: Path | str, *, quiet: bool = False) -> LatestRecord | None:
    """Parse LATEST.json (no verification of the file it names); None if absent or garbled."""
    path = Path(directory) / LATEST_NAME
    try:
        raw = json.loads(path.read_text())
        rec = LatestRecord(
            file=str(raw["file"]), iteration=int(raw["iteration"]), sha256=str(raw["sha256"]),
            schema_version=int(raw["schema_version"]), fingerprint=raw.get("fingerprint"),
            time=float(raw.get("time", 0.0)), size=raw.get("size"),
        )
        if not _FILE_RE.match(rec.file):
            raise ValueError(f"names {rec.file!r}, not a checkpoint file")
        return rec
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        if not quiet:
            log.warning("%s is garbled (%s)", path, e)
        return None


def read_checkpoint(path: Path | str, expected_sha256: str | None = None) -> Checkpoint:
    """Read and fully verify one checkpoint file; raise CorruptCheckpoint with the reason.

    The file is read into memory once, and both the sha256 and the HDF5 parse use those same
    bytes, so a concurrent rename cannot make us verify one file and return another. The
    bytes are checked against `expected_sha256` and the sha256 prefix in a checkpoint name
    before HDF5 sees them; a file under another name with no expected hash is parsed as is.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as e:
        raise CorruptCheckpoint(f"{path}: cannot read ({e.strerror or e})") from e
    sha = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and sha != expected_sha256:
        raise CorruptCheckpoint(f"{path}: sha256 {sha[:16]}… does not match LATEST.json "
                                f"({expected_sha256[:16]}…)")
    m = _FILE_RE.match(path.name)
    if m and sha[:_SHA_IN_NAME] != m.group(2):
        raise CorruptCheckpoint(f"{path}: sha256 {sha[:16]}… does not match its name")
    try:
        with h5py.File(h5py.h5f.open_file_image(data), "r") as f:
            if f.attrs.get("format") != FORMAT_NAME:
                raise CorruptCheckpoint(f"{path}: not a beamflow checkpoint")
            version = int(f.attrs["schema_version"])
            if version > SCHEMA_VERSION:
                raise CorruptCheckpoint(f"{path}: schema version {version} is newer than this "
                                        f"beamflow understands ({SCHEMA_VERSION})")
            iteration = int(f.attrs["iteration"])
            meta_json = str(f.attrs["meta_json"])
            fp_json = str(f.attrs["fingerprint_json"])
            header = str(f.attrs["header_json"])
            stored_digest = str(f.attrs["content_sha256"])
            created = float(f.attrs["time"])
            arrays: dict[str, np.ndarray] = {}
            g = f["arrays"]
            for name, dtype, shape in json.loads(header):
                a = g[name][()]  # fletcher32 is checked here, chunk by chunk
                a = np.asarray(a)
                if a.dtype.str != dtype or list(a.shape) != shape:
                    raise CorruptCheckpoint(f"{path}: dataset {name!r} is {a.dtype.str}"
                                            f"{list(a.shape)}, header says {dtype}{shape}")
                arrays[name] = a
            if set(g.keys()) != set(arrays):
                raise CorruptCheckpoint(f"{path}: datasets {sorted(g.keys())} do not match "
                                        f"the header {sorted(arrays)}")
    except CorruptCheckpoint:
        raise
    except Exception as e:  # h5py raises OSError/KeyError/ValueError/RuntimeError on damage
        raise CorruptCheckpoint(f"{path}: unreadable HDF5 ({type(e).__name__}: {e})") from e
    digest = _content_digest(header, iteration, meta_json, fp_json)
    if digest != stored_digest:
        raise CorruptCheckpoint(f"{path}: content digest mismatch (damaged data or metadata)")
    if m and int(m.group(1)) != iteration:
        raise CorruptCheckpoint(f"{path}: holds iteration {iteration}, name says {m.group(1)}")
    try:
        meta = json.loads(meta_json)
        fingerprint = json.loads(fp_json)
    except ValueError as e:
        raise CorruptCheckpoint(f"{path}: metadata is not JSON ({e})") from e
    return Checkpoint(arrays=arrays, meta=meta, iteration=iteration, path=path,
                      fingerprint=fingerprint, time=created, sha256=sha)


def _load_dir(directory: Path) -> Checkpoint | None:
    warnings: list[str] = []
    tried: set[Path] = set()
    # LATEST can move while we read (a live writer); re-read it a few times before falling back.
    for _ in range(3):
        rec = read_latest_record(directory, quiet=True)
        if rec is None:
            if (directory / LATEST_NAME).exists():
                warnings.append(f"{directory / LATEST_NAME} is garbled")
            elif list_checkpoints(directory):
                warnings.append(f"{directory / LATEST_NAME} is missing")
            break
        if rec.schema_version > SCHEMA_VERSION:
            warnings.append(f"{directory / LATEST_NAME}: schema version {rec.schema_version} "
                            f"is newer than this beamflow understands")
            break
        target = rec.path(directory)
        try:
            ck = read_checkpoint(target, rec.sha256)
            ck.warnings = warnings
            return ck
        except CorruptCheckpoint as e:
            if read_latest_record(directory, quiet=True) == rec:
                warnings.append(str(e))
                tried.add(target)
                break
    for _, path in list_checkpoints(directory):
        if path in tried:
            continue
        try:
            ck = read_checkpoint(path)
        except CorruptCheckpoint as e:
            if path.exists():
                warnings.append(str(e))
            continue
        ck.warnings = warnings
        for w in warnings:
            log.warning("checkpoint fallback: %s", w)
        return ck
    for w in warnings:
        log.warning("checkpoint: %s", w)
    return None


def load_latest(dirs: Path | str | Sequence[Path | str]) -> Checkpoint | None:
    """The newest verified checkpoint across one or more level directories, or None.

    Within a directory, LATEST.json is authoritative when its file verifies (sha256, HDF5,
    fletcher32, content digest); otherwise the newest file that verifies on its own is used.
    Across directories (L1, L2) the highest iteration wins (ties: the most recent write).
    """
    if isinstance(dirs, str | Path):
        dirs = [dirs]
    best: Checkpoint | None = None
    for d in dirs:
        ck = _load_dir(Path(d))
        if ck is not None and (best is None or (ck.iteration, ck.time) > (best.iteration,
                                                                          best.time)):
            best = ck
    return best


def clear_checkpoints(directory: Path | str) -> None:
    """Remove every checkpoint, temp file and LATEST.json (a fresh start in a reused dir).

    Best effort: what cannot be removed is logged (the writer will report the directory).
    """
    directory = Path(directory)
    victims = [directory / LATEST_NAME] + [p for _, p in list_checkpoints(directory)]
    with contextlib.suppress(OSError):
        victims += [Path(e.path) for e in os.scandir(directory)
                    if e.name.startswith(_TMP_PREFIX)]
    for p in victims:
        try:
            p.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove old checkpoint %s: %s", p, e)

