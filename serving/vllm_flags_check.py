"""Check an engine config's `vllm:` flags with vLLM's own parser before a replica starts.

The schema (`serving.engine_config`) only knows that `vllm:` maps dash-form names to values; which
names exist and which values they take is vLLM's business and changes between its versions. A typo
such as `max-num-seqz` or a value such as `max-model-len: lots` used to pass `--dry-run` and kill
the replica at start-up with the error buried in its log. Here the engine's interpreter parses the
rendered flags with the parser the API server uses (`serving/engine_site/check_flags.py`), which
converts strings and starts nothing, and the verdict becomes an error that names the config file,
the key as written in YAML, vLLM's reason and, for a name vLLM does not know, the closest one it
does. The control plane has no vLLM, so the check runs as a subprocess, a few seconds each time
(importing vLLM); a config's verdict is kept under the cache root, keyed by its flags, the checker
and the vLLM install beside the engine interpreter, so a reinstall or an edit checks again.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import subprocess
from pathlib import Path

from serving.engine_config import EngineConfig, EngineConfigError, render_flags
from serving.engine_site.engine_status import write_atomically
from serving.paths import cache_root, engine_python

CHECKER = Path(__file__).resolve().parent / "engine_site" / "check_flags.py"
TIMEOUT_S = 120.0
LAUNCHER_FLAGS = frozenset({"model", "port", "host", "served-model-name"})


class VllmFlagError(EngineConfigError):
    """Engine flags that vLLM's parser rejects; the message names file, key and vLLM's reason."""


class CheckerFailed(RuntimeError):
    """The checker gave no verdict: vLLM did not import, or the check ran out of time."""


def closest_flag(key: str, names: list[str]) -> str | None:
    """The valid flag name nearest to `key`, or None when none is near enough to suggest."""
    base = key.split(".", 1)[0]
    candidates = [n for n in names if n not in LAUNCHER_FLAGS]
    matches = difflib.get_close_matches(base, candidates, n=1, cutoff=0.6)
    return matches[0] if matches else None


def problem_message(problem: dict, names: list[str], flags: dict | None = None) -> str:
    """One rejected key as a line: `vllm.KEY ...` with vLLM's reason (no file name)."""
    key = problem.get("key")
    reason = problem.get("message") or "rejected"
    if key is None:
        return f"vllm: vLLM rejects these flags together: {reason}"
    if problem.get("kind") == "unknown":
        value = (flags or {}).get(key)
        if value is False and key.split(".", 1)[0] in names:
            return (
                f"vllm.{key}: false is not accepted, vLLM has no --no-{key} "
                "(leave the key out for the default)"
            )
        suggestion = closest_flag(key, names)
        hint = f"did you mean {suggestion}?" if suggestion else "no similar vLLM flag"
        line = f"vllm.{key} is not a vLLM flag ({hint})"
        if problem.get("message") and not reason.startswith("unrecognized arguments"):
            line += f": {reason}"  # e.g. an abbreviation that matches several flags
        return line
    shown = _shown(flags[key]) if flags and key in flags else " ".join(problem.get("argv", [])[1:])
    return f"vllm.{key}: vLLM rejects {shown or 'the flag'} ({reason})"


def verdict_error(verdict: dict, config_path: str | Path, flags: dict | None = None) -> str | None:
    """The error message for a checker verdict, None when vLLM accepted every flag. Each rejected
    key is one line led by the config file, e.g. `engine_configs/x.yaml: vllm.max-num-seqz is not
    a vLLM flag (did you mean max-num-seqs?)`."""
    if verdict.get("ok"):
        return None
    names = list(verdict.get("flags") or [])
    problems = verdict.get("problems") or [{"key": None, "message": "no reason given"}]
    return "\n".join(f"{config_path}: {problem_message(p, names, flags)}" for p in problems)


def run_checker(flags: dict, timeout_s: float = TIMEOUT_S) -> dict:
    """The checker's verdict on `flags` (a config's `vllm:` mapping), from the engine interpreter.

    Raises SetupError (from `engine_python`) when the engine venv is missing, and CheckerFailed
    when the checker itself fails (vLLM not importable, a parser it does not expect)."""
    return run_checker_many([flags], timeout_s)[0]


def run_checker_many(configs: list[dict], timeout_s: float = TIMEOUT_S) -> list[dict]:
    """One verdict per `vllm:` mapping in `configs`, in order, from one run of the checker (the
    run's cost is importing vLLM, whatever the number of configs)."""
    python = engine_python()
    request = {
        "configs": [
            [[key, render_flags({key: value})] for key, value in flags.items()] for flags in configs
        ]
    }
    try:
        proc = subprocess.run(
            [str(python), str(CHECKER)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        raise CheckerFailed(
            f"checking engine flags with {python} took over {timeout_s:.0f} s"
        ) from exc
    try:
        if proc.returncode != 0:
            raise ValueError(f"exit status {proc.returncode}")
        verdicts = json.loads(proc.stdout)
        if not isinstance(verdicts, list) or len(verdicts) != len(configs):
            raise ValueError(f"{len(configs)} verdicts expected, got {proc.stdout[:200]!r}")
        return verdicts
    except ValueError as exc:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise CheckerFailed(
            f"the engine flag checker ({python} {CHECKER.name}) failed ({exc}):\n{tail}"
        ) from None


def check_vllm_flags(config: EngineConfig, config_path: str | Path) -> None:
    """Raise VllmFlagError when vLLM's own parser rejects any of the config's `vllm:` flags."""
    if not config.vllm:
        return
    try:
        verdict = cached_verdict(config.vllm)
    except CheckerFailed as exc:
        raise VllmFlagError(f"{config_path}: could not check the vllm flags: {exc}") from None
    if message := verdict_error(verdict, config_path, config.vllm):
        raise VllmFlagError(message)


def cached_verdict(flags: dict) -> dict:
    """`run_checker(flags)`, answered from the cache when the same flags were checked by the same
    checker against the same vLLM install. A checker that failed leaves nothing behind."""
    key = verdict_key(engine_python(), flags)
    path = cache_root() / "flag-checks" / f"{key}.json" if key else None
    if path is not None and path.is_file():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass  # unreadable: check again and write it anew
    verdict = run_checker(flags)
    if path is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written only costs time
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(verdict))
    return verdict


def verdict_key(python: Path, flags: dict) -> str | None:
    """What a verdict depends on, hashed: the flags, the checker's source and the vLLM install in
    the engine venv, known by its dist-info RECORD's size and mtime (every install or upgrade
    rewrites it). None where no vLLM dist-info sits beside `python`: such a verdict is not kept."""
    records = sorted(
        (python.parent.parent / "lib").glob("python3*/site-packages/vllm*.dist-info/RECORD")
    )
    if not records:
        return None
    stamps = [(str(r), st.st_size, st.st_mtime_ns) for r in records for st in [r.stat()]]
    blob = json.dumps(
        [str(python), stamps, CHECKER.read_text(), flags], sort_keys=True, default=str
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _shown(value: object) -> str:
    """A flag's value as YAML reads it: `'lots'`, `true`, `16`, `[1, 2]`."""
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value)
