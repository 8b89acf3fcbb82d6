"""The GitHub Action example in docs/CI.md, as a workflow actionlint can check.

`python tests/ci_doc_workflow.py | actionlint -` (what `make lint` runs);
tests/test_action.py reads the same steps.
"""

from __future__ import annotations

from pathlib import Path

CI_DOC = Path(__file__).resolve().parents[1] / "docs" / "CI.md"


def example_steps_yaml(text: str | None = None) -> str:
    """The one ```yaml block of docs/CI.md that checks out the repository: a list of steps."""
    text = CI_DOC.read_text(encoding="utf-8") if text is None else text
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    found = [b for b in blocks if "uses: actions/checkout@" in b]
    if len(found) != 1:
        raise ValueError(f"docs/CI.md: expected one Action example with actions/checkout, found {len(found)}")
    return found[0]


def as_workflow(steps_yaml: str) -> str:
    """The steps inside a minimal workflow (one job on ubuntu-latest)."""
    body = "".join(f"      {line}\n" if line.strip() else "\n" for line in steps_yaml.splitlines())
    return (
        "name: docs-ci-example\non: pull_request\npermissions: {}\njobs:\n  gate:\n"
        "    runs-on: ubuntu-latest\n    steps:\n" + body
    )


if __name__ == "__main__":
    print(as_workflow(example_steps_yaml()), end="")
