"""Statistics every study shares: bootstrap intervals, stability verdicts, selection, variance,
change points, spikes and the speculative theory."""
