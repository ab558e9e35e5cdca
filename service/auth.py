"""Optional API keys: ``Authorization: Bearer <key>``, compared in constant time.

Keys are kept only as SHA-256 digests and compared digest to digest with
``hmac.compare_digest`` against every configured key (no early exit, no length leak). Neither
keys nor the header are ever logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from pydantic import SecretStr

from service.domain import Unauthorized


class ApiKeys:
    def __init__(self, keys: Iterable[SecretStr]) -> None:
        self._digests = [_digest(k.get_secret_value()) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> None:
        """Raise ``Unauthorized`` unless the header carries a configured key."""
        if not self._digests:
            return
        if not authorization:
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("malformed Authorization header: expected 'Bearer <key>'")
        candidate = _digest(token.strip())
        match = False
        for digest in self._digests:
            match |= hmac.compare_digest(candidate, digest)
        if not match:
            raise Unauthorized("invalid API key")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
