"""Fixes: rules offer rewrites of the user's source (rewrite.py), locate turns them into text edits, and this
package applies them to text (edits.py), proves them on the model in a separate process (prove.py,
model_run.py), and writes the files that passed (apply.py)."""
