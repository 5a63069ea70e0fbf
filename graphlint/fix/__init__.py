"""Fixes, the workflow: rules offer rewrites of the user's source (graphlint.rewrite), locate turns them into
text edits, and this package proves them on the model in children of the run's warm parent (prove.py; what the
children run is graphlint.run.proof), then applies and writes the ones that passed (apply.py)."""
