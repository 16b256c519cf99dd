"""Step times of a Llama-shaped transformer on one GPU, for a step-time fit where vLLM cannot run.

A GPU lent for a few minutes, with no registry to install vLLM's GPU build from, can still say
what the plug-in's sizing needs to know about it: how long a step takes with B decodes at context L
beside a prefill chunk of C tokens at prefix p. This script builds random bf16 weights of a model's
shape (Llama-3.1-8B by default: nothing is downloaded), runs one step of each composition in a grid
as a CUDA graph (vLLM replays graphs for its steps too, so launch overhead is not what is timed),
and writes one JSON line per step in the format of `engine_configs/fits/*.samples.jsonl`, which
`python -m bench.gpu_fit` fits with the same least squares that calibrates a CPU replica.

What the step holds, per layer: RMSNorm, the fused QKV projection, the new tokens' K/V written into
the cache, attention (the decodes over their contexts, the chunk causally over its prefix and
itself, grouped-query heads as the model has them), the output projection, RMSNorm, the gated MLP;
then the final norm and the LM head for one row per sequence, as an engine samples only those.
Rotary embeddings and sampling are left out: elementwise work well under 1% of a step. One KV
cache is shared by all layers: every layer reads and writes as much as it would with its own.

Needs torch only (it runs under the GPU image's python3), so it imports nothing of nightshift.
`--device cpu --small` runs the same code on a toy shape without graphs, as a check that it works.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """The dimensions a step's cost depends on (a model's config.json fields)."""

    layers: int = 32
    hidden: int = 4096
    intermediate: int = 14336
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 128256


LLAMA_8B = Shape()
TOY = Shape(layers=2, hidden=256, intermediate=512, heads=4, kv_heads=2, head_dim=64, vocab=1000)


@dataclass(frozen=True)
class Step:
    """One composition: `decodes` sequences at `context` tokens each, one chunk of `chunk` tokens
    at prefix `prefix` (chunk 0: no prefill)."""

    decodes: int = 0
    context: int = 0
    chunk: int = 0
    prefix: int = 0

    def sample(self, seconds: float) -> dict:
        """The step as a line of a fit's samples file."""
        return {
            "prefills": [[self.chunk, self.prefix]] if self.chunk else [],
            "decode_seqs": self.decodes,
            "decode_context_tokens": self.decodes * self.context,
            "seconds": seconds,
            "stalled": False,
        }


