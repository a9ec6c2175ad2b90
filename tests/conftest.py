from __future__ import annotations

from pathlib import Path

import pytest

from ncpbench.dataset import load_file
from ncpbench.spec import Spec

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-local", action="store_true", help="run tests that need the embedded local model")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-local"):
        return
    skip = pytest.mark.skip(reason="needs the embedded local model: pass --run-local")
    for item in items:
        if "local_model" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny() -> Spec:
    return load_file(FIXTURES / "tiny.yaml")
