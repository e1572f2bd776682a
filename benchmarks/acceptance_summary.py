"""The closing summary of `benchmarks/gpu_acceptance.sh`: one small Markdown file (`FOLDER/summary.md`, also printed)
from what the run left in its folder.

    python benchmarks/acceptance_summary.py FOLDER --grid-wall-s S [--total-wall-s S --gpus N --mode full|tiny]

Reads (each optional: a step that failed leaves its line saying so):
  FOLDER/report/paper_vs_measured.csv  `bench report`'s paper table for the headline protocol (bench)
  FOLDER/report/protocols.csv          `bench report`'s protocol panel: the other protocols' cells (authors)
  FOLDER/results/trials/*.parquet      the grid's result rows (status, epochs_trained, train_subset, dataset)
  FOLDER/figures_resnet.csv            `bench calibrate --figures` for ResNet-34: every arm's images/s (and from
                                       them the CIFAR-10 table's device-hours, `benchmarks/big_models.py`'s projection)
  FOLDER/executors.csv                 the executor table `bench calibrate` wrote and the grid was planned from
  FOLDER/steps.tsv                     each step's name, exit code and seconds (the script writes it)

Paper agreement, per protocol: of the paper's MR cells (dataset, r, method) that the protocol measured, how many lie
within the paper's std (|measured mean - paper mean| <= paper std; a cell the paper gives std 0 must match exactly)
and the mean signed gap (measured - paper, in points). Cost: the grid's wall time, GPU-hours (wall x GPUs) and
training images/s (the sum over its trials of epochs_trained x training images, over the grid's wall time).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

RESNET = "resnet34_cifar"


@dataclass(frozen=True)
class Cell:
    method: str
    r: float
    paper_mean: float
    paper_std: float
    measured: float


@dataclass(frozen=True)
class Agreement:
    within: int
    cells: int
    mean_gap: float | None

    def words(self) -> str:
        if not self.cells:
            return "no paper cell measured"
        return (f"{self.within} of {self.cells} paper cells within the paper's std, mean signed gap "
                f"{self.mean_gap:+.2f} points")


def number(text: str | None) -> float | None:
    return None if text in (None, "", "null") else float(text)


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def paper_cells(report: Path) -> dict[str, list[Cell]]:
    """Per protocol, the paper's cells it measured: bench's from paper_vs_measured.csv, the others' (authors) from
    protocols.csv."""
    out: dict[str, list[Cell]] = {}
    for row in read_csv(report / "paper_vs_measured.csv"):
        mean, std, ours = number(row["paper_mean"]), number(row["paper_std"]), number(row["ours_mean"])
        if mean is not None and ours is not None:
            out.setdefault("bench", []).append(Cell(row["method"], float(row["r"]), mean, std or 0.0, ours))
    for row in read_csv(report / "protocols.csv"):
        mean, std, other = number(row["paper_mean"]), number(row["paper_std"]), number(row["other_mean"])
        if mean is not None and other is not None:
            out.setdefault(row["protocol"], []).append(Cell(row["method"], float(row["r"]), mean, std or 0.0, other))
    return out


def agreement(cells: list[Cell], methods: tuple[str, ...] | None = None) -> Agreement:
    """How many of `cells` (of `methods`; None: all) lie within the paper's std, and the mean signed gap."""
    these = [c for c in cells if methods is None or c.method in methods]
    if not these:
        return Agreement(0, 0, None)
    gaps = [c.measured - c.paper_mean for c in these]
    within = sum(abs(g) <= c.paper_std + 1e-9 for g, c in zip(gaps, these, strict=True))  # the CSV's 2 decimals
    return Agreement(within, len(these), sum(gaps) / len(gaps))


def trial_rows(results: Path) -> list[dict[str, object]]:
    """The grid's rows, the columns the summary reads (pyarrow: no polars needed to summarise)."""
    import pyarrow.parquet as pq

    columns = ["dataset", "status", "epochs_trained", "train_subset", "wall_s"]
    rows = []
    for path in sorted((results / "trials").glob("*.parquet")):
        table = pq.read_table(path)
        rows += table.select([c for c in columns if c in table.column_names]).to_pylist()
    return rows


def grid_cost(rows: list[dict[str, object]], wall_s: float, gpus: int,
              train_images: dict[str, int]) -> dict[str, float]:
    """Trials that ended (ok, failed), GPU-hours (wall x GPUs) and training images/s over the grid's wall time."""
    images = sum((r.get("epochs_trained") or 0) * (r.get("train_subset") or train_images[str(r["dataset"])])
                 for r in rows)
    return {"ended": len(rows), "ok": sum(r["status"] == "ok" for r in rows),
            "gpu_hours": wall_s * gpus / 3600, "images_per_s": images / wall_s if wall_s > 0 else 0.0}


