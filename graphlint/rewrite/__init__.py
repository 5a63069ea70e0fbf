"""Rewrites of the user's source, as libcst trees: the contract between a rule's fixer and locate
(contract.py), reading source (source.py, inline.py, formulas.py), the fixers the rules name (norms.py,
activations.py, log_softmax.py, bias.py, out_of_place.py with aliases.py, attention/), the submodule calls a fix
stops making (submodules.py) and text edits (edits.py). A bottom layer: it imports none of the layers that use
it (locate, fix, run, capture, the session), so that tests/test_import_graph.py keeps it below them."""
