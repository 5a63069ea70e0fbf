"""Training memory: the peak of one steady-state training step and what it is made of (`graphlint memory`)."""
