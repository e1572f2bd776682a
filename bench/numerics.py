"""A trial's float order: its threads, native or portable kernels, the pins checked in force, what a row records.

A trial's float order: its numerics (`native` or `portable`), its intra-op threads, the pins that make `portable`
one computation on every x86-64 CPU, the check that they are in force where the trial runs, and what a row records
of what computed it (`in_force`).

Float order is part of a computation. MKL, oneDNN and ATen pick their kernels by the CPU's instruction set, and the
sums of a kernel run in another order with another vector width or another number of threads: the same trial gives
other last bits on an AVX-512 CPU than on an AVX2 one, and at two threads than at one, and a trial that sits on a
knife's edge (L_DMI escaping a collapsed warm start, or not) ends elsewhere. So:

- **threads**: a trial sets its own intra-op threads (`TrialConfig.threads`: 1 unless its grid gives its trials more
  CPUs), whatever the shell's `OMP_NUM_THREADS` or the machine's cores; `bench trial`, a grid, a pack and a retry
  compute with the same number, and the row records it.
- **native** (the default, for speed): the kernels the machine picks. Its figures hold on one CPU kind; the row names
  it (`cpu_capability`, `mkl_cbwr`, `onednn_isa`, the libraries' versions).
- **portable**: every worker pinned before torch computes anything (`PINS`): ATen's and oneDNN's AVX2 kernels (the
  level every x86-64 server of the last decade has) and MKL's COMPATIBLE branch. MKL honours COMPATIBLE on every
  x86-64 CPU; its AVX2 branch only on Intel's (on an AMD EPYC, `MKL_CBWR=AVX2` leaves it in AUTO: `mkl_serv_cbwr_get`
  answers 2), so AVX2 would not pin MKL there. Each pin is checked in force (`check_in_force`) before the trial
  loads data: a process whose torch already computed with other kernels refuses in one line. On CUDA, `portable`
  means deterministic algorithms, no TF32 and cuBLAS's fixed workspace (`CUDA_PINS`): the same bits run to run on
  one GPU kind, which is what a GPU can promise. On an arm64 CPU it is refused until it is defined there.

A trial's numerics and threads are part of its identity where they are not the defaults (`bench.trial`), so that a
native row never answers for a portable trial. This module imports no torch at its top: `bench trial` sets the pins
(`set_pins`) before its first torch import.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from bench.config import UserError

NATIVE, PORTABLE = "native", "portable"
NUMERICS = (NATIVE, PORTABLE)
PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CUDA_PINS = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # cuBLAS's deterministic workspace (CUDA >= 10.2)
# What each pin looks like once in force (`in_force`): ATen's capability, MKL's branch, oneDNN's ISA line.
IN_FORCE = {"cpu_capability": "AVX2", "mkl_cbwr": "COMPATIBLE", "onednn_isa": "Intel AVX2"}
# MKL's conditional numerical reproducibility branches (mkl_cbwr.h): what `mkl_serv_cbwr_get` answers.
MKL_BRANCHES = {0: "OFF", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2",
                9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}
X86_64 = ("x86_64", "amd64")


def machine_problem(numerics: str) -> str | None:
    """Why this machine cannot compute `numerics` (None: it can): `portable` is defined on x86-64 CPUs only."""
    if numerics == PORTABLE and platform.machine().lower() not in X86_64:
        return (f"numerics portable is defined for x86-64 CPUs (AVX2 pins); this is {platform.machine()}: "
                "use --numerics native (its rows record the kernels that computed them)")
    return None


def pins(numerics: str, device: str = "cpu") -> dict[str, str]:
    """The environment a `numerics` trial runs in, set before torch computes anything: none for native."""
    if numerics != PORTABLE:
        return {}
    return {**PINS, **(CUDA_PINS if device.startswith("cuda") else {})}


def set_pins(numerics: str, device: str = "cpu",
             environ: MutableMapping[str, str] | None = None) -> dict[str, str | None]:
    """Put `pins(numerics, device)` into `environ` (this process's by default: its Ray workers inherit it); return
    what they replaced (None for a variable that was unset), for `restore`."""
    environ = os.environ if environ is None else environ
    wanted = pins(numerics, device)
    before = {name: environ.get(name) for name in wanted}
    environ.update(wanted)
    return before


def restore(before: Mapping[str, str | None], environ: MutableMapping[str, str] | None = None) -> None:
    environ = os.environ if environ is None else environ
    for name, value in before.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value


def pins_in_environment(environ: Mapping[str, str] | None = None) -> str:
    """The float-order pins this process was given, as a row records them ("" for none)."""
    environ = os.environ if environ is None else environ
    names = [*PINS, *CUDA_PINS]
    return ",".join(f"{name}={environ[name]}" for name in names if name in environ)


def enter(numerics: str, threads: int, device: str = "cpu") -> None:
    """Set a trial's float order in this process before it loads its data: its intra-op threads, and on CUDA the
    algorithms `numerics` asks for; then check that the pins `portable` needs are in force (`check_in_force`)."""
    import torch

    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        # Set for every trial, so that a native trial after a portable one in the same process is native again.
        torch.use_deterministic_algorithms(numerics == PORTABLE)
        if numerics == PORTABLE:
            torch.backends.cudnn.benchmark = False
    if numerics == PORTABLE:
        check_in_force(device)


def check_in_force(device: str = "cpu") -> None:
    """A `UserError` (one line) where a pin of `portable` is not in force in this process: torch computed before the
    pins were set (another capability already chosen), or the environment lacks one."""
    if problem := machine_problem(PORTABLE):
        raise UserError(problem)
    needed = pins(PORTABLE, device)
    missing = {name: value for name, value in needed.items() if os.environ.get(name) != value}
    if missing:
        wanted = " ".join(f"{k}={v}" for k, v in needed.items())
        raise UserError(f"numerics portable needs {' '.join(f'{k}={v}' for k, v in missing.items())} in the "
                        f"environment before torch loads; `bench trial` and `bench run` set them: elsewhere start "
                        f"Python with {wanted}")
    state = kernels()
    for field, wanted_value in IN_FORCE.items():
        got = state[field]
        if field == "onednn_isa" and not got:  # oneDNN ran no kernel of the check's: nothing to compare
            continue
        if got != wanted_value:
            raise UserError(f"numerics portable needs {field} {wanted_value}, but this process computes with "
                            f"{got or 'unknown'}: its torch computed before the pins were set; run the trial in a "
                            f"fresh process (`bench trial`, `bench run` and `bench verify` start one pinned)")


def kernels() -> dict[str, str]:
    """The kernels in force in this process: ATen's CPU capability, MKL's reproducibility branch, oneDNN's ISA."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": _mkl_branch(),
            "onednn_isa": _onednn_isa()}