def grid(max_prefix: int, max_context: int) -> list[Step]:
    """Decode-only, prefill-only and mixed steps spanning what the plug-in sizes between: chunks
    from 16 to 8k tokens at prefixes up to `max_prefix`, beside 0 to 128 decodes."""
    prefixes = sorted({0, max_prefix // 5, max_prefix // 2, max_prefix})
    steps = [Step(b, ctx) for b in (1, 8, 32, 64, 128) for ctx in (max_context // 8, max_context)]
    steps += [
        Step(chunk=c, prefix=p) for c in (16, 64, 256, 1024, 2048, 4096, 8192) for p in prefixes
    ]
    steps += [
        Step(b, max_context // 2, c, p) for b in (16, 64) for c in (64, 512, 2048) for p in prefixes
    ]
    return steps


class Model:
    """Random weights of `shape` and a step function over a shared KV cache."""

    def __init__(
        self,
        shape: Shape,
        device: str,
        dtype: torch.dtype,
        max_prefix: int,
        max_batch: int,
        max_context: int,
    ):
        self.s = shape
        self.device = device
        g = torch.Generator(device=device).manual_seed(0)

        def w(*dims: int) -> torch.Tensor:
            return (torch.randn(*dims, generator=g, device=device, dtype=dtype) * 0.02).contiguous()

        s = shape
        qkv_out = (s.heads + 2 * s.kv_heads) * s.head_dim
        self.layers = [
            {
                "norm1": torch.ones(s.hidden, device=device, dtype=dtype),
                "qkv": w(s.hidden, qkv_out),
                "o": w(s.heads * s.head_dim, s.hidden),
                "norm2": torch.ones(s.hidden, device=device, dtype=dtype),
                "gate_up": w(s.hidden, 2 * s.intermediate),
                "down": w(s.intermediate, s.hidden),
            }
            for _ in range(s.layers)
        ]
        self.final_norm = torch.ones(s.hidden, device=device, dtype=dtype)
        self.lm_head = w(s.hidden, s.vocab)
        self.prefill_k = w(1, s.kv_heads, max_prefix, s.head_dim)
        self.prefill_v = w(1, s.kv_heads, max_prefix, s.head_dim)
        self.decode_k = w(max_batch, s.kv_heads, max_context + 1, s.head_dim)
        self.decode_v = w(max_batch, s.kv_heads, max_context + 1, s.head_dim)

    def step(self, x: torch.Tensor, step: Step) -> torch.Tensor:
        """One engine step over `x`: [decodes + chunk, hidden] hidden states in, next tokens out."""
        s = self.s
        b, c = step.decodes, step.chunk
        group = s.heads // s.kv_heads
        for layer in self.layers:
            h = F.rms_norm(x, (s.hidden,), layer["norm1"])
            qkv = h @ layer["qkv"]
            q, k, v = qkv.split(
                [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
            )
            outs = []
            if b:
                # Each decode's one query per head, grouped under its KV head: [B, kv, group, d].
                qd = q[:b].view(b, s.kv_heads, group, s.head_dim)
                end = step.context + 1
                self.decode_k[:b, :, step.context] = k[:b].reshape(b, s.kv_heads, s.head_dim)
                self.decode_v[:b, :, step.context] = v[:b].reshape(b, s.kv_heads, s.head_dim)
                od = F.scaled_dot_product_attention(
                    qd, self.decode_k[:b, :, :end], self.decode_v[:b, :, :end]
                )
                outs.append(od.reshape(b, s.heads * s.head_dim))
            if c:
                p = step.prefix
                self.prefill_k[0, :, p : p + c] = (
                    k[b:].reshape(c, s.kv_heads, s.head_dim).transpose(0, 1)
                )
                self.prefill_v[0, :, p : p + c] = (
                    v[b:].reshape(c, s.kv_heads, s.head_dim).transpose(0, 1)
                )
                qp = q[b:].view(1, c, s.heads, s.head_dim).transpose(1, 2)
                op = _causal_attention(
                    qp, self.prefill_k[:, :, : p + c], self.prefill_v[:, :, : p + c]
                )
                outs.append(op.transpose(1, 2).reshape(c, s.heads * s.head_dim))
            x = x + torch.cat(outs) @ layer["o"]
            h = F.rms_norm(x, (s.hidden,), layer["norm2"])
            gate, up = (h @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (F.silu(gate) * up) @ layer["down"]
        last = torch.cat((x[:b], x[b + c - 1 : b + c])) if c else x[:b]
        logits = F.rms_norm(last, (s.hidden,), self.final_norm) @ self.lm_head
        return logits.argmax(dim=-1)


EXPAND_KV = False
"""Set when the grouped-query call fails its check: K/V are then copied to every query head, which
costs memory traffic an engine does not pay (meta.json says so)."""


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """A chunk's queries (the last q.shape[2] positions) over all of k/v, causal from the bottom
    right, grouped-query heads without copying K/V."""
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(q.shape[2], k.shape[2])
    if EXPAND_KV:
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def check_attention(device: str, dtype: torch.dtype) -> float:
    """Max error of the attention call against an explicit reference, so a wrong mask or head
    grouping is caught rather than timed."""
    g = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(1, 8, 5, 64, generator=g, device=device, dtype=dtype)
    k = torch.randn(1, 2, 12, 64, generator=g, device=device, dtype=dtype)
    v = torch.randn(1, 2, 12, 64, generator=g, device=device, dtype=dtype)
    got = _causal_attention(q, k, v).float()
    kk, vv = k.repeat_interleave(4, dim=1).float(), v.repeat_interleave(4, dim=1).float()
    scores = q.float() @ kk.transpose(-1, -2) / 8.0
    allowed = torch.ones(5, 12, dtype=torch.bool, device=device).tril(12 - 5)
    want = scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ vv
    return (got - want).abs().max().item()


def time_step(model: Model, step: Step, graphs: bool, replays: int) -> float:
    """Median seconds of `replays` runs of `step` (CUDA-graph replays on a GPU)."""
    x = (
        torch.randn(
            step.decodes + step.chunk,
            model.s.hidden,
            device=model.device,
            dtype=model.prefill_k.dtype,
        )
        * 0.02
    )
    if not graphs:
        model.step(x, step)
        times = []
        for _ in range(replays):
            t0 = time.perf_counter()
            model.step(x, step)
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model.step(x, step)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model.step(x, step)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    del graph
    torch.cuda.empty_cache()
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--out", type=Path, required=True, help="folder for samples.jsonl and meta.json"
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a toy shape and grid: checks the script")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument(
        "--steps",
        type=Path,
        help="JSON lines of {decodes, context, chunk, prefix} to time instead of the grid "
        "(`python -m bench.gpu_sizing plan` writes the steps the plug-in's sizing picks)",
    )
    args = ap.parse_args(argv)

    small = args.small
    shape = TOY if small else LLAMA_8B
    max_prefix, max_context = (1000, 256) if small else (78_000, 8192)
    if args.steps:
        steps = [
            Step(**json.loads(line)) for line in args.steps.read_text().splitlines() if line.strip()
        ]
        max_prefix = max(st.prefix for st in steps)
        max_context = max(max_context, max(st.context for st in steps))
    else:
        steps = grid(max_prefix, max_context)
    if small:
        steps = [Step(st.decodes, st.context, min(st.chunk, 256), st.prefix) for st in steps]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    graphs = args.device == "cuda"
    global EXPAND_KV
    try:
        error = check_attention(args.device, dtype)
    except RuntimeError as exc:
        print(f"grouped-query attention failed ({exc}); expanding K/V", flush=True)
        error = float("inf")
    if error > 0.05:
        EXPAND_KV = True
        error = check_attention(args.device, dtype)
        if error > 0.05:
            raise SystemExit(f"attention check failed: max error {error:.3f}")
    largest_chunk = max(st.chunk for st in steps)
    model = Model(shape, args.device, dtype, max_prefix + largest_chunk, 128, max_context)
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "shape": asdict(shape),
        "dtype": str(dtype),
        "device": torch.cuda.get_device_name() if graphs else "cpu",
        "torch": torch.__version__,
        "cuda_graphs": graphs,
        "kv_expanded": EXPAND_KV,
        "attention_check_max_error": error,
        "replays": args.replays,
        "statistic": "median",
    }
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    with (args.out / "samples.jsonl").open("w") as f:
        for step in steps:
            with torch.no_grad():
                seconds = time_step(model, step, graphs, args.replays)
            f.write(json.dumps(step.sample(seconds)) + "\n")
            f.flush()
            print(
                f"B={step.decodes:<4} L={step.context:<6} C={step.chunk:<5} p={step.prefix:<6} {1000 * seconds:9.3f} ms",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
