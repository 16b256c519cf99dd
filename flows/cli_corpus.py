"""`nightshift corpus make` and `nightshift corpus check`: the sample corpus and a corpus's health.

`make` writes a deterministic sample corpus measured in the served model's tokens; `check` reads any
corpus the way a run will and prints what the run would do with each document, so a bad file is
found before the night starts rather than during it.
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipelines.corpus_maker import CorpusSpec, SampleDoc
    from serving.tokenizer import Tokenizer

corpus_app = typer.Typer(
    help="Make a sample corpus, or check a corpus before a run.", no_args_is_help=True
)

EngineConfigOption = Annotated[
    Path,
    typer.Option(help="Engine config of the served model, whose tokenizer measures the documents."),
]
ReplicaUrlOption = Annotated[
    str | None,
    typer.Option(
        help="A running replica to tokenize with when the model's files are not on this machine."
    ),
]
DEFAULT_ENGINE_CONFIG = Path("engine_configs/cpu-small.yaml")


def register(app: typer.Typer) -> None:
    app.add_typer(corpus_app, name="corpus")


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print `message` to stderr and return the Exit to raise."""
    typer.secho(message, err=True, fg="red")
    return typer.Exit(code)


@corpus_app.command("make")
def make(
    out: Annotated[Path, typer.Option(help="File to write: .parquet, .jsonl or .jsonl.gz.")],
    docs: Annotated[int, typer.Option(help="Number of documents.")] = 100,
    min_tokens: Annotated[int, typer.Option(help="Shortest document, in tokens.")] = 8_000,
    max_tokens: Annotated[int, typer.Option(help="Longest document, in tokens.")] = 80_000,
    seed: Annotated[int, typer.Option(help="The same seed writes the same corpus.")] = 0,
    engine_config: EngineConfigOption = DEFAULT_ENGINE_CONFIG,
    replica_url: ReplicaUrlOption = None,
) -> None:
    """Write a sample corpus of long documents, log-uniform in length between the two limits."""
    import time

    from pipelines.corpus import CorpusError, corpus_format
    from pipelines.corpus_maker import CorpusSpec, make_corpus, write_corpus

    spec = CorpusSpec(docs=docs, min_tokens=min_tokens, max_tokens=max_tokens, seed=seed)
    try:
        spec.validate()
        fmt = corpus_format(out)
    except (ValueError, CorpusError) as exc:
        raise fail(f"error: {_as_option(str(exc))}") from None
    tokenizer = _tokenizer_or_exit(engine_config, replica_url)
    started = time.perf_counter()
    made = _with_progress(spec, lambda on_doc: make_corpus(spec, tokenizer, on_doc=on_doc))
    try:
        write_corpus(made, out)
    except OSError as exc:
        raise fail(f"error: could not write {out} ({exc}): choose a writable --out path") from None
    seconds = time.perf_counter() - started
    typer.echo(
        f"wrote {len(made)} documents to {out} ({fmt}, {out.stat().st_size / 1e6:.1f} MB) "
        f"in {seconds:.1f} s"
    )
    typer.echo(f"tokens: {distribution([d.tokens for d in made])}")
    kinds = Counter(d.meta["kind"] for d in made)
    typer.echo("kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))


@corpus_app.command("check")
def check(
    path: Annotated[Path, typer.Argument(help="Corpus file: .parquet, .jsonl or .jsonl.gz.")],
    max_doc_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Longest document a run accepts, in tokens; longer ones are failed. No limit "
            "when not given.",
        ),
    ] = None,
    engine_config: EngineConfigOption = DEFAULT_ENGINE_CONFIG,
    replica_url: ReplicaUrlOption = None,
    show: Annotated[int, typer.Option(min=0, help="List at most this many problems.")] = 50,
    strict: Annotated[
        bool, typer.Option("--strict", help="Exit with status 1 when any document has a problem.")
    ] = False,
) -> None:
    """Read a corpus as a run would: counts, token lengths, and each document's problem."""
    from pipelines.corpus import CorpusError, classify, count_tokens, read_corpus

    try:
        table = read_corpus(path)
    except CorpusError as exc:
        raise fail(f"error: {exc}") from None
    tokenizer = _tokenizer_or_exit(engine_config, replica_url)
    counts = count_tokens(table, tokenizer)
    verdicts = classify(table, max_doc_tokens, counts)
    _print_check(path, table.column("doc_id").to_pylist(), counts, verdicts, max_doc_tokens, show)
    if strict and any(v is not None for v in verdicts):
        raise typer.Exit(1)


def distribution(tokens: list[int]) -> str:
    """min / median / max / total of token counts, for one line of output."""
    if not tokens:
        return "none"
    ordered = sorted(tokens)
    median = round(statistics.median(ordered))
    plural = "s" if len(ordered) != 1 else ""
    return (
        f"min {ordered[0]:,}, median {median:,}, max {ordered[-1]:,}, "
        f"total {sum(ordered):,} over {len(ordered):,} document{plural}"
    )


def _print_check(
    path: Path,
    doc_ids: list[str],
    counts: list[int | None],
    verdicts: list,
    limit: int | None,
    show: int,
) -> None:
    statuses = Counter("ok" if v is None else v.status for v in verdicts)
    typer.echo(
        f"corpus {path}: {len(verdicts):,} documents: ok {statuses['ok']:,}, "
        f"failed {statuses['failed']:,}, skipped {statuses['skipped']:,}"
    )
    ok_tokens = [c for c, v in zip(counts, verdicts, strict=True) if v is None and c is not None]
    typer.echo(f"tokens (ok documents): {distribution(ok_tokens)}")
    if limit is None:
        typer.echo("over-long documents not checked: pass --max-doc-tokens to check them")
    problems = [(row, v) for row, v in enumerate(verdicts) if v is not None]
    for row, v in problems[:show]:
        typer.echo(f"  row {row}  {doc_ids[row]}  {v.status}: {v.reason}")
    if len(problems) > show:
        typer.echo(f"  ... and {len(problems) - show:,} more (raise --show to list them)")


def _tokenizer_or_exit(config_path: Path, replica_url: str | None) -> Tokenizer:
    from serving.engine_config import EngineConfigError, load_engine_config
    from serving.paths import REPO_ROOT, SetupError
    from serving.tokenizer import tokenizer_for

    # The default is relative to the repository, so the command also works from elsewhere.
    if not config_path.exists() and not config_path.is_absolute():
        config_path = REPO_ROOT / config_path if (REPO_ROOT / config_path).exists() else config_path
    try:
        return tokenizer_for(load_engine_config(config_path), replica_url)
    except (EngineConfigError, SetupError, FileNotFoundError) as exc:
        raise fail(f"error: {exc}") from None


def _with_progress(
    spec: CorpusSpec, run: Callable[[Callable[[SampleDoc], None]], list[SampleDoc]]
) -> list[SampleDoc]:
    """Run `run(on_doc)` under a progress bar on stderr, counted in tokens."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from pipelines.corpus_maker import target_lengths

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} / {task.total:,.0f} tokens"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("making documents", total=sum(target_lengths(spec)))
        return run(lambda doc: progress.advance(task, doc.meta["target_tokens"]))


def _as_option(message: str) -> str:
    """Spec field names as the command line spells them."""
    for field in ("min_tokens", "max_tokens", "docs"):
        message = message.replace(field, "--" + field.replace("_", "-"))
    return message
