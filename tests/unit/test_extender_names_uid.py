"""check_uid at its edges: control characters are not a UID (they would reach log lines and the
bind's bookkeeping), and the 128-character cap is inclusive."""

from __future__ import annotations

import pytest

from rlsched.extender.names import InvalidName, check_uid


@pytest.mark.parametrize("uid", ["a\nb", "a\rb", "a\tb", "a\x7fb", "a\x00b", "a\x1bb"])
def test_a_uid_with_control_characters_is_refused(uid: str) -> None:
    with pytest.raises(InvalidName) as err:
        check_uid(uid)
    assert err.value.field == "PodUID" and "is not a UID" in err.value.message


def test_a_uid_of_exactly_128_characters_is_taken() -> None:
    check_uid("u" * 128)
    with pytest.raises(InvalidName):
        check_uid("u" * 129)
