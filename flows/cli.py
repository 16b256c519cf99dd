"""The `nightshift` command line: one Typer app, each command group in a module of its own.

Every module listed in `COMMAND_MODULES` exposes `register(app)`; heavy imports stay inside the
command functions so that `nightshift --help` answers instantly.
"""

from __future__ import annotations

import importlib

import typer

COMMAND_MODULES: tuple[str, ...] = (
    "flows.cli_engine",
    "flows.cli_plan",
    "flows.cli_warehouse",
    "flows.cli_simulate",
    "flows.cli_corpus",
    "flows.cli_chat_load",
    "flows.cli_calibrate",
    "flows.cli_run",
    "flows.cli_bench",
    "flows.cli_docs",
)

app = typer.Typer(
    name="nightshift",
    help="Nightly long-document batch work on vLLM replicas shared with live chat.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"nightshift {version('nightshift')}")
        except PackageNotFoundError:  # run from a checkout that is not installed
            typer.echo("nightshift (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."
    ),
) -> None:
    """Nightly long-document batch work on vLLM replicas shared with live chat."""


for _name in COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    """The console script. Typer ends a command that Ctrl-C or SIGTERM stopped (both reach it as
    KeyboardInterrupt) with 130; a stop by SIGTERM ends with 143, as a supervisor expects."""
    from pipelines.ray_session import stopped_by_sigterm

    try:
        app()
    except SystemExit as done:
        if done.code == 130 and stopped_by_sigterm():
            raise SystemExit(143) from None
        raise


if __name__ == "__main__":
    main()
