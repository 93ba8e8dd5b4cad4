"""horovod.ray.ray_logger on caf-hvd: `ray_logger.log(dict)` in a worker of an executor
sends the dict to the callbacks of the driver program's `run` (caf_hvd.log). Outside a
worker it warns once and does nothing, as horovod.ray's does when logging is not
configured."""

import warnings

from caf_hvd import _runtime

warning_raised = False


def log(info_dict):
    """Sends info_dict back to the driver program, where the callbacks get it.

    Args:
        info_dict (dict): Dictionary of serializable elements.
    """
    global warning_raised
    if _runtime.channel is not None:
        _runtime.log(info_dict)
    elif not warning_raised:
        warnings.warn("`ray_logger.log` called but logging is not configured.")
        warning_raised = True
