"""The base: errors, names, file I/O, the table registry, hosts, and the torch-free specs and
estimates every other layer reads."""
