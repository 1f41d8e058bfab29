"""``python -m ringreduce.info``: the build and the machine, as ringreduce sees them.

Prints ringreduce's and torch's versions, what the extension was built with, which copy of the
CPU reduction loops this CPU gets, which transports can work here (shared memory, with /dev/shm's
size and free space; TCP; CUDA IPC), whether torch finds the backend, and the RINGREDUCE_*
variables set (naming any that is no knob of ringreduce's: a typo is otherwise silently ignored).
Paste it into a bug report.

``python -m ringreduce.info --knobs`` lists every knob instead, with its default and meaning (the
table in csrc/backend/knobs.h; docs/knobs.md says more); ``--algorithms`` every algorithm that
RINGREDUCE_ALGO can name, with the collectives it serves (the list in csrc/common/algos.h;
docs/algorithms.md says more).
"""

import os
import socket
import sys


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _shm():
    """(usable, what to say) for shared memory in /dev/shm."""
    path = "/dev/shm"
    if not os.path.isdir(path):
        return False, f"{path} does not exist (ranks of one host then need RINGREDUCE_TRANSPORT=tcp)"
    st = os.statvfs(path)
    sizes = f"{_mib(st.f_blocks * st.f_frsize)}, {_mib(st.f_bavail * st.f_frsize)} free"
    probe = os.path.join(path, f"ringreduce-info-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return False, f"{path} ({sizes}) is not writable: {e}"
    return True, f"{path}: {sizes}"


def lines():
    import torch
    import torch.distributed as dist

    import ringreduce
    from ringreduce import _build_info

    out = [f"ringreduce {ringreduce.__version__} at {os.path.dirname(ringreduce.__file__)}",
           f"python {sys.version.split()[0]}, torch {torch.__version__} "
           f"(CUDA {torch.version.cuda or 'none'})"]
    ext = None
    try:
        ext = ringreduce.load_extension()
        out.append(f"extension: {ext.__file__}, built against torch {ext.torch_version}, "
                   f"{'with' if ext.built_with_cuda else 'without'} CUDA ({_build_info.CUDA_NOTE})")
        out.append(f"CPU loops: {ext.simd_level()}")
        out.append(f"small op's code: {getattr(_build_info, 'HOT_PATH_NOTE', 'unknown (an older build)')}")
    except ImportError as e:
        out.append(f"extension: cannot be loaded: {e}")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    out.append(f"CPU: {_cpu_model()}, {cpus} usable of {os.cpu_count()}; host {socket.gethostname()}")
    ok, what = _shm()
    out.append(f"transport shm: {'usable' if ok else 'NOT usable'}: {what}")
    out.append("transport tcp: usable (between hosts, or everywhere with RINGREDUCE_TRANSPORT=tcp)")
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        built = getattr(_build_info, "WITH_CUDA", False)
        out.append(f"transport cuda_ipc: {'usable' if built else 'NOT built'}: {n} device(s), "
                   f"{torch.cuda.get_device_name(0)}")
    else:
        out.append("transport cuda_ipc: no CUDA device")
    registered = "ringreduce" in dist.Backend.backend_list
    out.append(f"backend registered with torch.distributed: {'yes' if registered else 'no'} "
               f"(TORCH_DEVICE_BACKEND_AUTOLOAD={os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD', 'unset')}, "
               f"RINGREDUCE_AUTOLOAD={os.environ.get('RINGREDUCE_AUTOLOAD', 'unset')})")
    knobs = sorted((k, v) for k, v in os.environ.items() if k.startswith("RINGREDUCE_"))
    out.append("RINGREDUCE_* set: " + (", ".join(f"{k}={v}" for k, v in knobs) if knobs else "none"))
    if ext is not None:
        known = {k["name"] for k in ext.knobs()}
        unknown = [k for k, _ in knobs if k not in known]
        if unknown:
            out.append(f"not ringreduce knobs (ignored; see python -m ringreduce.info --knobs): "
                       f"{', '.join(unknown)}")
    return out


def knob_lines():
    """One line per knob of the extension's table: name, scope, default, meaning."""
    import ringreduce
    knobs = ringreduce.load_extension().knobs()
    width = max(len(k["name"]) for k in knobs)
    return [f"{k['name']:<{width}}  {k['scope']:<11}  default {k['default']}: {k['meaning']}"
            for k in knobs]


def algorithm_lines():
    """One line per algorithm of the extension's list: name, what it is, the collectives it serves."""
    import ringreduce
    algos = ringreduce.load_extension().algorithms()
    width = max(len(a["name"]) for a in algos)
    return [f"{a['name']:<{width}}  {a['what']}; serves {a['serves']}" for a in algos]


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m ringreduce.info", description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--knobs", action="store_true", help="list every RINGREDUCE_* knob instead")
    which.add_argument("--algorithms", action="store_true",
                       help="list every algorithm RINGREDUCE_ALGO can name instead")
    args = ap.parse_args(argv)
    for line in knob_lines() if args.knobs else algorithm_lines() if args.algorithms else lines():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
