"""Output records: allowlisted dataclasses (an engine's output object) described field
by field at SAVE and rebuilt at LOAD; any other class refused both ways."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest

from foundry.archive import outputs
from foundry.archive.outputs import (
    DictValue,
    IntValue,
    NoneValue,
    RecordValue,
    SeqValue,
    TensorSpec,
    check_output,
    describe,
    rebuild,
)
from foundry.errors import ArchiveError


@dataclasses.dataclass
class LogitsLike:
    next_token_logits: object
    hidden_states: object = None
    steps: int = 0


@dataclasses.dataclass
class NotListed:
    value: int = 1


@pytest.fixture
def allowlisted(monkeypatch):
    monkeypatch.setitem(outputs.RECORD_TYPES, "test.LogitsLike", f"{__name__}:LogitsLike")


def fake_tensor(value):
    return None  # these records hold no tensors; tensors are covered by the session tests


def test_an_allowlisted_dataclass_round_trips(allowlisted):
    value = LogitsLike(next_token_logits=(1, 2), steps=3)
    spec = describe(value, fake_tensor)
    assert isinstance(spec, RecordValue) and spec.record == "test.LogitsLike"
    check_output(spec, path="archive")
    encoded = msgspec.json.encode(spec)
    decoded = msgspec.json.decode(encoded, type=outputs.OutputValue)
    assert rebuild(decoded, lambda t: t) == value


def test_other_dataclasses_are_refused_when_saving(allowlisted):
    with pytest.raises(ArchiveError, match="NotListed cannot be described"):
        describe(NotListed(), fake_tensor)


def test_an_archive_naming_another_class_is_refused_before_anything_is_imported():
    hostile = RecordValue("os:system", {"value": IntValue(1)})
    with pytest.raises(ArchiveError, match="unknown record type") as err:
        check_output(hostile, path="archive")
    assert err.value.found == "os:system"
    with pytest.raises(ArchiveError, match="unknown record type"):
        rebuild(RecordValue("os.system", {"x": NoneValue()}), lambda t: t)


def test_output_descriptions_rebuild_the_same_structure():
    logits = TensorSpec("float32", (2, 3), (3, 1), 0, "vmm", 4096)
    spec = DictValue(
        {"logits": logits, "rest": SeqValue("tuple", (IntValue(7), TensorSpec("int64", (2,), (1,), 0, "vmm", 0)))}
    )
    made = rebuild(spec, lambda t: ("tensor", t.dtype, t.region_offset))
    assert made == {"logits": ("tensor", "float32", 4096), "rest": (7, ("tensor", "int64", 0))}
