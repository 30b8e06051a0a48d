"""What the figures and the paper share: figure style, TeX, the paper's common sections, the
reference comparison and the benchmark table."""
