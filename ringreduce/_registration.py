"""Registration of the "ringreduce" backend with torch.distributed.

Kept free of the compiled extension so that registering is cheap: torch runs it on every
``import torch`` through the entry point (see _autoload.py). The extension is loaded by
``load_extension()`` when a process group is created.
"""

from __future__ import annotations

import warnings

BACKEND_NAME = "ringreduce"


def _devices():
    """The devices whose tensors this build handles: "cuda" too where it was built with CUDA."""
    try:
        from ringreduce import _build_info
    except ImportError:
        return ["cpu"]
    return ["cpu", "cuda"] if getattr(_build_info, "WITH_CUDA", False) else ["cpu"]


_registered = False
_extension = None

_HOW_TO_BUILD = (
    "build it against the torch in this environment with `make build`, or with "
    "`pip install --no-build-isolation --no-deps -e .` from the ringreduce checkout"
)


def load_extension():
    """Import ringreduce._C, checking that it was built for the torch that is running.

    Raises ImportError with the reason and how to fix it.
    """
    global _extension
    if _extension is not None:
        return _extension
    import torch

    # Checked before the extension is loaded: one built for another torch may load and then
    # misbehave, since torch's C++ ABI differs between releases. setup.py writes _build_info.
    try:
        from ringreduce import _build_info
    except ImportError as e:
        raise ImportError(f"ringreduce: the extension has not been built ({e}); {_HOW_TO_BUILD}") from e
    if _build_info.TORCH_VERSION != torch.__version__:
        raise ImportError(
            f"ringreduce: ringreduce._C was built against torch {_build_info.TORCH_VERSION} but "
            f"torch {torch.__version__} is running, and torch's C++ ABI differs between releases; "
            f"{_HOW_TO_BUILD}")
    try:
        from ringreduce import _C
    except ImportError as e:
        raise ImportError(f"ringreduce: the compiled extension ringreduce._C cannot be loaded ({e}); "
                          f"{_HOW_TO_BUILD}") from e
    _extension = _C
    return _C


def is_available() -> bool:
    """True when the extension loads in this environment."""
    try:
        load_extension()
    except ImportError:
        return False
    return True


def _create_backend(store, rank, size, timeout):
    # Called by torch.distributed for every process group that uses the backend.
    return load_extension().RingBackend(store, rank, size, timeout)


def register() -> None:
    """Register "ringreduce" with torch.distributed (idempotent)."""
    global _registered
    if _registered:
        return
    import torch.distributed as dist

    if not dist.is_available():
        warnings.warn("ringreduce: this build of torch has no torch.distributed; the ringreduce "
                      "backend is not registered", RuntimeWarning, stacklevel=2)
        return
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create_backend, devices=_devices())
    _registered = True
