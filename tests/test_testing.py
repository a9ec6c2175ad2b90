from __future__ import annotations

from pathlib import Path

import pytest
from conftest import FIXTURES

from ncpbench.protocols import NarratorRequest
from ncpbench.testing import ConformanceError, check_environment


def test_a_bundled_environment_conforms() -> None:
    report = check_environment("iron-man", turns=3)
    assert report["outcome"] == "SURVIVAL" and report["completed_nodes"] == ["s_0", "s_1", "s_2"]


def test_a_spec_file_and_an_async_narrator_conform() -> None:
    class Async:
        async def narrate(self, request: NarratorRequest) -> str:
            return "Something happens."

    assert check_environment(FIXTURES / "tiny.yaml", narrator=Async(), turns=2)["turns"] == 2


def test_a_broken_spec_is_reported_with_file_id_and_field() -> None:
    with pytest.raises(ConformanceError, match=r"dangling-before\.yaml:c_0:before"):
        check_environment(FIXTURES / "broken" / "dangling-before.yaml")


def test_a_narrator_that_crashes_is_reported(tmp_path: Path) -> None:
    class Broken:
        def narrate(self, request: NarratorRequest) -> str:
            raise RuntimeError("no words")

    with pytest.raises(ConformanceError, match="no words"):
        check_environment("iron-man", narrator=Broken())
