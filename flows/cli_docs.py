"""`nightshift docs configuration`: the configuration reference, rendered from the models themselves.

Every setting an operator can write (engine config YAML, pipeline settings, the SLO, the
controller's tuning) is a pydantic model whose fields carry their type, default and description.
`docs/configuration.md` is rendered from those fields, so it says what the code accepts; `--check`
fails when the committed file no longer matches, e.g. after a field was added.
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import typer

DEFAULT_OUT = Path("docs/configuration.md")
REGENERATE = "nightshift docs configuration --out docs/configuration.md"

docs_app = typer.Typer(
    help="Reference documents rendered from the code, so they cannot drift from it.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.add_typer(docs_app, name="docs")


@dataclass(frozen=True)
class Topic:
    """One top-level settings model and where its values are written."""

    title: str
    model: type
    where: str


def topics() -> list[Topic]:
    """The models the reference covers, in the order it lists them."""
    from pipelines.config import PipelineConfig
    from scheduler.budget_controller import BudgetControllerConfig
    from scheduler.slo import SLO
    from serving.engine_config import EngineConfig

    return [
        Topic(
            "Engine config",
            EngineConfig,
            "One YAML file per replica class under `engine_configs/`, read by `nightshift engine "
            "up`, `run`, `simulate`, `bench`, `calibrate` and `plan`. `vllm` takes the engine's own "
            "flags in dash form without leading dashes, as `vllm serve --config` does (booleans "
            "become `--x` / `--no-x`; `model`, `port`, `host` and `served-model-name` are the "
            "launcher's). Unknown keys and wrong types fail with the file and the key.",
        ),
        Topic(
            "Pipeline settings",
            PipelineConfig,
            "How a run splits and summarizes documents (`JobSpec.pipeline`, or the flow's "
            "`pipeline` parameter); `nightshift run` derives them from the engine config "
            "(`max_model_len` from `max-model-len`, `ignore_eos` for the local models).",
        ),
        Topic(
            "Chat SLO",
            SLO,
            "The chat latency targets a run defends (`nightshift run --itl-slo-ms/--ttft-slo-ms/"
            "--e2e-slo-ms`, or the flow's `slo` parameter).",
        ),
        Topic(
            "Controller tuning",
            BudgetControllerConfig,
            "The SLO controller's operator settings: the `controller:` section of an engine "
            "config, or `JobSpec.controller` for one run.",
        ),
    ]


def _is_model(tp: object) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _nested_models(tp: object) -> list[type]:
    """Models that a field's type refers to (directly, in a union or a container)."""
    if _is_model(tp):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _nested_models(arg)]


def sections() -> list[tuple[Topic, str, type]]:
    """Every model to document: each topic's model, then the models nested in it, each once,
    with the dotted key path it is written under (`model.architecture`). A model that is a topic
    of its own (the controller's tuning inside an engine config) is listed under that topic."""
    chosen = topics()
    tops = {t.model for t in chosen}
    seen: set[type] = set()
    out: list[tuple[Topic, str, type]] = []

    def visit(topic: Topic, path: str, model: type) -> None:
        if model in seen or (path and model in tops):  # a topic of its own is listed there
            return
        seen.add(model)
        out.append((topic, path, model))
        for name, field in model.model_fields.items():
            for nested in _nested_models(field.annotation):
                visit(topic, f"{path}.{name}" if path else name, nested)

    for topic in chosen:
        visit(topic, "", topic.model)
    return out


def type_name(tp: object) -> str:
    """A field type as a reader writes it: `int`, `str | None`, `"auto" | "whole"`."""
    if tp is type(None):
        return "None"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_name(a) for a in args)}]"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp)


_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def constraints(field) -> str:
    """The field's numeric bounds, e.g. `> 0, < 1`."""
    out = []
    for meta in field.metadata:
        for attr, symbol in _BOUNDS:
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{symbol} {value}")
    return ", ".join(out)


def default_text(field) -> str:
    """The default as it would be written, or `required`."""
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        from pydantic import BaseModel

        value = field.default_factory()
        if isinstance(value, BaseModel):
            return "its section's defaults"
        return f"`{value!r}`"
    return f"`{field.default!r}`"


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _first_paragraph(doc: str | None) -> str:
    return _one_line((doc or "").strip().split("\n\n")[0])


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def description(field) -> str:
    """The field's description, or for a nested section without one, its model's docstring."""
    if field.description:
        return _one_line(field.description)
    nested = _nested_models(field.annotation)
    if nested:
        return f"{_first_paragraph(nested[0].__doc__)} (section below)"
    return ""


def render_model(path: str, model: type) -> str:
    """One model's table: name, type, default and description of every field."""
    qualified = f"{model.__module__}.{model.__qualname__}"
    heading = f"`{path}`" if path else "top level"
    lines = [
        f"### {heading} (`{qualified}`)",
        "",
        _first_paragraph(model.__doc__),
        "",
        "| field | type | default | description |",
        "|---|---|---|---|",
    ]
    for name, field in model.model_fields.items():
        kind = type_name(field.annotation)
        bounds = constraints(field)
        kind_cell = f"`{_cell(kind)}`" + (f", {bounds}" if bounds else "")
        lines.append(
            f"| `{name}` | {kind_cell} | {_cell(default_text(field))} | "
            f"{_cell(description(field))} |"
        )
    return "\n".join(lines)


def render_configuration() -> str:
    """The whole of `docs/configuration.md`."""
    parts = [
        "# Configuration reference",
        "",
        "Every setting nightshift reads, with its type, default and meaning. This file is "
        "rendered from the settings models in the code; to change it, change the field in the "
        f"code and run `{REGENERATE}` (`--check` says whether the file is current).",
        "",
        "Types are Python's: `X | None` may be left out or null; bounds such as `> 0` are "
        "checked when the file or object is read, and a value outside them fails with the key "
        "named.",
    ]
    current = None
    for topic, path, model in sections():
        if topic is not current:
            current = topic
            parts += ["", f"## {topic.title}", "", topic.where]
        parts += ["", render_model(path, model)]
    return "\n".join(parts) + "\n"


@docs_app.command("configuration")
def configuration(
    out: Path = typer.Option(None, "--out", help="Write the reference here (default: print it)."),
    check: bool = typer.Option(
        False,
        "--check",
        help=f"Exit 1 when the file (default {DEFAULT_OUT}) differs from what the code renders.",
    ),
) -> None:
    """Render every configuration field (name, type, default, description) from the models."""
    text = render_configuration()
    if check:
        path = out or DEFAULT_OUT
        current = path.read_text() if path.is_file() else None
        if current != text:
            typer.secho(
                f"{path} is stale: it does not match the settings models; run `{REGENERATE}`",
                err=True,
                fg="red",
            )
            raise typer.Exit(1)
        typer.echo(f"{path} is current")
        return
    if out is None:
        typer.echo(text, nl=False)
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    typer.echo(f"wrote {out}")
