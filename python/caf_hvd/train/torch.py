"""caf_hvd.train.torch: the torch helpers of Ray Train a Horovod loop uses."""

import os


def get_device():
    """This rank's torch device: cuda:<local rank within CUDA_VISIBLE_DEVICES> when the
    run has GPUs, else cpu."""
    import torch
    if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES"):
        local = int(os.environ.get("HOROVOD_LOCAL_RANK", "0"))
        return torch.device(f"cuda:{local % torch.cuda.device_count()}")
    return torch.device("cpu")
