"""The process layer: a warm parent (`parent.py`) that has imported torch, graphlint's capture and rules, and
runs typed jobs (`wire.py`: lint a target, make its graph report or memory estimate, run one side of a fix's
proof) each in a child process of its own (`child.py`), forked where that is safe and spawned elsewhere;
`scheduler.py` starts them (at most `-j` at a time, each within its time limit) and turns every way a child can
end into its job's answer; `heap.py` keeps the garbage collector off the parent's long-lived heap.
graphlint.session decides what to run.
"""