def in_force(device: str = "cpu") -> dict[str, Any]:
    """What computed a trial in this process, as its row records it: the kernels (`kernels`), its threads, the pins
    in the environment, the libraries' versions (MKL, oneDNN; on CUDA, CUDA and cuDNN) and whether deterministic
    algorithms were on."""
    import torch

    cuda = device.startswith("cuda") and torch.cuda.is_available()
    return {**kernels(), "threads": torch.get_num_threads(), "pins": pins_in_environment(),
            "mkl_version": _mkl_version(), "onednn_version": _onednn_version(),
            "cuda_version": (torch.version.cuda or "") if cuda else "",
            "cudnn_version": str(torch.backends.cudnn.version() or "") if cuda else "",
            "deterministic": bool(torch.are_deterministic_algorithms_enabled())}


@functools.cache
def _torch_cpu_library() -> Any:
    import ctypes

    import torch

    try:
        return ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    except OSError:
        return None


def _mkl_branch() -> str:
    """MKL's conditional numerical reproducibility branch in force ("" where torch has no MKL)."""
    lib = _torch_cpu_library()
    try:
        return MKL_BRANCHES.get(int(lib.mkl_serv_cbwr_get(1)), "unknown")  # 1: MKL_CBWR_BRANCH
    except AttributeError:
        return ""


@functools.cache
def _mkl_version() -> str:
    import ctypes

    lib = _torch_cpu_library()
    try:
        text = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(text, 256)
    except AttributeError:
        return ""
    found = re.search(r"Version ([\d.]+)", text.value.decode(errors="replace"))
    return found.group(1) if found else ""


@functools.cache
def _onednn_version() -> str:
    import torch

    found = re.search(r"MKL-DNN v(\S+)", torch.__config__.show())
    return found.group(1) if found else ""


@functools.cache
def _onednn_isa() -> str:
    """The ISA oneDNN computes with, from the line its verbose mode prints once per process ("" where it printed
    none). oneDNN exports no call for it from torch's library, so one small convolution runs with verbose on and the
    process's standard output caught at its file descriptor (oneDNN writes there from C)."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return ""
    with _captured_stdout() as read:
        with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON), torch.no_grad():
            torch.nn.functional.conv2d(torch.ones(2, 16, 16, 16), torch.ones(16, 16, 3, 3))
    found = re.search(r"isa:([^\n,]+)", read())
    return found.group(1).strip() if found else ""


@contextlib.contextmanager
def _captured_stdout() -> Iterator[Any]:
    """What the C libraries write to the process's standard output (file descriptor 1, where C's `stdout` writes,
    whatever Python's `sys.stdout` is) inside the block."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stdout.flush()
    _flush_c_stdio()
    fd = 1
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as caught:
        text: list[str] = []
        os.dup2(caught.fileno(), fd)
        try:
            yield lambda: "".join(text)
        finally:
            _flush_c_stdio()  # oneDNN prints through C's stdio, buffered where stdout is no terminal
            os.dup2(saved, fd)
            os.close(saved)
            caught.seek(0)
            text.append(caught.read().decode(errors="replace"))


def _flush_c_stdio() -> None:
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)
