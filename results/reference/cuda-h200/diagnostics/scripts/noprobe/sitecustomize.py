import decodelab.backends.devices as d

d.sm_clock_probe = lambda device: None
