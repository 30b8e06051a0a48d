"""Where models run and come from: devices, model sources and loading, training, the machine's
background, llama.cpp."""
