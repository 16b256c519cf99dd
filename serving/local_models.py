"""Small local Llama models: the embedded default engine, built here, never downloaded.

Random weights make the text meaningless, but step timing depends only on the model's shape, and
that is what the controller cares about. A recipe names its shape's entry in the spec table; the
hash of both (with the tokenizer text and this builder's version) names the cache folder, so a
changed recipe or shape is rebuilt and an unchanged one is built once. The build runs in the engine environment, which has torch and transformers:

    .venv-engine/bin/python -m serving.local_models build small
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from scheduler.specs import ModelSpec, model_spec
from serving.paths import REPO_ROOT, SetupError, cache_root

BUILDER_VERSION = 1
TEXT_DIR = REPO_ROOT / "serving" / "model_text"
SPECIAL_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
# Llama-3 style, so prompts look like the production model's and the shared prefix comes first.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True)
class ModelRecipe:
    """How to build one local model. The shape (layers, widths, heads, context) is not repeated
    here: it is the spec table entry `spec` (scheduler/specs/models.yaml), the same numbers the
    planner and the latency model read, so the built model and what they reason about cannot drift
    apart. The recipe adds only what building needs beyond the shape. Changing any of it, or the
    entry's shape, changes the cache folder."""

    spec: str
    """The `scheduler/specs/models.yaml` entry of this model; its `path` is `local:NAME`."""
    vocab_target: int
    """Vocabulary the tokenizer trains for; it learns fewer where the text runs out, and the spec's
    `vocab` is what it reached (with `padded_vocab`, that size)."""
    seed: int = 0
    dtype: str = "bfloat16"
    padded_vocab: int = 0
    """When set, reserved tokens (as Llama 3 has) fill the tokenizer up to this size past what it
    learns from the text. They widen the embedding and the lm_head, which every decode step reads
    in full while a prefill runs it on its prompt's last token only."""

    @property
    def shape(self) -> ModelSpec:
        """The spec entry's shape; an unknown `spec` raises `SpecError` naming the known ones."""
        return model_spec(self.spec)


HASHED_SHAPE = ("layers", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "max_position")
"""The spec fields the built files follow, so the hash takes them. `params` and `vocab` are not
inputs: they are what a build of the rest comes out at."""


RECIPES: dict[str, ModelRecipe] = {
    # Fast to load and step; for tests that need a real engine, not realistic timing.
    "tiny": ModelRecipe(spec="nightshift-tiny", vocab_target=1024),
    # For the demo and benchmarks: on this CPU a 512-token prefill chunk costs about as much as
    # one to two decode steps at a short prefix and several times more deep into a long prompt,
    # the proportions of a 70B model on H100s (README, "The local models").
    "small": ModelRecipe(spec="nightshift-small", vocab_target=2048),
    # For documents of up to ~80k tokens (engine_configs/cpu-long.yaml). What makes a prefill chunk
    # dearer deep into a prompt is attention work (4·layers·heads·head_dim per prefix token) against
    # linear work (2 FLOPs per weight in the layers; the lm_head runs only on a prompt's last
    # token). At a 78k prefix that is 1.5x in 70B and 52x in `small`. So: one layer, one 32-wide
    # head (the CPU attention kernel's smallest), the compute in an MLP as narrow as a 30% band
    # around 70B allows (1.95x). A decode step on H100s is mostly the read of all weights, hidden
    # under a prefill chunk's compute; here it is mostly fixed overhead, which every step pays. A
    # 48k vocabulary (reserved tokens) adds an lm_head read to each step at no prefill FLOPs, and
    # brings a shallow 512-token chunk to ~2 decode steps (docs/results.md, "The `long` stand-in model").
    "long": ModelRecipe(spec="nightshift-long", vocab_target=2048, padded_vocab=49152),
}


class LocalModelMissing(SetupError):
    """A `local:NAME` model that has not been built yet."""


def recipe(name: str) -> ModelRecipe:
    if name not in RECIPES:
        raise SetupError(f"unknown local model {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def hash_fields(r: ModelRecipe) -> dict[str, int | str]:
    """What the hash of `r` is taken over: the shape fields and the recipe's own, flat, by the names
    the recipe had when it held the shape itself, so a folder built then is still found now."""
    fields: dict[str, int | str] = {k: getattr(r.shape, k) for k in HASHED_SHAPE}
    fields.update(vocab_target=r.vocab_target, seed=r.seed, dtype=r.dtype)
    if r.padded_vocab:  # recipes from before the field keep their hash, and their build
        fields["padded_vocab"] = r.padded_vocab
    return fields


def recipe_hash(name: str) -> str:
    """Hash of everything that determines the built files."""
    h = hashlib.sha256(json.dumps(hash_fields(recipe(name)), sort_keys=True).encode())
    h.update(f"builder-{BUILDER_VERSION}".encode())
    for path in sorted(TEXT_DIR.glob("*.txt")):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


def model_dir(name: str) -> Path:
    return cache_root() / "models" / f"{name}-{recipe_hash(name)}"


def resolve(name: str) -> Path:
    """The built folder of local model `name`, or an error that gives the command to build it."""
    path = model_dir(name)
    if not (path / "config.json").exists():
        raise LocalModelMissing(
            f"local model {name!r} is not built (expected {path}); build it with "
            f"`nightshift model build {name}` or `make models`"
        )
    return path


def build(name: str, force: bool = False) -> Path:
    """Build local model `name` into the cache unless an identical build is already there."""
    target = model_dir(name)
    if (target / "config.json").exists() and not force:
        return target
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tokenizer = _train_tokenizer(recipe(name))
    tokenizer.save_pretrained(staging)
    _write_model(recipe(name), len(tokenizer), staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)  # atomic: a half-built model is never mistaken for a built one
    return target


def _train_tokenizer(r: ModelRecipe):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=r.vocab_target,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(p) for p in sorted(TEXT_DIR.glob("*.txt"))], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|end_of_text|>",
        model_max_length=r.shape.max_position,
    )
    fast.chat_template = CHAT_TEMPLATE
    reserved = r.padded_vocab - len(fast)
    if reserved > 0:
        fast.add_tokens([f"<|reserved_{i}|>" for i in range(reserved)])
    return fast


def _write_model(r: ModelRecipe, vocab_size: int, out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(r.seed)
    shape = r.shape
    config = LlamaConfig(
        vocab_size=-(-vocab_size // 64) * 64,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=4,
        pad_token_id=1,
        torch_dtype=r.dtype,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, r.dtype))
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.local_models")
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build local models into the cache")
    b.add_argument("names", nargs="+", choices=sorted(RECIPES))
    b.add_argument("--force", action="store_true", help="rebuild even if an identical build exists")
    args = parser.parse_args(argv)
    for name in args.names:
        print(f"{name}: {build(name, force=args.force)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
