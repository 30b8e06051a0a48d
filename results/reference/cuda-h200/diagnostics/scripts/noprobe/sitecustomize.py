import decodelab.devices as d

d.sm_clock_probe = lambda device: None
