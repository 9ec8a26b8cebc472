"""docs/python.md is true: its ```python blocks run, in order, in one namespace, in an empty
directory."""

import os
import re

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_every_python_block_of_docs_python_md_runs(tmp_path, monkeypatch):
    text = open(os.path.join(REPO, "docs", "python.md")).read()
    blocks = re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert len(blocks) >= 7
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "docs_python_md"}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/python.md block {i + 1}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"docs/python.md block {i + 1} failed: {e!r}\n{block}") from e
