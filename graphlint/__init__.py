"""graphlint: a linter for PyTorch models that reads the forward graph and the real autograd graph.

    import graphlint
    report = graphlint.lint(model, (x,))
    for finding in report:
        print(finding.rule_id, finding.location.line, finding.message)

The public names are imported on first use, so that `import graphlint` alone does not import torch.
"""

__version__ = "0.1.0"

_EXPORTS = {
    "lint": "graphlint.api",
    "Target": "graphlint.target",
    "Report": "graphlint.results",
    "Finding": "graphlint.results",
    "Location": "graphlint.results",
    "Severity": "graphlint.results",
}
__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'graphlint' has no attribute {name!r}")
