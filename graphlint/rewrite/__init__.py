"""The toolkit of rewrites of the user's source, as libcst trees: the contract between a rule's fixer and locate
(contract.py), reading source (source.py, inline.py, formulas.py, aliases.py), the submodule calls a fix stops
making (submodules.py) and text edits (edits.py). A fixable rule's own fixer lives in its package
(rules/gl106_unfused_norm/fix.py); GL101's is attention/ until it moves beside its rule. A bottom layer: it
imports none of the layers that use it (locate, fix, run, capture, the session), so that
tests/test_import_graph.py keeps it below them."""
