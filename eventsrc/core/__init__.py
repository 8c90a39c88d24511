"""Pure decisions: no I/O, no clock, no randomness. The shell asks; the core answers with events."""
