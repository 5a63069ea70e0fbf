"""Fixes, the workflow: rules offer rewrites of the user's source (graphlint.rewrite), locate turns them into
text edits, and this package proves them on the model as jobs that the session runs on its own runner (prove.py;
what a proof's child runs is graphlint.run.proof), then applies and writes the ones that passed (apply.py)."""
