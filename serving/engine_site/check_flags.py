"""Check engine flags with vLLM's own command-line parser, in the engine's interpreter.

Run as `<engine python> check_flags.py` with a JSON object on stdin, `{"configs": [[[KEY, ARGV],
...], ...]}` (one list per engine config; ARGV is the rendered command line of one of its keys),
and it prints a JSON list on stdout, one verdict per config, in order:

    {"ok": bool, "vllm_version": "...", "flags": [valid flag names, dash form],
     "problems": [{"key": KEY or null, "kind": "unknown" | "value" | "combination",
                   "argv": [...], "message": vLLM's own message}]}

It builds the parser the API server builds (`make_arg_parser` on a `FlexibleArgumentParser`) and
parses each key's flags on their own, so every bad key is reported, not only the first, then all of
them together. Parsing only converts strings: nothing is started, no model is read, no device is
touched, and a class named by a flag such as `scheduler-cls` is not imported.

vLLM's imports log to stdout; the verdict goes to the original stdout and everything else to
stderr, so the caller reads exactly one JSON document. Importing vLLM and building its parser is
the whole cost of a check (seconds), so one run checks as many configs as it is given.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


class ParseFailed(Exception):
    """What the parser would have printed before exiting."""


def build_parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(
        FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server.")
    )

    def error(message: str):
        raise ParseFailed(message)

    def exit_(status: int = 0, message: str | None = None):
        raise ParseFailed(message or f"the parser exited with status {status}")

    parser.error = error  # type: ignore[method-assign]
    parser.exit = exit_  # type: ignore[method-assign]
    return parser


def flag_names(parser: argparse.ArgumentParser) -> list[str]:
    """Every long option, dash form without leading dashes; the `--no-` twin of a boolean flag is
    left out, since a config writes `key: false` for it."""
    names: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        negatives = (
            {f"--no-{s[2:]}" for s in action.option_strings}
            if isinstance(action, argparse.BooleanOptionalAction)
            else set()
        )
        names.update(
            s[2:] for s in action.option_strings if s.startswith("--") and s not in negatives
        )
    return sorted(names)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """vLLM's message when it rejects `argv`, None when it accepts it."""
    try:
        args = parser.parse_args(argv)
    except ParseFailed as exc:
        return str(exc).strip()
    except Exception as exc:  # a type converter that raises something argparse does not catch
        return f"{type(exc).__name__}: {exc}"
    if (stray := getattr(args, "model_tag", None)) is not None:
        # A value no flag takes lands in the optional positional, which the API server ignores.
        return f"{stray!r} is left over, a value no flag takes; vLLM would read it as the model tag"
    return None


def is_known(parser: argparse.ArgumentParser, option: str) -> bool:
    """Whether `option` (e.g. `--max-num-seqs`, `--compilation-config.mode`) is the parser's own
    option string, not a guess, an abbreviation or a typo."""
    return option.split("=", 1)[0].split(".", 1)[0] in parser._option_string_actions


def check(parser: argparse.ArgumentParser, flags: list[tuple[str, list[str]]]) -> list[dict]:
    problems: list[dict] = []
    for key, argv in flags:
        message = parse(parser, argv)
        if message is None:
            continue
        kind = "unknown" if argv and not is_known(parser, argv[0]) else "value"
        problems.append({"key": key, "kind": kind, "argv": argv, "message": message})
    if not problems:
        everything = [arg for _, argv in flags for arg in argv]
        if (message := parse(parser, everything)) is not None:
            problems.append(
                {"key": None, "kind": "combination", "argv": everything, "message": message}
            )
    return problems


def main() -> int:
    verdict_out = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    request = json.load(sys.stdin)
    configs = [
        [(str(key), [str(a) for a in argv]) for key, argv in flags] for flags in request["configs"]
    ]

    import vllm

    parser = build_parser()
    names = flag_names(parser)
    verdicts = []
    for flags in configs:
        problems = check(parser, flags)
        verdicts.append(
            {
                "ok": not problems,
                "vllm_version": getattr(vllm, "__version__", "unknown"),
                "flags": names,
                "problems": problems,
            }
        )
    json.dump(verdicts, verdict_out)
    verdict_out.write("\n")
    verdict_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
