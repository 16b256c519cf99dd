"""`bench/gpu_steps.py` runs where vLLM cannot (a GPU image with torch only), so its output is
checked here on the CPU, on a toy shape: a wrong attention mask or a samples format the fit no
longer reads would otherwise surface only on a lent GPU, minutes of which are all there is."""

import subprocess

from serving.calibration import refit
from serving.paths import REPO_ROOT, engine_python
from serving.step_samples import read_samples


def test_toy_steps_are_timed_and_fit_like_a_calibration(tmp_path):
    subprocess.run(
        [
            str(engine_python()),
            str(REPO_ROOT / "bench" / "gpu_steps.py"),
            "--device",
            "cpu",
            "--small",
            "--replays",
            "1",
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    samples = read_samples(tmp_path / "samples.jsonl")
    assert len(samples) == 62
    deep = [s for s in samples if s.batch.prefills and s.batch.prefills[0].prefix_tokens > 0]
    mixed = [s for s in samples if s.batch.prefills and s.batch.decode_seqs]
    assert deep and mixed and all(s.seconds > 0 for s in samples)
    assert refit(tmp_path / "samples.jsonl").report.samples >= 31
