"""The memory estimate that sizes packs (`bench.exec.memory.pack_memory`) against what real packs allocate.

    python benchmarks/pack_memory.py --data-root DIR [--device cuda] [--datasets fashion_mnist,mr]
                                     [--members 8,64,256] [--epochs 1] [--subset N]

For each dataset and pack size K, a real pack (`bench.exec.pack.run_pack`: CE warm starts, then CE, L_DMI and FW
members, diagnostics every epoch) runs for `--epochs` + `--epochs` epochs while its peak is measured: on CUDA by
torch's allocator (`max_memory_allocated`, inputs included), on a CPU by the profiler's allocation events (inputs
left out of both columns: the data files load through numpy, which the profiler does not see). Prints the estimate,
the measured peak, their ratio (>= 1: the estimate errs on the safe side) and how many members the estimate fits on
the device. Imports only torch and numpy (and bench's training core): it runs on a bare GPU box.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from bench.exec.memory import GIB, device_memory, pack_memory
from bench.exec.pack import run_pack
from bench.exec.prepare import prepare
from bench.trial import TrialConfig

NOISE = {"fashion_mnist": "case3", "mr": "pos_to_neg", "synthetic": "case3"}


def cpu_peak(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    return int(np.cumsum([n for _, n in events]).max())


def cuda_peak(fn) -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--data-root", required=True)
    parser.add_argument("--datasets", default="fashion_mnist,mr")
    parser.add_argument("--members", default="8,64,256")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of each stage")
    parser.add_argument("--subset", type=int, default=None, help="the first N training examples only")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    capacity = device_memory(args.device)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"device {args.device} ({name}), torch {torch.__version__}; {args.epochs} + {args.epochs} epochs; "
          f"usable: {'-' if capacity is None else f'{capacity / GIB:.1f} GiB'}")
    print(f"{'dataset':>14} {'K':>5} {'estimate GiB':>13} {'measured GiB':>13} {'ratio':>6} {'fit':>6} {'wall s':>7}")
    for dataset in args.datasets.split(","):
        for k in (int(v) for v in args.members.split(",")):
            configs = [TrialConfig(dataset, ("ce", "dmi", "fw")[i % 3], NOISE[dataset], round(0.1 * (i % 8), 1),
                                   seed=i, epochs=args.epochs, epochs_warmup=args.epochs, train_subset=args.subset,
                                   device=args.device) for i in range(k)]
            memory = pack_memory(prepare(configs[0], args.data_root, log=lambda s: None))
            estimate = memory.bytes(k) - (0 if cuda else memory.inputs)
            started = time.perf_counter()
            peak = (cuda_peak if cuda else cpu_peak)(
                lambda configs=configs: run_pack(configs, args.data_root, log=lambda s: None))
            fit = "-" if capacity is None else f"{memory.members(capacity):,}"
            print(f"{dataset:>14} {k:>5} {estimate / GIB:>13.3f} {peak / GIB:>13.3f} {estimate / peak:>6.2f} "
                  f"{fit:>6} {time.perf_counter() - started:>7.1f}", flush=True)


if __name__ == "__main__":
    main()
