"""The one atomic-write helper: a reader sees the old file or the whole new one."""

from __future__ import annotations

import json
import os
import stat

import pytest

from beamflow.atomic import atomic_path, atomic_write_bytes, atomic_write_json


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "record.json"
    atomic_write_json(target, {"v": 1})
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text('{"v": 2, "half')
        raise RuntimeError("disk went away")
    assert json.loads(target.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_the_new_file_replaces_the_old_with_the_permissions_open_would_give(tmp_path):
    target = tmp_path / "image.png"
    target.write_bytes(b"old")
    old_umask = os.umask(0o027)
    try:
        atomic_write_bytes(target, b"new", durable=False)
    finally:
        os.umask(old_umask)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640


def test_a_fixed_temporary_name_is_used_and_gone_after(tmp_path):
    target = tmp_path / "scan_master.h5"
    with atomic_path(target, tmp_name=".scan_master.h5.part") as tmp:
        assert tmp == tmp_path / ".scan_master.h5.part"
        tmp.write_bytes(b"x")
        assert not target.exists()
    assert target.read_bytes() == b"x" and not tmp.exists()
