"""The torch.backends entry point: runs inside every ``import torch`` of the environment.

It must be cheap and must never break torch. Registration is pure Python; the extension is
loaded too, so that a broken build is reported here, once, with the reason, instead of at the
first init_process_group. Set RINGREDUCE_AUTOLOAD=0 to skip this hook (the backend is then
registered by ``import ringreduce``), or TORCH_DEVICE_BACKEND_AUTOLOAD=0 to skip all such hooks.
"""

import os
import warnings


def autoload() -> None:
    if os.environ.get("RINGREDUCE_AUTOLOAD", "1") == "0":
        return
    try:
        from ringreduce import _registration

        _registration.register()
        _registration.load_extension()
    except Exception as e:  # noqa: BLE001 - torch must keep working whatever happened here
        warnings.warn(
            f"{e}\n(ringreduce stays unavailable in this process; silence this warning with "
            f"RINGREDUCE_AUTOLOAD=0)", RuntimeWarning, stacklevel=2)
