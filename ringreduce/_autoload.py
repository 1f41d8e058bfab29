"""The torch.backends entry point: runs inside every ``import torch`` of the environment.

It must be cheap and must never break torch (torch turns an exception raised here into a failed
``import torch``). Importing the package registers the backend (pure Python, see
_registration.py); the hook then loads the extension too, so that a broken build is reported
here, once, with the reason, instead of at the first init_process_group. Set RINGREDUCE_AUTOLOAD=0
to skip this hook altogether (the backend is then registered by ``import ringreduce``, and the
extension loaded by the first ringreduce process group), or TORCH_DEVICE_BACKEND_AUTOLOAD=0 to skip
all such hooks.
"""

import os
import sys
import warnings


def autoload() -> None:
    if os.environ.get("RINGREDUCE_AUTOLOAD", "1") == "0":
        return
    try:
        from ringreduce import _registration

        _registration.register()
        _registration.load_extension()
    except Exception as e:  # noqa: BLE001 - torch must keep working whatever happened here
        message = (f"{e}\n(ringreduce stays unavailable in this process; silence this warning "
                   f"with RINGREDUCE_AUTOLOAD=0)")
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        except Exception:  # noqa: BLE001 - warnings turned into errors (python -W error)
            sys.stderr.write(f"RuntimeWarning: {message}\n")
