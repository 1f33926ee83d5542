"""The local Transfer action provider: copies, sync levels, verification, no partial files,
confinement to the collection roots."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from beamflow.local.actions import ActionUnableToRunError
from beamflow.local.transfer import LocalTransferProvider
from beamflow.local.transfer_task import PARTIAL_MARK

SRC = "11111111-1111-4111-8111-111111111111"
DST = "22222222-2222-4222-8222-222222222222"


def assert_refused_unverified(details: dict, dst: Path, path: str) -> None:
    """The transfer failed on a checksum that did not match, naming the file, and left
    neither the file ``dst/path`` nor a partial copy anywhere under ``dst``."""
    target = dst / path
    assert details["status"] == "FAILED"
    assert details["fatal_error"]["code"] == "CHECKSUM_MISMATCH"
    assert target.name in details["fatal_error"]["description"]
    assert not target.exists()
    assert not list(dst.rglob(f"*{PARTIAL_MARK}*")), "a partial file was left behind"


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    src, dst = tmp_path / "beamline", tmp_path / "hpc"
    src.mkdir()
    dst.mkdir()
    return src, dst


def provider(roots: tuple[Path, Path], **kwargs: Any) -> LocalTransferProvider:
    # A small block size so that multi-block paths run on small test files.
    kwargs.setdefault("block_size", 64 << 10)
    return LocalTransferProvider({SRC: roots[0], DST: roots[1]}, **kwargs)


def body(*items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"source_endpoint": SRC, "destination_endpoint": DST, "DATA": list(items), **extra}


def item(src: str, dst: str, recursive: bool = False) -> dict[str, Any]:
    return {"source_path": src, "destination_path": dst, "recursive": recursive}


def run(p: LocalTransferProvider, b: dict[str, Any]) -> dict[str, Any]:
    started = p.start(b, None)
    assert started.status in ("ACTIVE", "SUCCEEDED", "FAILED")
    final = p.wait(started.action_id, timeout=30)
    assert final.status != "ACTIVE"
    return {"status": final.status, **final.details}


def scan_of(src: Path, n: int, size: int) -> None:
    """n random files scan/fNN.bin under the source root."""
    for i in range(n):
        write(src / f"scan/f{i:02d}.bin", os.urandom(size))


def assert_only_whole_files(src: Path, dst: Path) -> None:
    """No partial file anywhere; every file that landed is the source's, byte for byte."""
    assert not list(dst.rglob(f"*{PARTIAL_MARK}*"))
    for out in (dst / "scan").glob("*.bin"):
        assert out.read_bytes() == (src / "scan" / out.name).read_bytes()


