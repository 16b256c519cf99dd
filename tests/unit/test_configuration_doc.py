"""docs/configuration.md is what `nightshift docs configuration` renders from the settings models."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel
from typer.testing import CliRunner

from flows.cli import app
from flows.cli_docs import REGENERATE, render_configuration
from pipelines.config import PipelineConfig
from scheduler.budget_controller import BudgetControllerConfig
from scheduler.slo import SLO
from serving.engine_config import EngineConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
TOP_LEVEL = (EngineConfig, PipelineConfig, SLO, BudgetControllerConfig)


def models_and_nested(models) -> list[type[BaseModel]]:
    """The models and every model their fields refer to, found independently of the renderer."""
    found: list[type[BaseModel]] = []

    def refs(tp):
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            yield tp
        for arg in getattr(tp, "__args__", ()):
            yield from refs(arg)

    def visit(model):
        if model in found:
            return
        found.append(model)
        for field in model.model_fields.values():
            for nested in refs(field.annotation):
                visit(nested)

    for model in models:
        visit(model)
    return found


def section_of(text: str, model: type) -> str:
    """The part of the document from the model's heading to the next heading."""
    marker = f"(`{model.__module__}.{model.__qualname__}`)"
    lines = text.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.startswith("#") and marker in line), None
    )
    assert start is not None, f"docs/configuration.md has no section for {marker}"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    return "\n".join(lines[start:end])


def test_committed_reference_is_what_the_models_render():
    assert DOC.is_file(), f"{DOC} is missing: run `{REGENERATE}`"
    assert DOC.read_text() == render_configuration(), (
        f"docs/configuration.md is stale (a settings field was added, removed or changed): "
        f"run `{REGENERATE}` and commit the result"
    )


def test_every_field_of_every_settings_model_has_a_row():
    text = DOC.read_text()
    models = models_and_nested(TOP_LEVEL)
    assert len(models) >= 7  # the four top-level models and EngineConfig's nested sections
    for model in models:
        section = section_of(text, model)
        for name in model.model_fields:
            assert f"| `{name}` |" in section, (
                f"{model.__qualname__}.{name} is not in docs/configuration.md: run `{REGENERATE}`"
            )


def test_rows_carry_type_default_and_description():
    section = section_of(render_configuration(), BudgetControllerConfig)
    assert "| `cut_factor` | `float`, > 0, < 1 | `0.7` | Most of the target a cut keeps. |" in (
        section
    )
    assert "| `name` | `str` | required |" in section_of(render_configuration(), EngineConfig)


def test_check_fails_naming_a_stale_file_and_passes_a_current_one(tmp_path):
    runner = CliRunner()
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    result = runner.invoke(app, ["docs", "configuration", "--out", str(stale), "--check"])
    assert result.exit_code == 1
    assert str(stale) in result.output and "nightshift docs configuration" in result.output

    fresh = tmp_path / "fresh.md"
    assert runner.invoke(app, ["docs", "configuration", "--out", str(fresh)]).exit_code == 0
    result = runner.invoke(app, ["docs", "configuration", "--out", str(fresh), "--check"])
    assert result.exit_code == 0, result.output
    assert fresh.read_text() == render_configuration()


def test_check_of_a_missing_file_fails(tmp_path):
    missing = tmp_path / "nope.md"
    result = CliRunner().invoke(app, ["docs", "configuration", "--out", str(missing), "--check"])
    assert result.exit_code == 1
    assert str(missing) in result.output
