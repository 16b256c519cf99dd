"""The controller's side of a replica's engine plug-in: send control documents, read status.

A replica started on this host has a control folder (`Replica.control_dir`): documents are written
there atomically and the plug-in polls the file. A replica on another host is reached through the
route its API server carries (`serving/engine_site/control_route.py`) with the replica's API key,
which is sent as a bearer token and never logged. Either way the document is checked by the same
parser the plug-in uses before it leaves, so a bad one fails here, with the field named.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from scheduler.control_document import ControlDocument, from_dict
from scheduler.latency_model import LatencyModel
from serving.engine_site.control_files import CONTROL_FILE, STATUS_FILE
from serving.engine_site.engine_status import write_atomically

CONTROL_ROUTE = "/nightshift/control"
STATUS_ROUTE = "/nightshift/status"


class ControlError(RuntimeError):
    """A control document that could not be delivered; the message says where and why."""


@dataclass(frozen=True)
class ControlTarget:
    """Where one replica takes its control document."""

    name: str
    folder: Path | None = None
    """The replica's control folder when it runs on this host."""
    base_url: str | None = None
    """Its API server, used when there is no folder."""
    api_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    """Extra headers for the route (a gateway in front of the replica)."""

    def __repr__(self) -> str:  # the key stays out of logs and tracebacks
        return f"ControlTarget({self.name!r}, folder={self.folder}, base_url={self.base_url!r})"


def next_seq(last: int | None = None) -> int:
    """A sequence number above `last` and above any a previous controller process used: wall
    milliseconds, so a restarted controller is not taken for a stale one."""
    return max((last or 0) + 1, int(time.time() * 1000))


def decision_document(
    seq: int,
    target_ms: float,
    model: LatencyModel,
    ttl_s: float,
    pause: bool = False,
    min_chunk_tokens: int = 0,
    now: float | None = None,
    idle_target_ms: float | None = None,
    mean_target_ms: float | None = None,
    chat_cache_horizon_s: float | None = None,
    tail_scale: bool = True,
) -> ControlDocument:
    """A checked control document that expires `ttl_s` after `now`."""
    now = time.time() if now is None else now
    doc = {
        "seq": seq,
        "expires_at": now + ttl_s,
        "batch_step_target_ms": float(target_ms),
        "latency_model": model.coefficients(),
        "min_chunk_tokens": min_chunk_tokens,
        "pause": pause,
    }
    if idle_target_ms is not None:
        doc["idle_step_target_ms"] = float(idle_target_ms)
    if mean_target_ms is not None:
        doc["mean_step_target_ms"] = float(mean_target_ms)
    if chat_cache_horizon_s is not None:
        doc["chat_cache_horizon_s"] = float(chat_cache_horizon_s)
    if not tail_scale:
        doc["tail_scale"] = False
    return from_dict(doc)


def send(target: ControlTarget, doc: ControlDocument, timeout_s: float = 2.0) -> None:
    """Deliver `doc` to `target`: into its folder when it has one, else over HTTP."""
    if target.folder is not None:
        write_atomically(Path(target.folder) / CONTROL_FILE, doc.to_json())
        return
    if not target.base_url:
        raise ControlError(f"replica {target.name}: neither a control folder nor a URL")
    try:
        r = httpx.post(
            target.base_url.rstrip("/") + CONTROL_ROUTE,
            content=doc.to_json(),
            headers=_headers(target),
            timeout=timeout_s,
        )
    except httpx.HTTPError as exc:
        raise ControlError(f"replica {target.name}: {target.base_url} unreachable: {exc}") from None
    if r.status_code != 200:
        raise ControlError(
            f"replica {target.name}: control route answered {r.status_code}: {r.text[:200]}"
        )


def read_status(target: ControlTarget, timeout_s: float = 2.0) -> dict | None:
    """The plug-in's latest status document, or None when it has written none (no plug-in, or
    not one step yet)."""
    if target.folder is not None:
        try:
            return json.loads((Path(target.folder) / STATUS_FILE).read_text())
        except (OSError, ValueError):
            return None
    if not target.base_url:
        return None
    try:
        r = httpx.get(
            target.base_url.rstrip("/") + STATUS_ROUTE, headers=_headers(target), timeout=timeout_s
        )
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None


def _headers(target: ControlTarget) -> dict[str, str]:
    out = dict(target.headers)
    if target.api_key:
        out["Authorization"] = f"Bearer {target.api_key}"
    return out
