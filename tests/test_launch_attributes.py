"""Launch attributes are checked as they are decoded, every one, however often a graph repeats one."""

from __future__ import annotations

import msgspec
import pytest

from foundry.graphir.kernel import LaunchAttribute

DECODE = msgspec.msgpack.Decoder(LaunchAttribute)


def _decode(name: str, value: object) -> LaunchAttribute:
    return DECODE.decode(msgspec.msgpack.encode([name, value]))


def test_a_value_once_accepted_does_not_let_another_type_or_value_through():
    for _ in range(3):  # the second and later ones take the remembered path
        assert _decode("cooperative", 1).value == 1
        assert _decode("priority", -2).value == -2
    with pytest.raises(msgspec.ValidationError, match="out of its range"):
        _decode("cooperative", 1.0)  # equal to 1, another type: checked on its own
    with pytest.raises(msgspec.ValidationError, match="out of its range"):
        _decode("cooperative", 2)
    with pytest.raises(msgspec.ValidationError, match="unknown launch attribute"):
        _decode("no-such-attribute", 1)
    assert _decode("preferred_cluster_dim", (8, 1, 1)).value == (8, 1, 1)
    with pytest.raises(msgspec.ValidationError, match="out of its range"):
        _decode("preferred_cluster_dim", (8, 1))
    with pytest.raises(msgspec.ValidationError, match="out of its range"):
        _decode("nvlink_util_centric_scheduling", -1)
    with pytest.raises(msgspec.ValidationError, match="out of its range"):
        _decode("access_policy_window", {"base_ptr": 0, "num_bytes": 0, "hit_ratio": float("nan"),
                                         "hit_prop": 0, "miss_prop": 0})  # fmt: skip


def test_the_memory_of_accepted_values_stays_bounded():
    for size in range(6000):
        _decode("cluster_dim", (1, 1, size + 1))
    from foundry.graphir import kernel

    assert len(kernel._ACCEPTED) <= 4096
