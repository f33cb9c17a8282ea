"""rejections: what one rejected object can cost — a bounded log text, a bounded identity key, and
no exception from a failing counter (the watch must not stop on it)."""

from __future__ import annotations

import logging

from rlsched.extender.objects import ObjectError
from rlsched.extender.rejections import Rejections, describe, identity


def test_describe_cuts_a_long_message() -> None:
    text = describe(ValueError("x" * 5_000))
    assert text.startswith("ValueError: x") and text.endswith("…")
    assert len(text) == len("ValueError: ") + 300


def test_describe_survives_an_exception_whose_str_fails() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("Exceeds the limit (4300 digits) for integer string conversion")

    assert describe(Unprintable()) == "Unprintable"


def test_identity_cuts_each_field_to_253() -> None:
    meta = {"namespace": "n" * 1000, "name": "a" * 1000, "uid": "u" * 1000, "resourceVersion": "9" * 1000}
    assert identity({"metadata": meta}) == ("n" * 253, "a" * 253, "u" * 253, "9" * 253)


def test_a_failing_counter_does_not_stop_the_rejection(caplog) -> None:
    def broken(kind: str, reason: str) -> None:
        raise RuntimeError("registry gone")

    r = Rejections(broken)
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "resourceVersion": "1"}}
    with caplog.at_level(logging.WARNING, logger="rlsched.extender.cache"):
        assert r.reject("pod", pod, ObjectError("Pod.spec.x", "bad")) is True
    assert r.totals == {"pod/field": 1}
    assert any("counting a rejected pod failed" in rec.getMessage() for rec in caplog.records)
