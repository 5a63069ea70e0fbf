"""Locate: from captured frames to the user's source spans.

- `sites.py`: which frame a forward-graph node belongs to (first-party code, a torch.nn module's build site,
  the library line behind it).
- `spans.py`: the exact libcst span of the expression in that frame.
- `place.py`: problems to findings, one per location, with their occurrences counted.
"""
