"""SaveSession on the CPU (foundry/runtime/sessions/save.py): its options."""

from __future__ import annotations

import pytest

from foundry.errors import FoundryError


def test_save_keeps_warmup_bytes_up_to_the_first_capture_or_to_finish(tmp_path):
    from foundry.runtime.sessions.save import SaveSession

    assert SaveSession(tmp_path / "a", warmup_bytes_until="finish").warmup_bytes_until == "finish"
    with pytest.raises(FoundryError, match="first capture or to finish") as err:
        SaveSession(tmp_path / "a", warmup_bytes_until="never")
    assert err.value.field == "warmup_bytes_until"
