"""Shared memory segments of large exact requests (``service.exact.segments``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.exact import segments


def test_a_segment_is_made_attached_and_removed(tmp_path: Path) -> None:
    segment = segments.Segment.create(tmp_path, 4096)
    assert segment is not None and segment.name.startswith(f"mbn-exact-{os.getpid()}-")
    assert os.stat(segment.path).st_mode & 0o777 == 0o600  # the owner's only
    rows = np.arange(1024, dtype=np.float32)
    np.frombuffer(segment.memory, dtype=np.float32)[:] = rows
    other = segments.attach(tmp_path, segment.name, 4096)  # as the runtime maps it
    np.testing.assert_array_equal(np.frombuffer(other, dtype=np.float32), rows)
    other[:4] = b"\x00\x00\x80\x3f"  # the runtime writes the answer in place
    assert np.frombuffer(segment.memory, dtype=np.float32)[0] == 1.0
    other.close()
    segment.close()
    assert not segment.path.exists()
    segment.close()  # idempotent


@pytest.mark.parametrize(
    "name", ["../etc/passwd", "mbn-exact-1-xyz", "other", "mbn-exact-1-0123456789abcdef/.."]
)
def test_only_segment_names_are_attached(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError, match="not a segment name"):
        segments.attach(tmp_path, name, 1)


def test_a_segment_smaller_than_announced_is_refused(tmp_path: Path) -> None:
    segment = segments.Segment.create(tmp_path, 100)
    assert segment is not None
    with pytest.raises(ValueError, match="smaller than"):
        segments.attach(tmp_path, segment.name, 1000)
    segment.close()


def test_a_segment_whose_owner_is_gone_is_swept(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = tmp_path / f"mbn-exact-{int(gone.stdout)}-0123456789abcdef"
    alive = tmp_path / f"mbn-exact-{os.getpid()}-0123456789abcdef"
    foreign = tmp_path / "someone-elses-file"
    for path in (dead, alive, foreign):
        path.write_bytes(b"x")
    assert segments.sweep(tmp_path) == 1
    assert not dead.exists() and alive.exists() and foreign.exists()
    assert segments.sweep(None) == 0


def test_no_room_falls_back_to_the_socket(tmp_path: Path) -> None:
    # A size no file system has room for: refused when made, never a SIGBUS later.
    assert segments.Segment.create(tmp_path, 1 << 60) is None
    assert list(tmp_path.iterdir()) == []
    assert segments.Segment.create(tmp_path / "missing", 10) is None
