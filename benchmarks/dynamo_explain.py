"""The peer a user runs today: torch._dynamo.explain on the same target, on CPU.

    python benchmarks/dynamo_explain.py benchmarks/models.py:gpt2_small
"""

import importlib.util
import sys

import torch


def main(target: str) -> None:
    path, name = target.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("dynamo_target", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = getattr(module, name)()
    model, args, kwargs = made[0], tuple(made[1]), dict(made[2]) if len(made) > 2 else {}
    explanation = torch._dynamo.explain(model)(*args, **kwargs)
    print(f"{explanation.graph_count} graphs, {explanation.graph_break_count} graph breaks")


if __name__ == "__main__":
    main(sys.argv[1])