def arm_lines(figures: list[dict[str, str]], model: str = RESNET) -> list[str]:
    """Each arm of `model` against solo fp32 on the same card: the best streams unit, the fast solo arm (bf16 and
    channels-last on CUDA), the best pack of each precision."""
    arms = {f["arm"]: float(f["images_per_s"]) for f in figures if f["model"] == model}
    if "solo fp32" not in arms:
        return [f"{model}: not measured"]
    solo = arms["solo fp32"]
    lines = [f"{model} on {next(f['device'] for f in figures if f['model'] == model)}: solo fp32 {solo:,.0f} images/s"]
    groups = {"streams": lambda a: a.startswith("streams") and a != "streams 1",
              "solo bf16 + channels-last": lambda a: a.startswith("solo bf16"),
              "pack fp32": lambda a: a.startswith("pack") and a.endswith("fp32"),
              "pack bf16": lambda a: a.startswith("pack") and "bf16" in a}
    for label, chosen in groups.items():
        these = {a: v for a, v in arms.items() if chosen(a)}
        if these:
            best = max(these, key=these.get)
            lines.append(f"  {label}: best {best} {these[best]:,.0f} images/s, {these[best] / solo:.2f}x solo fp32")
        else:
            lines.append(f"  {label}: not measured here" + (" (CUDA only)" if "bf16" in label else ""))
    return lines


def projection_lines(figures: list[dict[str, str]]) -> list[str]:
    """The CIFAR-10 table's device-hours at ResNet-34's measured rates (`benchmarks/big_models.py`'s projection)."""
    rates = {f["arm"]: float(f["images_per_s"]) for f in figures if f["model"] == RESNET}
    if "solo fp32" not in rates:
        return []
    spec = importlib.util.spec_from_file_location("big_models", Path(__file__).with_name("big_models.py"))
    big_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(big_models)
    lines: list[str] = []
    big_models.projection(rates, out=lambda line: lines.append(line.replace("  ", "  projection: ", 1)
                                                                if line.startswith("  ") else line))
    return lines


def summary(folder: Path, grid_wall_s: float, total_wall_s: float | None, gpus: int, mode: str,
            train_images: dict[str, int], machine: str) -> str:
    lines = [f"# Acceptance run ({mode}), {datetime.date.today().isoformat()}, {machine}", ""]
    steps = [line.split("\t") for line in (folder / "steps.tsv").read_text().splitlines()] \
        if (folder / "steps.tsv").is_file() else []
    if steps:
        lines.append("steps: " + "; ".join(f"{name} exit {rc} in {float(s):.0f} s" for name, rc, s in steps))
    rows = trial_rows(folder / "results") if (folder / "results" / "trials").is_dir() else []
    cost = grid_cost(rows, grid_wall_s, gpus, train_images)
    lines.append(f"grid: {cost['ended']:.0f} trials ended ({cost['ok']:.0f} ok) in {grid_wall_s:.0f} s wall, "
                 f"{cost['gpu_hours']:.3f} GPU-hours ({gpus} GPU), {cost['images_per_s']:,.0f} training images/s"
                 + (f"; whole run {total_wall_s:.0f} s" if total_wall_s is not None else ""))
    cells = paper_cells(folder / "report")
    for protocol in sorted(cells, key=lambda p: (p != "bench", p)):
        both = agreement(cells[protocol], ("ce", "dmi"))
        lines.append(f"paper's MR cells, {protocol}: {agreement(cells[protocol]).words()} (CE and L_DMI: "
                     f"{both.within} of {both.cells})")
    if not cells:
        lines.append("paper's MR cells: none measured (no MR data, or the grid or report did not finish)")
    figures = read_csv(folder / "figures_resnet.csv")
    lines += arm_lines(figures)
    lines += projection_lines(figures)
    for row in read_csv(folder / "executors.csv"):
        if row["source"].startswith("bench calibrate"):
            lines.append(f"table row: {row['model']} on {row['device']}: {row['executor']} x{row['trials']}, "
                         f"{float(row['images_per_s'] or 0):,.0f} images/s ({row['measured']})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--grid-wall-s", type=float, required=True, help="the grid's wall time (bench run)")
    parser.add_argument("--total-wall-s", type=float, default=None, help="the whole run's wall time")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--mode", default="full")
    args = parser.parse_args(argv)
    import torch  # the card and the datasets' training-set sizes: torch is wherever bench runs

    from bench.data import registry

    sizes = {name: cls.split_sizes[0] for name, cls in registry().items()}
    card = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    text = summary(args.folder, args.grid_wall_s, args.total_wall_s, args.gpus, args.mode, sizes,
                   f"{card}, torch {torch.__version__}")
    (args.folder / "summary.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
