"""Fixtures of the Python package's tests: the bundled models, the `ultra` command, one LLM per session.

Run from the repository root with the build tree's package first on the path (ctest's test `python` does):
    PYTHONPATH=build/python python3 -m pytest python/tests
"""

import os
import pathlib
import subprocess

import pytest

import ultra

ROOT = pathlib.Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "target.gguf"
DRAFT = ROOT / "models" / "draft.gguf"
N_CTX = 256


def ultra_bin() -> str:
    exe = os.environ.get("ULTRA_BIN") or str(ROOT / "build" / "ultra")
    if not os.access(exe, os.X_OK):
        pytest.skip(f"the ultra command was not found ({exe}; set ULTRA_BIN)")
    return exe


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([ultra_bin(), *args], capture_output=True, text=True, check=True)


@pytest.fixture(scope="session")
def model() -> ultra.Model:
    return ultra.Model(str(TARGET))


@pytest.fixture(scope="session")
def llm(model) -> ultra.LLM:
    return ultra.LLM(model, n_ctx=N_CTX, n_slots=4)
