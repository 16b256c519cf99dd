import pytest

from flows.replicas import ReplicaUnreachable, parse_replica_list, read_replica_file
from serving.engine_control import ControlTarget, _headers
from serving.prometheus_selectors import SelectorError, check_template, replica_selectors
from serving.replica_auth import AuthError, ReplicaAuth, parse_headers


def test_auth_round_trips_through_the_environment_and_never_shows_values() -> None:
    auth = ReplicaAuth("sk-123", (("X-Tenant", "nightly"),))
    again = ReplicaAuth.from_env(auth.to_env())
    assert again == auth
    assert again.http_headers() == {"X-Tenant": "nightly", "Authorization": "Bearer sk-123"}
    for text in (repr(auth), str(auth), f"{auth}", repr([auth])):
        assert "sk-123" not in text and "nightly" not in text
    assert ReplicaAuth.from_env({}).http_headers() == {}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("X-Tenant s3cret", "Name: value"),
        ("Bad Name: s3cret", "Name: value"),
        ("Authorization: s3cret", "API key"),
    ],
)
def test_bad_headers_are_named_without_their_value(line: str, message: str) -> None:
    with pytest.raises(AuthError, match=message) as err:
        parse_headers([line])
    assert "s3cret" not in str(err.value)


def test_control_route_gets_key_and_headers_and_repr_hides_both() -> None:
    target = ControlTarget("r", base_url="http://h:1", api_key="sk-1", headers=(("X-A", "b"),))
    assert _headers(target) == {"X-A": "b", "Authorization": "Bearer sk-1"}
    assert "sk-1" not in repr(target)


def test_replica_list_skips_comments_and_names_a_bad_line(tmp_path) -> None:
    text = "# tonight\nhttp://r0:8000/\n\nhttp://r1:8000  # second\n"
    assert parse_replica_list(text, "f") == ["http://r0:8000", "http://r1:8000"]
    with pytest.raises(ReplicaUnreachable, match=r"f:2: 'r1:8000'"):
        parse_replica_list("http://r0:8000\nr1:8000\n", "f")
    empty = tmp_path / "empty.txt"
    empty.write_text("# none yet\n")
    with pytest.raises(ReplicaUnreachable, match="lists no replica"):
        read_replica_file(empty)
    with pytest.raises(ReplicaUnreachable, match="missing.txt"):
        read_replica_file(tmp_path / "missing.txt")


def test_prometheus_selectors_fill_in_each_replica() -> None:
    replicas = [("r0", "http://10.0.0.5:8000/"), ("r1", "http://10.0.0.6:8001")]
    assert replica_selectors('instance="{instance}"', replicas) == {
        "r0": 'instance="10.0.0.5:8000"',
        "r1": 'instance="10.0.0.6:8001"',
    }
    pods = replica_selectors('job="vllm",pod=~"{host}.*",replica="{name}"', replicas[:1])
    assert pods == {"r0": 'job="vllm",pod=~"10.0.0.5.*",replica="r0"'}
    with pytest.raises(SelectorError, match=r"unknown field \{hostname\}"):
        check_template('instance="{hostname}"')
