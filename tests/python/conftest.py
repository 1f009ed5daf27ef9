"""Shared fixtures. The helpers in _reference.py are imported directly (pytest puts this folder
on sys.path)."""

import numpy as np
import pytest


@pytest.fixture
def rng():
    return np.random.default_rng(20240611)


def pytest_report_header(config):
    try:
        import flashcpp
    except ImportError as error:  # the suite fails loudly below; say why up front
        return f"flashcpp: NOT importable ({error})"
    return (f"flashcpp {flashcpp.__version__} from {flashcpp.__file__}; built_with_cuda="
            f"{flashcpp.built_with_cuda}, cuda_available={flashcpp.cuda_available()}")
