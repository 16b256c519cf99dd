"""Which series in a team's Prometheus are which replica's: label matchers from a template.

A fleet's scrape config decides the labels (`instance`, `job`, `pod`, `namespace`, ...), so the
run cannot guess them; the team writes one template, filled in per replica from its URL. The
default, `instance="{instance}"`, is what a static scrape config of the replicas' host:port gives.
A template that matches no `up` series would leave every observation stale and batch paused all
night, so `check_selectors` fails the run at the start instead, naming the selector.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from urllib.parse import urlparse

import httpx

DEFAULT_SELECTOR = 'instance="{instance}"'
FIELDS = ("name", "instance", "host", "port", "url")


class SelectorError(ValueError):
    """A selector template or a Prometheus that cannot serve the replicas; says what to change."""


def check_template(template: str) -> str:
    names = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
    unknown = sorted(names - set(FIELDS))
    if unknown or not template.strip():
        raise SelectorError(
            f"prometheus selector {template!r}: "
            + (f"unknown field {{{unknown[0]}}}; " if unknown else "empty; ")
            + f"use label matchers with {', '.join('{' + f + '}' for f in FIELDS)}, "
            'e.g. \'job="vllm",instance="{instance}"\''
        )
    return template


def replica_selectors(template: str, replicas: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Label matchers per replica name, from (name, base URL) pairs."""
    check_template(template)
    out = {}
    for name, url in replicas:
        parsed = urlparse(url)
        out[name] = template.format(
            name=name,
            instance=parsed.netloc,
            host=parsed.hostname or "",
            port=parsed.port or "",
            url=url.rstrip("/"),
        )
    return out


def check_selectors(base_url: str, selectors: Mapping[str, str], timeout_s: float = 5.0) -> None:
    """Every replica's selector finds an `up` series in the Prometheus at `base_url`."""
    base = base_url.rstrip("/")
    for name, selector in selectors.items():
        query = f"up{{{selector}}}"
        try:
            r = httpx.get(f"{base}/api/v1/query", params={"query": query}, timeout=timeout_s)
            body = r.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SelectorError(
                f"--prometheus-url {base_url} is not reachable ({type(exc).__name__}: {exc})"
            ) from None
        if body.get("status") != "success":
            raise SelectorError(
                f"Prometheus rejected {query} for replica {name}: {body.get('error')}; "
                "check --prometheus-selector"
            )
        if not body["data"]["result"]:
            raise SelectorError(
                f"Prometheus at {base_url} has no series {query} for replica {name}: does it "
                "scrape that replica, and do --prometheus-selector's labels match its scrape job?"
            )
