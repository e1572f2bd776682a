"""The `full_float32` switch (issue #43 item 7): the paper's GPUs (NVIDIA TITAN Xp, Pascal) had no TF32, so under
`authors` a CUDA trial's float32 convolutions and matrix products (L_DMI's float32 product included) run in full
float32; `bench` keeps TF32 on unless BENCH_TF32=0. The flags are torch's process-wide ones, so every trial sets them
where it resolves its device: checked here on a CPU with CUDA's availability faked (no tensor goes to the device)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bench.data import get_dataset
from bench.exec import prepare as prepare_module
from bench.exec.executors.streams import Streams
from bench.exec.prepare import trial_device
from bench.trial import TrialConfig

PAPER_SETS = ("mr", "fashion_mnist", "cifar10", "dogs_vs_cats")


@pytest.fixture
def flags(monkeypatch):
    """CUDA reported available (resolve_device then only sets the flags), both flags put back afterwards."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield lambda: (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _config(dataset: str, spec: str) -> TrialConfig:
    noise = get_dataset(dataset).paper_noise or next(iter(get_dataset(dataset).noise_patterns))
    return TrialConfig(dataset=dataset, method="dmi", noise=noise, r=0.2, seed=1, protocol=spec, device="cuda")


@pytest.mark.parametrize("dataset", PAPER_SETS)
@pytest.mark.parametrize("env", [None, "0"])
def test_tf32_off_under_authors_and_back_for_bench(dataset: str, env: str | None, flags, monkeypatch) -> None:
    if env is None:
        monkeypatch.delenv("BENCH_TF32", raising=False)
    else:
        monkeypatch.setenv("BENCH_TF32", env)
    bench_tf32 = env != "0"
    # In the order a worker process might run them: each trial sets both flags, whatever the one before left.
    for spec, tf32 in (("authors", False), ("bench", bench_tf32), ("authors-full_float32", bench_tf32),
                       ("bench+full_float32", False), ("bench", bench_tf32)):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = not tf32  # the wrong state
        assert trial_device(_config(dataset, spec)).type == "cuda"
        assert flags() == (tf32, tf32), spec


def test_prepare_resolves_the_device_by_the_trials_protocol(tmp_path: Path, monkeypatch) -> None:
    """`prepare` (and the data loading it calls) resolve the device with the protocol's switch: on a CPU the switch
    changes nothing else, and an authors trial's labels and loaders are the ones it had."""
    monkeypatch.setenv("BENCH_VERIFY_CHECKSUMS", "0")
    folder = tmp_path / "MR" / "rt-polaritydata"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for kind in ("pos", "neg"):
        lines = [" ".join(rng.choice(["good", "bad", "film", "the", kind], 6)) for _ in range(60)]
        (folder / f"rt-polarity.{kind}").write_text("\n".join(lines) + "\n")
    calls: list[tuple[str, bool]] = []
    real = prepare_module.resolve_device

    def recording(name: str, full_float32: bool = False) -> torch.device:
        calls.append((name, full_float32))
        return real(name, full_float32)

    monkeypatch.setattr(prepare_module, "resolve_device", recording)
    for spec, want in (("authors", True), ("bench", False), ("authors-full_float32", False)):
        calls.clear()
        config = TrialConfig(dataset="mr", method="dmi", noise="pos_to_neg", r=0.2, seed=1, protocol=spec)
        prepare_module.prepare(config, tmp_path, log=lambda _: None)
        assert calls and set(calls) == {("cpu", want)}, spec


def test_every_paper_set_declares_it_and_streams_keep_it_apart() -> None:
    for dataset in PAPER_SETS:
        assert get_dataset(dataset).protocol("authors").on("full_float32")
    # Members of one streams unit share a process, hence its TF32 flags: an authors trial does not join bench's.
    streams = Streams.__new__(Streams)
    keys = {spec: streams.group_key(_config("fashion_mnist", spec)) for spec in
            ("bench", "authors", "bench+full_float32", "authors-full_float32")}
    assert keys["bench"] == ("fashion_mnist", "fashion_cnn", "cuda", "native", 1) == keys["authors-full_float32"]
    assert keys["authors"] == keys["bench+full_float32"] != keys["bench"]
