"""The floor: exactly the work no linter can avoid for one target, and nothing else.

    python benchmarks/floor.py benchmarks/models.py:gpt2_small

Import torch, build the target on the meta device, one forward and one backward, one walk of the
autograd graph.
"""

import importlib.util
import sys

import torch


def main(target: str) -> None:
    path, name = target.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("floor_target", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with torch.device("meta"):
        model, args = getattr(module, name)()
        loss = model(*args).float().sum()
    seen, stack = set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and node not in seen:
            seen.add(node)
            stack.extend(next_node for next_node, _ in node.next_functions)
    loss.backward()
    print(f"{len(seen)} autograd nodes")


if __name__ == "__main__":
    main(sys.argv[1])
