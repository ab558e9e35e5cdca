"""Multipart bodies spooled to the data directory, not the system's temporary directory.

Starlette keeps each uploaded file in a ``SpooledTemporaryFile`` that rolls over to the
system temporary directory past 1 MB: an upload's size in ``TMPDIR``, a disk that readiness
never looked at, and whose filling answered 422 instead of 507. Here the file rolls over into
``spool_dir`` (inside ``MBN_DATA_DIR``), unlinked at once, and the disk's refusal is a 507.
"""

from __future__ import annotations

import errno
from contextlib import aclosing
from pathlib import Path
from tempfile import SpooledTemporaryFile

from fastapi import Request
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import ClientDisconnect

from service.domain import InsufficientStorage, InvalidInput, ServiceError, Unavailable


class _SpoolingParser(MultiPartParser):
    spool_dir: Path

    def on_headers_finished(self) -> None:
        super().on_headers_finished()
        upload = self._current_part.file
        if upload is not None:
            # Starlette made an in-memory spool in the default directory; nothing is in it yet.
            upload.file.close()
            # Closed with the form (or below, on an error), as Starlette's own spool is.
            spool = SpooledTemporaryFile(  # type: ignore[call-overload]  # noqa: SIM115
                max_size=self.spool_max_size, dir=self.spool_dir
            )
            upload.file = spool
            self._files_to_close_on_error[-1] = spool


async def read_form(
    request: Request, spool_dir: Path, *, max_files: int, max_fields: int
) -> FormData:
    """The request's multipart form, files spooled to ``spool_dir``: InvalidInput for a
    malformed body, InsufficientStorage when the spool's disk is full."""
    parser_type = type("SpoolingParser", (_SpoolingParser,), {"spool_dir": spool_dir})
    try:
        async with aclosing(request.stream()) as stream:
            parser = parser_type(
                request.headers, stream, max_files=max_files, max_fields=max_fields
            )
            return await parser.parse()
    except (ServiceError, ClientDisconnect):
        raise  # the body limit or pace, hit while reading; a client that left
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientStorage(
                "no space left to receive the upload; free disk space or retry later"
            ) from None
        raise Unavailable("cannot receive the upload now; retry later", retry_after=5) from None
    except (MultiPartException, Exception) as exc:  # malformed multipart, too many parts
        message = exc.message if isinstance(exc, MultiPartException) else str(exc)
        raise InvalidInput(f"unreadable multipart body: {message[:200]}") from None
