"""The README's library example runs as written."""

import re
from pathlib import Path

import pytest

# Slow: the README's example trains on all of digits.
pytestmark = pytest.mark.slow

README = Path(__file__).resolve().parents[2] / "README.md"


def test_library_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert blocks, "README.md has no python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["embedding"].shape == (1797, 10)
    assert namespace["mbn"].ks_ == [898, 449, 224, 112, 56, 28]  # as the README says
    assert (tmp_path / "digits-model" / "manifest.json").is_file()
    assert namespace["bundle"].embed(namespace["X"][:5]).shape == (5, 10)
    # Run again: the bundle's directory exists, which is found before the fit, not after.
    import mbn_core

    def no_fit(*args, **kwargs):
        raise AssertionError("the fit started")

    monkeypatch.setattr(mbn_core.MBN, "fit_transform", no_fit)
    with pytest.raises(ValueError, match="already exists"):
        exec(compile(blocks[0], "README.md", "exec"), {})
