"""The control document over HTTP, on the replica's own port, for controllers on another host.

Loaded by the API server with vLLM's `--middleware serving.engine_site.control_route.control_route`
(the launcher adds it whenever the config selects the plug-in). Two routes:

- `POST /nightshift/control` takes a control document, checks it with the same parser the plug-in
  uses (422 naming the field when it is wrong, or when it has expired by this replica's clock; 413
  for a body over `MAX_BYTES`, which is never read further), and writes it atomically into the
  replica's control folder, where the engine-core process picks it up within its poll interval;
- `GET /nightshift/status` returns the plug-in's latest status document.

Both require the replica's API key when one is set (`--api-key` or `VLLM_API_KEY`, as vLLM's own
routes do: vLLM's authentication guards only `/v1`, so this route checks the key itself, in
constant time). The key is never logged. Everything else passes through to vLLM untouched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sys
import time
from pathlib import Path

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from scheduler import control_document
from scheduler.control_document import MAX_BYTES, ControlDocumentError
from serving.engine_site.control_files import CONTROL_DIR_ENV, CONTROL_FILE, STATUS_FILE
from serving.engine_site.engine_status import write_atomically

CONTROL_PATH = "/nightshift/control"
STATUS_PATH = "/nightshift/status"


def _api_keys() -> list[bytes]:
    keys, argv = [], sys.argv
    for i, arg in enumerate(argv):
        if arg == "--api-key" and i + 1 < len(argv):
            keys.append(argv[i + 1])
        elif arg.startswith("--api-key="):
            keys.append(arg.split("=", 1)[1])
    if not keys and os.environ.get("VLLM_API_KEY"):
        keys.append(os.environ["VLLM_API_KEY"])
    return [hashlib.sha256(k.encode()).digest() for k in keys if k]


_KEYS = _api_keys()


def _authorized(request: Request) -> bool:
    if not _KEYS:
        return True
    header = request.headers.get("authorization", "")
    token = header[7:] if header.lower().startswith("bearer ") else ""
    digest = hashlib.sha256(token.encode()).digest()
    return any(hmac.compare_digest(digest, k) for k in _KEYS)


def _folder() -> Path | None:
    folder = os.environ.get(CONTROL_DIR_ENV)
    return Path(folder) if folder else None


async def control_route(request: Request, call_next):
    """ASGI function middleware: answer the two nightshift routes, pass everything else on."""
    path = request.url.path
    if path not in (CONTROL_PATH, STATUS_PATH):
        return await call_next(request)
    if not _authorized(request):
        client = request.client.host if request.client else "?"
        print(f"nightshift: {request.method} {path} from {client} refused: missing or wrong API "
              "key", file=sys.stderr)  # fmt: skip
        return JSONResponse({"error": "missing or wrong API key"}, status_code=401)
    folder = _folder()
    if folder is None:
        return JSONResponse({"error": "this replica has no control folder"}, status_code=503)
    if path == STATUS_PATH and request.method == "GET":
        try:
            return Response((folder / STATUS_FILE).read_bytes(), media_type="application/json")
        except OSError:
            return JSONResponse({"error": "no status written yet"}, status_code=404)
    if path == CONTROL_PATH and request.method == "POST":
        return await _take_control(request, folder)
    return JSONResponse({"error": f"method {request.method} not allowed"}, status_code=405)


async def _take_control(request: Request, folder: Path) -> Response:
    body = await _body_at_most(request, MAX_BYTES)
    if body is None:
        print(f"nightshift: control document over HTTP rejected: body over {MAX_BYTES} bytes",
              file=sys.stderr)  # fmt: skip
        return JSONResponse({"error": f"body over {MAX_BYTES} bytes"}, status_code=413)
    try:
        doc = control_document.parse(body)
        control_document.check_not_expired(doc, time.time())
    except ControlDocumentError as exc:
        print(f"nightshift: control document over HTTP rejected: {exc}", file=sys.stderr)
        return JSONResponse({"error": str(exc)}, status_code=422)
    write_atomically(folder / CONTROL_FILE, doc.to_json())
    return JSONResponse({"accepted": json.loads(doc.to_json())["seq"]})


async def _body_at_most(request: Request, limit: int) -> bytes | None:
    """The request's body, or None once it is over `limit` bytes: a declared length over it is
    refused unread, and a body streamed without one is read no further than `limit`."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)
