"""mdtrain.strategies: the capability matrix, from real strategies each in its own process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mdtrain.choices import STRATEGY_NOTEBOOK, check_strategy_name
from mdtrain.errors import UsageError
from mdtrain.strategies import TOLERANCE, Row, format_matrix, matrix, probe

ROOT = Path(__file__).resolve().parents[1]


def test_format_matrix_shows_cells_notes_and_errors():
    rows = [
        Row("mirrored", "MirroredStrategy", 2, True, True, 2e-6, True, 136.4),
        Row(
            "ps",
            "ParameterServerStrategy",
            2,
            False,
            True,
            step_ms=84.0,
            status="partly",
            error="fit: ValueError: use create_per_worker_dataset",
            note="loss 2.0 -> 1.0",
        ),
        Row("tpu", "TPUStrategy", status="absent", error="no TPU here"),
    ]
    lines = format_matrix(rows).splitlines()
    assert lines[0].split()[:2] == ["strategy", "replicas"] and set(lines[1]) <= {"-", " "}
    mirrored = ["MirroredStrategy", "2", "yes", "yes", "yes", "(2e-06)", "136", "ok"]
    assert lines[2].split() == mirrored
    assert lines[3].split()[1:] == ["2", "NO", "yes", "-", "84", "partly"]
    assert lines[4].split() == ["TPUStrategy", "-", "-", "-", "-", "-", "absent"]
    assert lines[6:] == [
        "- ps: loss 2.0 -> 1.0",
        "- ps: fit: ValueError: use create_per_worker_dataset",
        "- tpu: no TPU here",
    ]


def test_unknown_probe_is_refused():
    with pytest.raises(ValueError, match="unknown probe"):
        probe("horovod")


def test_a_probe_past_its_timeout_is_killed_and_reported_hung():
    row = probe("one", timeout_s=1)  # TensorFlow alone takes longer than 1 s to start
    assert row.status == "hung" and row.fit is None
    assert row.error == "no result within 1 s; the process was killed"


def test_no_tpu_is_reported_without_starting_tensorflow(monkeypatch):
    if matrix._tpu_hint():
        pytest.skip("this machine may have a TPU")
    row = probe("tpu", timeout_s=5)
    assert (row.status, row.error) == ("absent", matrix.NO_TPU)


@pytest.mark.parametrize(
    "name, says",
    [
        ("ps", "mdtrain launch --workers N --ps M"),
        ("parameter_server", "mdtrain launch --workers N --ps M"),
        ("central", "use mirrored"),
        ("CentralStorage", "use mirrored"),
        ("horovod", "unknown; choose one of"),
    ],
)
def test_strategies_train_does_not_offer_point_to_notebook_07(name, says):
    with pytest.raises(UsageError) as caught:
        check_strategy_name(name)
    message = str(caught.value)
    assert says in message and STRATEGY_NOTEBOOK in message and "\n" not in message
    assert (ROOT / STRATEGY_NOTEBOOK).exists()


@pytest.mark.slow
def test_mirrored_matches_one_device_with_fit_and_custom_loop():
    row = probe("mirrored", smoke=True, timeout_s=600)
    assert (row.status, row.error) == ("ok", None)
    assert row.fit and row.custom_loop and row.equal_to_one_device
    assert row.max_difference <= TOLERANCE and row.replicas >= 1 and row.step_ms > 0


@pytest.mark.slow
def test_parameter_servers_train_with_the_coordinator_loop_but_not_fit():
    row = probe("ps", smoke=True, timeout_s=600)
    assert row.custom_loop is True and row.fit is False, row
    assert "create_per_worker_dataset" in row.error
    assert row.equal_to_one_device is None and "asynchronous steps" in row.note


@pytest.mark.slow
@pytest.mark.skipif((os.cpu_count() or 1) > 2, reason="the hang was measured on 2 cores")
def test_parameter_server_workers_with_two_inter_op_threads_hang():
    row = probe("ps-2-threads", smoke=True, timeout_s=600)
    assert row.status == "hung" and row.custom_loop is False, row
