"""hack/replay_dynamic.py refuses arguments the run cannot use in one line, before anything starts."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from benchmark_scripts import load_hack_script


@pytest.fixture(scope="module")
def driver() -> ModuleType:
    return load_hack_script("replay_dynamic")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--compression", "0"], "argument --compression"),
        (["--compression", "nan"], "argument --compression"),
        (["--compression", "inf"], "argument --compression"),
        (["--window", "nan"], "argument --window"),
        (["--window", "inf"], "argument --window"),
        (["--node-count", "0"], "argument --node-count"),
        (["--node-count", "-3"], "argument --node-count"),
        (["--load", "nan"], "argument --load"),
        (["--load", "20"], "load must be in (0, 10]"),
        (["--lead", "nan"], "argument --lead"),
        (["--tiebreak-seeds", "-2"], "argument --tiebreak-seeds"),
        (["--seed", "-1"], "argument --seed"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    driver: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    """They used to end in a traceback deep in the simulator (0, NaN, a node count below 1) or, for
    ``inf``, pass and start a cluster whose run waits 0 real seconds everywhere (a hot loop)."""

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started")

    monkeypatch.setattr(driver.replay_openb, "ReplayCluster", started)
    monkeypatch.setattr(driver, "load_nodes", started)
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text("")
    pods.write_text("")
    with pytest.raises(SystemExit) as exc:
        driver.main(["--nodes", str(nodes), "--pods", str(pods), *argv])
    assert exc.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and says in errors[0]
