"""Credentials for shared replicas: an API key and extra headers, sent on every request to them.

They travel in the environment (`NIGHTSHIFT_REPLICA_API_KEY`, and `NIGHTSHIFT_REPLICA_HEADERS`
with one `Name: value` per line) and as this object, never as a flow parameter or a setting that
is written down: Prefect stores flow parameters and shows them in its UI, and run files are kept
for months. The object's repr names the headers but never shows a value, so a log line, a
traceback or a Prefect task description that prints it leaks nothing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

API_KEY_ENV = "NIGHTSHIFT_REPLICA_API_KEY"
HEADERS_ENV = "NIGHTSHIFT_REPLICA_HEADERS"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
"""A header name as HTTP defines it (RFC 9110 token)."""


class AuthError(ValueError):
    """A header that cannot be sent; the message names it, never its value."""


@dataclass(frozen=True)
class ReplicaAuth:
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def http_headers(self) -> dict[str, str]:
        """Headers for a request to a replica: the extra ones, and the key as a bearer token."""
        out = dict(self.headers)
        if self.api_key:
            out["Authorization"] = f"Bearer {self.api_key}"
        return out

    def to_env(self) -> dict[str, str]:
        """The environment that carries this auth to `from_env` (in another process)."""
        env = {}
        if self.api_key:
            env[API_KEY_ENV] = self.api_key
        if self.headers:
            env[HEADERS_ENV] = "\n".join(f"{k}: {v}" for k, v in self.headers)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ReplicaAuth:
        environ = os.environ if environ is None else environ
        lines = environ.get(HEADERS_ENV, "").splitlines()
        return cls(environ.get(API_KEY_ENV) or None, parse_headers(lines, HEADERS_ENV))

    def __repr__(self) -> str:
        key = "set" if self.api_key else "none"
        return f"ReplicaAuth(api_key={key}, headers={[k for k, _ in self.headers]})"

    __str__ = __repr__


def parse_headers(lines: Iterable[str], source: str = "--header") -> tuple[tuple[str, str], ...]:
    """`Name: value` lines (blank ones skipped) as pairs, checked so that a typo fails at the
    start with the header's name rather than as a 400 from a gateway at midnight."""
    out = []
    for line in lines:
        if not line.strip():
            continue
        name, sep, value = line.partition(":")
        name = name.strip()
        if not sep or not _TOKEN.match(name) or not value.strip():
            shown = name if _TOKEN.match(name) else "a header"
            raise AuthError(
                f"{source}: {shown} is not `Name: value` (one header per line, e.g. "
                "'X-Tenant: nightly')"
            )
        if name.lower() == "authorization":
            raise AuthError(f"{source}: give the replicas' key as the API key, not a header")
        out.append((name, value.strip()))
    return tuple(out)
