"""The shipped prefect.yaml names parameters the flow has, and files the repository holds."""

import inspect
from pathlib import Path

import yaml

from flows.nightly import nightly_summarization
from serving.engine_config import load_engine_config
from serving.replica_targets import configured_fit

REPO = Path(__file__).resolve().parents[2]


def test_prefect_yaml_parameters_exist_and_the_config_steers_as_shipped() -> None:
    doc = yaml.safe_load((REPO / "prefect.yaml").read_text())
    assert any(key.endswith(".set_working_directory") for step in doc["pull"] for key in step)
    (deployment,) = doc["deployments"]
    params = deployment["parameters"]
    flow_params = inspect.signature(nightly_summarization.fn).parameters
    assert set(params) <= set(flow_params), set(params) - set(flow_params)
    assert "api_key" not in str(params).lower()
    config_path = REPO / params["engine_config"]
    config = load_engine_config(config_path)
    assert "latency_model" not in params and configured_fit(config_path, config) is not None
    module, _, name = deployment["entrypoint"].partition(":")
    assert (REPO / module).is_file() and name == nightly_summarization.fn.__name__


def test_a_passed_deadline_stops_granting_at_once_and_lets_requests_finish() -> None:
    import threading
    import time

    from pipelines.job import _stop_at_deadline

    calls = []

    class Stop:
        def remote(self, reason, abort):
            calls.append((reason, abort))

    class Gate:
        stop = Stop()

    stopping = threading.Event()
    timer = _stop_at_deadline(Gate(), time.time() - 60, stopping)
    timer.join(timeout=5)
    assert len(calls) == 1 and calls[0][0].startswith("deadline ") and calls[0][1] is False
    assert stopping.is_set()  # the driver stops waiting for documents never started
    assert _stop_at_deadline(Gate(), None, stopping) is None
