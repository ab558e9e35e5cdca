"""Shared memory segments for the rows and answers of large exact requests.

An API process writes a large request's rows into a file of its own on a memory file system
(``/dev/shm``) and sends its name; the runtime maps it, copies the rows out and later writes
the answer into the same file. The API process owns it: it makes it, reads the answer from it
and removes it, whatever happens to the request. A runtime that dies mid-request leaves the
file to its owner; an owner killed with ``kill -9`` leaves it behind, and ``sweep`` (run by the
supervisor) removes the files whose owner is gone, told by the process id in their names.

Space is reserved when a segment is made (``posix_fallocate``): on a full file system the
request falls back to the socket, never to a write that the kernel answers with ``SIGBUS``.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import secrets
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_DIRECTORY = Path("/dev/shm")
_PREFIX = "mbn-exact-"
_NAME = re.compile(rf"{_PREFIX}(\d+)-[0-9a-f]{{16}}")


def directory() -> Path | None:
    """Where segments are made: ``/dev/shm`` when it is there and writable, else None (every
    request then travels over the socket)."""
    if DEFAULT_DIRECTORY.is_dir() and os.access(DEFAULT_DIRECTORY, os.W_OK | os.X_OK):
        return DEFAULT_DIRECTORY
    return None


class Segment:
    """A segment made and owned by this process, mapped read-write."""

    def __init__(self, path: Path, memory: mmap.mmap) -> None:
        self.path = path
        self.name = path.name
        self.memory = memory

    @classmethod
    def create(cls, where: Path, size: int) -> Segment | None:
        """A new segment of ``size`` bytes in ``where``, or None when the file system has no
        room for it (or refuses it): the caller sends the bytes over the socket instead."""
        path = where / f"{_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as error:
            log.warning("no shared memory segment (%s): sending over the socket", error.strerror)
            return None
        try:
            os.posix_fallocate(fd, 0, size)
            memory = mmap.mmap(fd, size)
        except OSError as error:
            path.unlink(missing_ok=True)
            log.warning("no room for a shared memory segment of %d bytes (%s)", size, error)
            return None
        finally:
            os.close(fd)
        return cls(path, memory)

    def close(self) -> None:
        """Unmap and remove the segment (idempotent). A runtime that still maps it keeps its
        pages until it lets go of them."""
        self.path.unlink(missing_ok=True)
        with contextlib.suppress(BufferError):  # a view still exported: freed with it
            self.memory.close()


def attach(where: Path, name: str, size: int) -> mmap.mmap:
    """Map the segment ``name`` (made by an API process) read-write: at least ``size`` bytes.
    ValueError for a name that is not a segment's; OSError when it is gone."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name[:80]!r} is not a segment name")
    fd = os.open(where / name, os.O_RDWR | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size < size:
            raise ValueError(f"segment {name} is smaller than {size} bytes")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)


def sweep(where: Path | None) -> int:
    """Remove the segments whose owner process is gone; how many were removed."""
    if where is None:
        return 0
    removed = 0
    with contextlib.suppress(OSError):
        for entry in where.iterdir():
            match = _NAME.fullmatch(entry.name)
            if match is None or _alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                entry.unlink()
                removed += 1
    if removed:
        log.info("removed %d shared memory segment(s) of processes that are gone", removed)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
