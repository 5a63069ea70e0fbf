"""Capture: build the model, run one forward and one backward, and keep what both graphs showed.

- `contract.py`: what rules may read, the `Capture` and each node's typed facts (`facts(node)`);
- `session.py`: `capture_model`, one forward and one backward of a built model with every recorder attached
  (`forward.py` the forward graph, `autograd.py` the autograd graph and saved tensors, `modules.py` the
  running modules and where they were built, `debug.py` debugging modes switched on; `patches.py` the one
  way they patch torch and undo it);
- `build.py`: the build policy that the capture, the memory step and the API share, meta first and a CPU
  rebuild when meta cannot run the target; `device.py`: `capture_target`, a factory's target captured under
  it; `isolation.py` restores torch's global state after each target.
"""

from graphlint.capture.contract import Capture, NodeFacts, ParameterInfo, facts
from graphlint.capture.build import inputs_to_meta
from graphlint.capture.device import capture_target, load_target
from graphlint.capture.session import ForwardFailure, capture_model

__all__ = ["Capture", "ForwardFailure", "NodeFacts", "ParameterInfo", "capture_model", "capture_target", "facts",
           "inputs_to_meta", "load_target"]
