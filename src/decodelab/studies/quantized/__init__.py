"""The quantized backend (llama.cpp) as target, draft or peer."""
