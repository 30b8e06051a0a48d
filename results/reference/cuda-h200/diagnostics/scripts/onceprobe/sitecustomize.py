import pynvml
import torch

import decodelab.backends.devices as d


def probe_once(device):
    if torch.device(device).type != "cuda":
        return None
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    return lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))


d.sm_clock_probe = probe_once
