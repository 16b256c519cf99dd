import math

import pytest

from serving.metrics import (
    Histogram,
    histogram_delta,
    histogram_quantile,
    parse_metrics,
    select_families,
)


@pytest.fixture(scope="module")
def before(data_dir):
    return parse_metrics((data_dir / "vllm_metrics_before.txt").read_text())


@pytest.fixture(scope="module")
def after(data_dir):
    return parse_metrics((data_dir / "vllm_metrics_after.txt").read_text())


def test_counters_and_gauges_from_recorded_vllm_text(after) -> None:
    assert after.counter("vllm:num_preemptions") == 0.0
    assert after.counter("vllm:num_preemptions_total") == 0.0
    assert after.gauge("vllm:kv_cache_usage_perc") == 0.0
    assert after.gauge("vllm:num_requests_running", model_name="nightshift-tiny") == 0.0
    assert after.gauge("vllm:no_such_metric") is None


def test_histogram_delta_counts_the_streamed_gaps(before, after) -> None:
    # The recording streamed 3 requests of 20 tokens each: 19 gaps apiece.
    delta = histogram_delta(
        after.histogram("vllm:inter_token_latency_seconds"),
        before.histogram("vllm:inter_token_latency_seconds"),
    )
    assert delta.count == 57
    assert delta.cumulative[-1] == 57
    assert math.isinf(delta.bounds[-1])
    ttft = histogram_delta(
        after.histogram("vllm:time_to_first_token_seconds"),
        before.histogram("vllm:time_to_first_token_seconds"),
    )
    assert ttft.count == 3


def test_label_filter_selects_and_sums(after) -> None:
    assert after.histogram("vllm:inter_token_latency_seconds", model_name="other") is None
    assert after.histogram("vllm:inter_token_latency_seconds", engine="0").count == 57


def hist(bounds, counts):
    cum, total = [], 0.0
    for c in counts:
        total += c
        cum.append(total)
    return Histogram(tuple(bounds), tuple(cum), total, 0.0)


def test_quantile_interpolates_inside_the_bucket() -> None:
    h = hist([0.01, 0.02, 0.05, math.inf], [50, 40, 10, 0])
    assert histogram_quantile(h, 0.5) == pytest.approx(0.01)
    assert histogram_quantile(h, 0.7) == pytest.approx(0.015)
    assert histogram_quantile(h, 0.99) == pytest.approx(0.02 + 0.03 * 0.9)


def test_quantile_in_inf_bucket_returns_highest_finite_bound() -> None:
    assert histogram_quantile(hist([0.01, 0.1, math.inf], [1, 1, 8]), 0.99) == 0.1


def test_quantile_of_empty_window_is_none() -> None:
    assert histogram_quantile(hist([0.01, math.inf], [0, 0]), 0.99) is None
    with pytest.raises(ValueError):
        histogram_quantile(hist([0.01, math.inf], [1, 0]), 99)


def test_delta_after_counter_reset_is_the_new_histogram() -> None:
    old = hist([0.01, math.inf], [100, 0])
    new = hist([0.01, math.inf], [3, 0])
    assert histogram_delta(new, old) == new


def test_selecting_a_family_keeps_it_whole_and_drops_the_rest(data_dir) -> None:
    text = (data_dir / "vllm_metrics_after.txt").read_text()
    name = "vllm:inter_token_latency_seconds"
    only = select_families(text, [name])
    assert len(only) < len(text) / 5
    assert parse_metrics(only).histogram(name) == parse_metrics(text).histogram(name)
    assert parse_metrics(only).gauge("vllm:kv_cache_usage_perc") is None
