"""The sweep with PyTorch's cuDNN backend of scaled_dot_product_attention turned off (the others
stay on), and no clock probe: does the step-up go away?"""
import torch

import decodelab.backends.devices as d
import decodelab.studies.sweep.run as s

torch.backends.cuda.enable_cudnn_sdp(False)
d.sm_clock_probe = lambda device: None
s.sm_clock_probe = d.sm_clock_probe
