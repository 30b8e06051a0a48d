"""The CUDA engine: static caches, CUDA graphs, fused layers and the Triton attention and GEMV
kernels."""
