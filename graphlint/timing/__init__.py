"""The time of one training step (`graphlint time`): every aten op of the step `graphlint memory` runs, with
its FLOPs (torch.utils.flop_counter's own formulas), the bytes it reads and writes, its dtype, phase and source
line (graphlint.timing.record), priced on a named device by a roofline per op (graphlint.timing.devices,
graphlint.timing.roofline)."""
