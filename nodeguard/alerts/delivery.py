"""What an Alertmanager delivery's request becomes: authorized or not, its body's bytes
(decompressed), then a :class:`~nodeguard.alerts.payload.WebhookPayload`, or at each step the
:class:`Refusal` that answers it.

Refusals: 401 without the bearer token (or with one that is not text), 408 when the body does
not arrive within the body timeout, 413 over the body limit (aiohttp's ``client_max_size``, also
once decompressed), 415 for a ``Content-Encoding`` other than gzip, 400 for a body that is not
what its encoding says, malformed or too deeply nested JSON, or a payload that is not v4 or has
a field over its bound.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import zlib
from collections.abc import Sequence
from typing import NamedTuple

from aiohttp import hdrs, web
from pydantic import ValidationError

from nodeguard.alerts.payload import WebhookPayload

__all__ = ["Refusal", "authorized", "parse_payload", "read_body"]

_ERROR_PART_CHARS = 40


class Refusal(NamedTuple):
    """The answer to a request refused: its HTTP status and the ``error`` of its JSON body."""

    status: int
    error: str


def authorized(request: web.Request, *, token: str | None) -> bool:
    """Whether the request carries ``Authorization: Bearer <token>`` (always, without a
    token); compared in constant time."""
    if not token:
        return True
    header = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, credential = header.partition(" ")
    # aiohttp decodes header bytes that are not UTF-8 to lone surrogates; surrogateescape
    # gives those bytes back, so any header compares (and fails) instead of raising.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        credential.strip().encode("utf-8", "surrogateescape"), token.encode()
    )


async def read_body(request: web.Request, *, timeout: float) -> bytes | Refusal:
    """The body, gzip (``Content-Encoding: gzip``) decompressed, within ``timeout`` seconds and
    ``request.client_max_size`` bytes (never more than that in memory), or why not."""
    limit = request.client_max_size
    try:
        async with asyncio.timeout(timeout):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return Refusal(413, f"body over {limit} bytes")
    except TimeoutError:
        return Refusal(408, f"body not received within {timeout:g}s")
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in ("gzip", "x-gzip"):
        return Refusal(415, "Content-Encoding: only gzip or identity")
    inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        body = inflate.decompress(raw, limit + 1)  # never more than the limit in memory
    except zlib.error as exc:
        return Refusal(400, f"body is not gzip: {exc}")
    if len(body) > limit:
        return Refusal(413, f"body over {limit} bytes once decompressed")
    if not inflate.eof or inflate.unused_data:
        return Refusal(400, "body is not one whole gzip stream")
    return body


def parse_payload(raw: bytes) -> WebhookPayload | Refusal:
    """The v4 payload of a body (RFC 8259 JSON, UTF-8), or a 400 that names each field wrong
    (each part of its path cut short)."""
    try:
        data = json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        return Refusal(400, "malformed JSON: nested too deeply")
    except ValueError as exc:  # UnicodeDecodeError too: bytes that are not UTF-8
        return Refusal(400, f"malformed JSON: {exc}")
    try:
        return WebhookPayload.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{_where(e['loc'])}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        return Refusal(400, f"not an Alertmanager v4 payload: {problems}")


def _not_json(name: str) -> None:
    """``NaN``, ``Infinity`` and ``-Infinity``: Python's json takes them, RFC 8259 (section 6)
    does not, and no Alertmanager writes them."""
    raise ValueError(f"{name} is not JSON (RFC 8259 section 6)")


def _where(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a field path, each part cut short (a label name in it can
    be as long as the body)."""
    parts = [str(p) for p in loc]
    return ".".join(
        p if len(p) <= _ERROR_PART_CHARS else p[: _ERROR_PART_CHARS - 3] + "..." for p in parts
    )