def write(path: Path, data: bytes, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_file_and_recursive_directory_copy(roots: tuple[Path, Path]) -> None:
    src, dst = roots
    payload = os.urandom(300_000)  # several blocks
    write(src / "scan1" / "scan1_master.h5", b"master")
    write(src / "scan1" / "scan1_data_000001.h5", payload)
    write(src / "scan1" / "sub" / "deep.bin", b"deep")
    write(src / "one.cxi", b"cxi-bytes")
    p = provider(roots)
    details = run(
        p,
        body(
            item("/scan1", "/raw/scan1", recursive=True),
            item("/one.cxi", "/raw/one.cxi"),
            verify_checksum=True,
        ),
    )
    assert details["status"] == "SUCCEEDED", details
    assert (dst / "raw/scan1/scan1_data_000001.h5").read_bytes() == payload
    assert (dst / "raw/scan1/sub/deep.bin").read_bytes() == b"deep"
    assert (dst / "raw/one.cxi").read_bytes() == b"cxi-bytes"
    assert details["files"] == 4
    assert details["files_transferred"] == 4
    assert details["bytes_transferred"] == len(payload) + len(b"master") + 4 + 9
    assert details["bytes_checksummed"] >= 2 * details["bytes_transferred"]
    assert details["task_id"] and details["fatal_error"] is None
    assert not list(dst.rglob(f"*{PARTIAL_MARK}*"))


def test_fast_copy_without_checksum(roots: tuple[Path, Path]) -> None:
    src, dst = roots
    payload = os.urandom(1 << 20)
    write(src / "big.bin", payload)
    details = run(provider(roots), body(item("/big.bin", "/big.bin")))
    assert details["status"] == "SUCCEEDED"
    assert (dst / "big.bin").read_bytes() == payload
    assert details["bytes_checksummed"] == 0


@pytest.mark.parametrize(
    ("level", "copied"),
    [
        # Each case: which of (missing, resized, newer, same-size-same-time-changed, same)
        # the level copies.
        ("exists", {"missing"}),
        ("size", {"missing", "resized"}),
        ("mtime", {"missing", "resized", "newer"}),
        ("checksum", {"missing", "resized", "newer", "changed"}),
    ],
)
def test_sync_levels(roots: tuple[Path, Path], level: str, copied: set[str]) -> None:
    src, dst = roots
    old, new = time.time() - 1000, time.time() - 10
    write(src / "d/missing", b"AAAA", new)
    write(src / "d/resized", b"AAAAAA", new)
    write(dst / "d/resized", b"BBBB", old)
    write(src / "d/newer", b"AAAA", new)
    write(dst / "d/newer", b"BBBB", old)
    write(src / "d/changed", b"AAAA", old)  # same size, destination not older, other bytes
    write(dst / "d/changed", b"BBBB", new)
    write(src / "d/same", b"SAME", old)
    write(dst / "d/same", b"SAME", new)
    details = run(provider(roots), body(item("/d", "/d", recursive=True), sync_level=level))
    assert details["status"] == "SUCCEEDED"
    names = ("missing", "resized", "newer", "changed", "same")
    now_copied = {n for n in names if (dst / "d" / n).read_bytes() == (src / "d" / n).read_bytes()}
    assert now_copied - {"same"} == copied
    assert details["files_transferred"] == len(copied)
    assert details["files_skipped"] == 5 - len(copied)


def test_sync_level_numbers_and_rerun_skips_everything(roots: tuple[Path, Path]) -> None:
    src, _ = roots
    for i in range(3):
        write(src / "s" / f"f{i}", os.urandom(1000))
    p = provider(roots)
    first = run(p, body(item("/s", "/s", recursive=True), sync_level=2))
    again = run(p, body(item("/s", "/s", recursive=True), sync_level=2))
    assert (first["files_transferred"], again["files_transferred"]) == (3, 0)
    assert again["files_skipped"] == 3


def test_checksum_mismatch_is_retried_then_succeeds(roots: tuple[Path, Path]) -> None:
    src, dst = roots
    payload = os.urandom(400_000)
    write(src / "f.bin", payload)
    corrupted: list[int] = []

    def corrupt_once(tmp: Path, offset: int, length: int) -> None:
        if not corrupted and offset > 0:  # mid-way, after the first block
            corrupted.append(offset)
            with open(tmp, "r+b") as fh:
                fh.seek(offset)
                fh.write(b"\xff" * 16)

    details = run(
        provider(roots, after_write=corrupt_once),
        body(item("/f.bin", "/f.bin"), verify_checksum=True),
    )
    assert corrupted, "the hook never ran mid-way"
    assert details["status"] == "SUCCEEDED"
    assert details["faults"] == 1
    assert details["fault_details"][0]["code"] == "CHECKSUM_MISMATCH"
    assert (dst / "f.bin").read_bytes() == payload


def test_persistent_checksum_mismatch_fails_naming_the_file(roots: tuple[Path, Path]) -> None:
    src, dst = roots
    write(src / "f.bin", os.urandom(200_000))

    def corrupt(tmp: Path, offset: int, length: int) -> None:
        with open(tmp, "r+b") as fh:
            fh.seek(offset)
            fh.write(b"\x00" if fh.read(1) != b"\x00" else b"\x01")

    details = run(
        provider(roots, after_write=corrupt),
        body(item("/f.bin", "/out/f.bin"), verify_checksum=True),
    )
    assert_refused_unverified(details, dst, "out/f.bin")


@pytest.mark.parametrize("verify", [False, True])
def test_partial_destination_never_visible(roots: tuple[Path, Path], verify: bool) -> None:
    src, dst = roots
    old = b"old complete content"
    new = os.urandom(500_000)
    write(dst / "out/replaced.bin", old)
    write(src / "replaced.bin", new)
    write(src / "fresh.bin", new)
    seen: list[tuple[str, bytes | None, list[str]]] = []

    def look(tmp: Path, offset: int, length: int) -> None:
        final = tmp.parent / tmp.name.split(PARTIAL_MARK)[0][1:]
        visible = sorted(p.name for p in tmp.parent.iterdir() if not p.name.startswith("."))
        seen.append((final.name, final.read_bytes() if final.exists() else None, visible))

    details = run(
        provider(roots, after_write=look),
        body(
            item("/replaced.bin", "/out/replaced.bin"),
            item("/fresh.bin", "/out/fresh.bin"),
            verify_checksum=verify,
        ),
    )
    assert details["status"] == "SUCCEEDED"
    assert seen
    for name, content, visible in seen:
        assert all(PARTIAL_MARK not in v for v in visible)
        # While a file is being written, its final name shows the old content or nothing.
        assert content == (old if name == "replaced.bin" else None) or content == new
        if name == "fresh.bin":
            assert content is None
    assert (dst / "out/replaced.bin").read_bytes() == new
    assert (dst / "out/fresh.bin").read_bytes() == new


@pytest.mark.parametrize(
    ("source", "destination"),
    [
        ("/../outside.txt", "/x"),
        ("/a/../../outside.txt", "/x"),
        ("/ok.txt", "/../escaped.txt"),
        ("relative.txt", "/x"),
        ("/link_out/secret.txt", "/x"),  # a symlink inside the root to a directory outside
    ],
)
def test_paths_outside_a_root_are_refused(
    roots: tuple[Path, Path], tmp_path: Path, source: str, destination: str
) -> None:
    src, dst = roots
    outside = tmp_path / "outside"
    outside.mkdir()
    write(outside / "secret.txt", b"secret")
    write(tmp_path / "outside.txt", b"secret")
    write(src / "ok.txt", b"ok")
    (src / "link_out").symlink_to(outside)
    with pytest.raises(ActionUnableToRunError, match="outside|absolute"):
        provider(roots).start(body(item(source, destination)), None)
    assert not (tmp_path / "escaped.txt").exists()
    assert list(dst.iterdir()) == []


def test_symlink_escape_inside_a_recursive_walk_fails_the_task(
    roots: tuple[Path, Path], tmp_path: Path
) -> None:
    src, dst = roots
    write(tmp_path / "secret.txt", b"secret")
    write(src / "scan/a.h5", b"a")
    (src / "scan/leak.h5").symlink_to(tmp_path / "secret.txt")
    details = run(provider(roots), body(item("/scan", "/scan", recursive=True)))
    assert details["status"] == "FAILED"
    assert details["fatal_error"]["code"] == "PERMISSION_DENIED"
    assert "leak.h5" in details["fatal_error"]["description"]
    assert not (dst / "scan/leak.h5").exists()


def test_bad_requests_are_refused(roots: tuple[Path, Path]) -> None:
    write(roots[0] / "a", b"a")
    p = provider(roots)
    with pytest.raises(ActionUnableToRunError, match="unknown collection"):
        p.start(
            {**body(item("/a", "/a")), "source_endpoint": "33333333-3333-4333-8333-333333333333"},
            None,
        )
    with pytest.raises(ActionUnableToRunError, match="sync_level"):
        p.start(body(item("/a", "/a"), sync_level="sometimes"), None)
    with pytest.raises(ActionUnableToRunError, match="Extra inputs|extra"):
        p.start(body(item("/a", "/a"), colour="blue"), None)
    with pytest.raises(ActionUnableToRunError, match="invalid transfer request: DATA") as bad:
        p.start(body(), None)
    # The structured error the flow's Catch sees, as Globus's providers answer.
    assert bad.value.details == {"code": "BadRequest", "description": str(bad.value)}


def test_missing_source_and_wrong_recursive_fail_with_codes(roots: tuple[Path, Path]) -> None:
    write(roots[0] / "dir/f", b"f")
    write(roots[0] / "file", b"f")
    p = provider(roots)
    assert run(p, body(item("/nope", "/nope")))["fatal_error"]["code"] == "FILE_NOT_FOUND"
    assert run(p, body(item("/dir", "/dir")))["fatal_error"]["code"] == "IS_A_DIRECTORY"
    assert run(p, body(item("/file", "/f", recursive=True)))["fatal_error"]["code"] == (
        "NOT_A_DIRECTORY"
    )


def test_cancel_stops_the_task_and_leaves_no_partial_file(roots: tuple[Path, Path]) -> None:
    src, dst = roots
    write(src / "big.bin", os.urandom(2 << 20))
    gate = threading.Event()
    release = threading.Event()

    def hold(tmp: Path, offset: int, length: int) -> None:
        gate.set()
        release.wait(10)

    p = provider(roots, after_write=hold)
    started = p.start(body(item("/big.bin", "/big.bin"), verify_checksum=True), None)
    assert gate.wait(10)
    threading.Timer(0.2, release.set).start()
    final = p.cancel(started.action_id)
    assert final.status == "FAILED"
    assert final.details["fatal_error"]["code"] == "CANCELED"
    assert not (dst / "big.bin").exists()
    assert not list(dst.rglob(f"*{PARTIAL_MARK}*"))


def test_preserve_timestamp(roots: tuple[Path, Path]) -> None:
    src, dst = roots
    write(src / "t.bin", b"t", mtime=1_600_000_000)
    run(provider(roots), body(item("/t.bin", "/t.bin"), preserve_timestamp=True))
    assert int((dst / "t.bin").stat().st_mtime) == 1_600_000_000


@pytest.mark.parametrize("algorithm", ["xxh3_128", "sha256", "md5", "crc32", "adler32"])
def test_every_checksum_algorithm_verifies_and_reports_itself(
    roots: tuple[Path, Path], algorithm: str
) -> None:
    src, dst = roots
    payload = os.urandom(300_000)
    write(src / "f.bin", payload)
    details = run(
        provider(roots, checksum_algorithm=algorithm),
        body(item("/f.bin", "/f.bin"), verify_checksum=True),
    )
    assert details["status"] == "SUCCEEDED"
    assert details["checksum_algorithm"] == algorithm.upper()
    assert details["bytes_checksummed"] == 2 * len(payload)  # source and destination
    assert (dst / "f.bin").read_bytes() == payload


def test_unknown_checksum_algorithm_is_refused(roots: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="unknown checksum algorithm 'whirlpool'"):
        provider(roots, checksum_algorithm="whirlpool").start(
            body(item("/f.bin", "/f.bin"), verify_checksum=True), None
        )


def test_verified_pipeline_retries_the_one_corrupted_file_among_many(
    roots: tuple[Path, Path],
) -> None:
    # Files are copied while earlier ones are still being verified: a corrupted file in the
    # middle is retried on its own and every file ends complete and correct.
    src, dst = roots
    payloads = {f"scan/d{i % 3}/f{i:03d}.bin": os.urandom(100_000 + 997 * i) for i in range(24)}
    for name, data in payloads.items():
        write(src / name, data)
    hit: list[str] = []

    def corrupt_f013_once(tmp: Path, offset: int, length: int) -> None:
        if tmp.name.startswith(".f013.bin") and not hit:
            hit.append(tmp.name)
            with open(tmp, "r+b") as fh:
                fh.seek(offset)
                fh.write(b"\x5a" * 8)

    details = run(
        provider(roots, after_write=corrupt_f013_once),
        body(item("/scan", "/scan", recursive=True), verify_checksum=True),
    )
    assert hit
    assert details["status"] == "SUCCEEDED"
    assert details["files_transferred"] == len(payloads)
    assert [f["code"] for f in details["fault_details"]] == ["CHECKSUM_MISMATCH"]
    assert "f013.bin" in details["fault_details"][0]["description"]
    for name, data in payloads.items():
        assert (dst / name).read_bytes() == data, name
    assert not list(dst.rglob(f"*{PARTIAL_MARK}*"))


def test_a_source_growing_during_a_verified_copy_is_copied_as_planned(
    roots: tuple[Path, Path],
) -> None:
    # A detector may still append to a file: the copy takes the size planned at the start
    # (cp's snapshot), and both digests cover exactly those bytes.
    src, dst = roots
    first = os.urandom(400_000)
    write(src / "growing.bin", first)
    grown: list[int] = []

    def append_once(tmp: Path, offset: int, length: int) -> None:
        if not grown:
            grown.append(offset)
            with open(src / "growing.bin", "ab") as fh:
                fh.write(os.urandom(50_000))

    details = run(
        provider(roots, after_write=append_once),
        body(item("/growing.bin", "/growing.bin"), verify_checksum=True),
    )
    assert grown
    assert details["status"] == "SUCCEEDED"
    assert (dst / "growing.bin").read_bytes() == first


def test_a_source_shrinking_during_a_verified_copy_fails_naming_the_file(
    roots: tuple[Path, Path],
) -> None:
    src, dst = roots
    write(src / "shrinks.bin", os.urandom(400_000))

    def truncate(tmp: Path, offset: int, length: int) -> None:
        os.truncate(src / "shrinks.bin", 100_000)

    details = run(
        provider(roots, after_write=truncate),
        body(item("/shrinks.bin", "/shrinks.bin"), verify_checksum=True),
    )
    assert_refused_unverified(details, dst, "shrinks.bin")


def test_a_write_error_mid_pipeline_fails_the_task_and_leaves_no_partial_files(
    roots: tuple[Path, Path],
) -> None:
    src, dst = roots
    scan_of(src, 12, 150_000)

    def disk_full_at_f07(tmp: Path, offset: int, length: int) -> None:
        if tmp.name.startswith(".f07.bin"):
            raise OSError(28, "No space left on device")

    details = run(
        provider(roots, after_write=disk_full_at_f07),
        body(item("/scan", "/scan", recursive=True), verify_checksum=True),
    )
    assert details["status"] == "FAILED"
    assert details["fatal_error"]["code"] == "NO_SPACE_LEFT"
    # The file as it is called once copied, and the room left on its disk.
    assert details["fatal_error"]["description"].startswith(
        f"{dst / 'scan' / 'f07.bin'}: No space left on device (")
    assert PARTIAL_MARK not in details["fatal_error"]["description"]
    assert_only_whole_files(src, dst)  # those verified before the failure landed whole


@pytest.mark.parametrize("verify", [False, True])
def test_a_rename_refused_at_the_destination_fails_with_its_code(
    roots: tuple[Path, Path], verify: bool
) -> None:
    # The destination name is taken by a non-empty directory created during the copy:
    # the rename fails, and the task reports a transfer fault naming it (not an internal
    # error), leaving no partial file.
    src, dst = roots
    write(src / "f.bin", os.urandom(200_000))

    def block_the_name(tmp: Path, offset: int, length: int) -> None:
        (dst / "f.bin" / "x").mkdir(parents=True, exist_ok=True)

    details = run(
        provider(roots, after_write=block_the_name),
        body(item("/f.bin", "/f.bin"), verify_checksum=verify),
    )
    assert details["status"] == "FAILED"
    assert details["fatal_error"]["code"] != "INTERNAL"
    assert "f.bin" in details["fatal_error"]["description"]
    assert not list(dst.rglob(f"*{PARTIAL_MARK}*"))


def test_cancel_mid_pipeline_stops_every_file_and_leaves_no_partial_file(
    roots: tuple[Path, Path],
) -> None:
    # Several files are in flight (copied, still being verified) when the cancel comes.
    src, dst = roots
    scan_of(src, 10, 300_000)
    gate, release = threading.Event(), threading.Event()

    def hold_at_f05(tmp: Path, offset: int, length: int) -> None:
        if tmp.name.startswith(".f05.bin"):
            gate.set()
            release.wait(10)

    p = provider(roots, after_write=hold_at_f05)
    started = p.start(body(item("/scan", "/scan", recursive=True), verify_checksum=True), None)
    assert gate.wait(10)
    threading.Timer(0.2, release.set).start()
    final = p.cancel(started.action_id)
    assert final.status == "FAILED"
    assert final.details["fatal_error"]["code"] == "CANCELED"
    assert_only_whole_files(src, dst)
    assert not (dst / "scan" / "f05.bin").exists()


@pytest.mark.parametrize("verify", [False, True])
def test_empty_files_and_directories_are_copied(roots: tuple[Path, Path], verify: bool) -> None:
    src, dst = roots
    write(src / "scan/empty.bin", b"")
    write(src / "scan/one.bin", b"x")
    (src / "scan/empty_dir").mkdir()
    details = run(
        provider(roots),
        body(item("/scan", "/scan", recursive=True), verify_checksum=verify),
    )
    assert details["status"] == "SUCCEEDED"
    assert details["files_transferred"] == 2
    assert (dst / "scan/empty.bin").read_bytes() == b""
    assert (dst / "scan/one.bin").read_bytes() == b"x"
    assert (dst / "scan/empty_dir").is_dir()
