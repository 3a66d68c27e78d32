"""Message signatures: HMAC-SHA256 under a per-session key, as Jupyter signs its own messages.

A message is two frames, the signature (hex) and the payload; the receiver recomputes the
signature and compares in constant time (`hmac.compare_digest`), so only holders of the key
(processes started with the notebook's environment, or given `%gpumem workers --env`) can talk
to the kernel, and workers obey only their own kernel.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_BYTES = 32


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


class Signer:
    __slots__ = ("_mac",)

    def __init__(self, key: bytes) -> None:
        if not key:
            raise ValueError("a signing key must not be empty")
        self._mac = hmac.new(key, digestmod=hashlib.sha256)  # copied per message: no re-keying

    def sign(self, payload: bytes) -> bytes:
        mac = self._mac.copy()
        mac.update(payload)
        return mac.hexdigest().encode("ascii")

    def frames(self, payload: bytes) -> list[bytes]:
        return [self.sign(payload), payload]

    def verify(self, signature: bytes, payload: bytes) -> bool:
        return hmac.compare_digest(self.sign(payload), signature)
