"""The phases a training step's time is split into, named without torch, so that a report read from the result cache
is rendered without importing it (graphlint.timing.text)."""

PHASES = ("forward", "backward", "optimizer")
