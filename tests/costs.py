"""The cost model of the scheduler and batched-decoding tests."""

from decodelab.engines.scheduler import CostModel

# A long-context, KV-bound batch: a sparse draft reads no context, a verification every row's.
COST = CostModel(draft=(0.005, 5e-5, 0.0), verify=(0.005, 2e-5, 2.5e-7))
CONTEXT = 4096
