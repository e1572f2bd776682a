"""Plug-ins: contract tests over every registered dataset and method (plug-in folders included), the refusal of a
method on noise it cannot use, and docs/extending.md's two templates run as a plug-in folder, with nothing else
edited."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from bench import models
from bench.cli import check
from bench.cli.main import main
from bench.data import registry as datasets
from bench.exec.executor import executors
from bench.methods import registry as methods
from bench.report.analysis import LITERATURE_CSV, read_published, read_reference
from tests import doc_examples

# Datasets with a pattern of the paper's tables, by the reference file (bench/reference_results.csv).
REFERENCE = read_reference()
PUBLISHED = read_published()


# -- every dataset and method: `bench check`'s cheap contracts (bench/cli/check.py), the same code -----------------
@pytest.mark.parametrize("name", list(datasets()))
def test_every_dataset_is_described_and_its_noise_patterns_build_row_stochastic_matrices(name, tmp_path):
    check.dataset_described(name, tmp_path)
    check.dataset_noise(name, tmp_path)


@pytest.mark.parametrize("name", list(methods()))
def test_every_method_is_described_and_answers_refuses(name, tmp_path):
    check.method_described(name, tmp_path)


@pytest.mark.parametrize("name", list(datasets()))
def test_dataset_paper_mapping_points_at_published_rows(name):
    dataset = datasets()[name]
    rows = PUBLISHED.filter(pl.col("dataset") == name)
    if dataset.paper_noise is None:
        assert rows.height == 0, f"the published tables have rows for {name}; say which pattern they are"
        return
    assert dataset.paper_noise in dataset.noise_patterns
    assert rows.height > 0
    levels = rows["noise_r"].drop_nulls().to_list()
    if dataset.paper_noise in dataset.noise_levels:  # real noise at published levels: each row names its level
        assert len(levels) == rows.height and set(levels) <= set(dataset.noise_levels[dataset.paper_noise])
    elif dataset.is_real_noise(dataset.paper_noise):
        assert levels == []  # real noise: the table records no r
    else:
        assert all(0 <= r <= 1 for r in levels) and len(levels) == rows.height


def test_every_published_table_belongs_to_a_dataset():
    claimed = {name for name, cls in datasets().items() if cls.paper_noise is not None}
    assert set(PUBLISHED["dataset"].unique()) == claimed
    assert set(REFERENCE["dataset"].unique()) == {"cifar10", "dogs_vs_cats", "mr", "clothing1m"}  # the paper's
    literature = read_reference(LITERATURE_CSV)
    assert set(literature["dataset"]) == {"webvision_mini", "webvision_mini_ilsvrc12", "animal10n", "food101n",
                                          "red_mini_imagenet"}
    # each row cites paper and table (or figure): tests/report/test_literature.py checks the other columns
    assert literature["source"].str.contains(r"\(\w+ 20\d\d\), (Table \d+|Figure): ").all()
    assert literature.filter(dataset="webvision_mini", method="dividemix")["acc_mean"].to_list() == [77.32]


def test_every_model_is_registered_once_with_its_packing():
    found = models.registry()
    assert {cls.name for cls in found.values()} == set(found)
    assert {name for name, cls in found.items() if cls.packable} == {"mlp", "fashion_cnn", "word_cnn", "resnet34_cifar",
                                                                      "vgg16_bn", "resnet50", "word_cnn_authors",
                                                                      "resnet18_cifar", "linear_probe"}
    assert {cls.model for cls in datasets().values()} <= set(found)


def test_fw_oracle_refuses_real_noise_only():
    oracle, ds = methods()["fw_oracle"], datasets()
    assert "true T" in oracle.refuses(ds["cifar10n"], "aggre")
    assert "true T" in oracle.refuses(ds["clothing1m"], "real")
    assert oracle.refuses(ds["synthetic"], "case3") is None and oracle.refuses(ds["cifar10n"], "uniform") is None


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert len(err) == 1 and err[0].startswith("bench: error:"), err
    return err[0]


def test_a_refused_combination_stops_trial_and_dry_run_before_anything(tmp_path, capsys):
    # No CIFAR-10N files anywhere: the refusal comes before the data check, and nothing is written.
    assert main(["trial", "--dataset", "cifar10n", "--method", "fw_oracle", "--noise", "aggre", "--r", "0",
                 "--data-root", str(tmp_path / "none"), "--results", str(tmp_path / "res")]) == 2
    line = one_error_line(capsys)
    assert "fw_oracle cannot run on noise 'aggre' of cifar10n" in line and "true T" in line
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(dict(name="oracle", dataset="cifar10n", noise=["uniform", "aggre"], r=0.2,
                                          seeds=1, methods={"ce": {}, "fw_oracle": {}})))
    assert main(["run", str(config), "--dry-run", "--results", str(tmp_path / "res")]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"bench: error: {config}: methods.fw_oracle: cannot run on noise 'aggre'"), line
    assert not (tmp_path / "res").exists()


# -- the templates of docs/extending.md, as a plug-in folder --------------------------------------------------------
# Loaded under fresh names (tests/doc_examples.py): the page's own names are the reader's, and may be in the checkout.
METHOD, DATASET = doc_examples.method_and_dataset()


def reload_registries() -> None:
    """The plug-in registries read `$BENCH_PLUGINS` again at their next call."""
    for registry in (datasets, methods, models.registry, executors):
        registry.cache_clear()


def templates(tmp_path: Path, panel: bool = False, executor: bool = False) -> Path:
    """A plug-in folder of the page's method and dataset, and its panel and executor where asked."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, code in doc_examples.fresh_files().items():
        (folder / name).write_text(code)
    if panel:
        (folder / "seeds_panel.py").write_text(doc_examples.renamed(doc_examples.panel()))
    if executor:
        (folder / "sequence.py").write_text(doc_examples.renamed(doc_examples.executor()))
    return folder


@pytest.fixture
def plugin_folder(tmp_path, monkeypatch):
    folder = templates(tmp_path)
    monkeypatch.setenv("BENCH_PLUGINS", str(folder))
    reload_registries()
    yield folder
    monkeypatch.delenv("BENCH_PLUGINS")
    reload_registries()


def test_the_docs_templates_are_one_file_each_and_train(plugin_folder, tmp_path, capsys):
    from bench.exec.prepare import prepare
    from bench.trial import TrialConfig

    assert len(doc_examples.files()) == 2 and sorted(p.name for p in plugin_folder.iterdir()) == sorted(
        [f"{METHOD}.py", f"{DATASET}.py"])
    assert DATASET in datasets() and METHOD in methods()
    assert main(["datasets"]) == 0 and DATASET in capsys.readouterr().out
    assert main(["methods"]) == 0 and METHOD in capsys.readouterr().out

    # The noisy labels of the new pattern follow the T the doc declares, written out here by hand.
    r = 0.3
    declared = np.array([[1 - r, r, 0], [0, 1 - r, r], [r, 0, 1 - r]])
    config = TrialConfig(dataset=DATASET, method=METHOD, noise="next_class", r=r, seed=3)
    p = prepare(config, tmp_path)
    clean, noisy = p.splits.train.y, p.labels.train
    for true_class in range(3):
        drawn = noisy[clean == true_class]
        observed = np.bincount(drawn, minlength=3) / len(drawn)
        # Hoeffding with a union bound over the 9 entries, delta = 1e-6.
        bound = math.sqrt(math.log(2 * 9 / 1e-6) / (2 * len(drawn)))
        assert np.abs(observed - declared[true_class]).max() <= bound, (true_class, observed)
    assert 0 < np.mean(noisy != clean) < 2 * r

    results = tmp_path / "res"
    assert main(["trial", "--dataset", DATASET, "--method", METHOD, "--noise", "next_class", "--r", str(r),
                 "--seed", "3", "--param", "order=3", "--epochs-warmup", "1", "--epochs", "2",
                 "--results", str(results)]) == 0
    row = pl.read_parquet(next((results / "trials").glob("*.parquet"))).row(0, named=True)
    assert (row["dataset"], row["method"], row["noise"], row["status"]) == (DATASET, METHOD, "next_class", "ok")
    assert row["noise_rate"] == pytest.approx(np.mean(noisy != clean))  # the same labels as drawn above
    assert 33.3 < row["test_acc"] <= 100  # three blobs two standard deviations apart: better than chance


def test_a_panel_plug_in_never_loads_in_the_training_core(tmp_path, monkeypatch):
    """On a bare GPU box (torch and numpy, no polars, scipy, matplotlib, mlflow or ray), a trial of the doc's plug-in
    dataset and method trains beside the doc's panel plug-in in the same folder: only the registry of a plug-in's own
    kind imports it. Every registry used to import every plug-in file, so `get_dataset` failed on the panel's polars."""
    import subprocess
    import sys

    folder = templates(tmp_path, panel=True)
    bare = ("polars", "scipy", "matplotlib", "mlflow", "ray")
    results = tmp_path / "res"
    code = (f"import sys\nfor m in {bare!r}: sys.modules[m] = None  # import m now raises ImportError\n"
            "from bench.cli.main import main\n"
            f"code = main(['trial', '--dataset', {DATASET!r}, '--method', {METHOD!r}, '--noise', 'next_class', "
            f"'--r', '0.2', '--seed', '1', '--epochs-warmup', '1', '--epochs', '1', '--results', {str(results)!r}])\n"
            f"assert not [m for m in {bare!r} if sys.modules.get(m) is not None]\n"
            "sys.exit(code)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "BENCH_PLUGINS": str(folder), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((results / "trials").glob("*.parquet"))) == 1
    # The panel is still a panel: the report's registry imports it (and the training registries do not).
    from bench.config import plugin_modules

    monkeypatch.setenv("BENCH_PLUGINS", str(folder))
    kinds = {kind: [m.__file__ for m in plugin_modules(kind)] for kind in [("bench.report.panel",), ("bench.data",)]}
    assert [Path(f).name for f in kinds[("bench.report.panel",)]] == ["seeds_panel.py"]
    assert "seeds_panel.py" not in [Path(f).name for f in kinds[("bench.data",)]]


# -- `bench check` on the docs' examples, and on a broken plug-in of each kind --------------------------------------
def test_bench_check_passes_the_docs_examples_as_a_plug_in_folder(tmp_path, monkeypatch, capsys):
    """The page's method, dataset, executor and panel in one folder, under fresh names: every contract holds."""
    folder = templates(tmp_path, panel=True, executor=True)
    monkeypatch.setenv("BENCH_PLUGINS", "")  # bench check names the folder; the test restores the variable
    try:
        assert main(["check", str(folder)]) == 0, capsys.readouterr().out
        assert capsys.readouterr().out == "bench check: every contract holds\n"
        found = check.selected([folder.resolve()])
        assert {kind: sorted(names) for kind, names in found.items() if names} == {
            "method": [METHOD], "dataset": [DATASET], "executor": ["sequence" + doc_examples.FRESH],
            "panel": ["seeds" + doc_examples.FRESH]}
    finally:
        reload_registries()


BROKEN = {  # what each broken plug-in changes in the docs' example, and the contract it breaks
    "method": ("return sum(", "return float('nan') * sum(", "trains a tiny trial"),
    "dataset": ("y = rng.integers(0, self.num_classes, n)", "y = rng.integers(0, self.num_classes, n) + 1",
                "labels its classes"),
    "panel": ("        seeds = ctx.df", "        (ctx.folder / '..' / '..' / 'stray.csv').write_text('')\n"
              "        seeds = ctx.df", "writes only inside the report folder"),
}


def test_bench_check_names_the_contract_a_broken_plug_in_breaks_in_one_line(tmp_path, monkeypatch, capsys):
    """A method whose loss is NaN, a dataset whose labels are off by one (label 3 of 3 classes) and a panel that
    writes beside the report's folder: one line each, naming the plug-in and its contract; exit code 1."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    method, dataset = (doc_examples.renamed(code) for code in doc_examples.files().values())
    examples = {"method": method, "dataset": dataset, "panel": doc_examples.renamed(doc_examples.panel())}
    for kind, (old, new, _) in BROKEN.items():
        assert examples[kind].count(old) == 1, kind  # the example still reads as the change expects
        (folder / f"broken_{kind}.py").write_text(examples[kind].replace(old, new))
    monkeypatch.setenv("BENCH_PLUGINS", "")  # bench check names the folder; the test restores the variable
    try:
        assert main(["check", str(folder)]) == 1
        lines = capsys.readouterr().out.splitlines()
    finally:
        reload_registries()
    names = {"method": METHOD, "dataset": DATASET, "panel": "seeds" + doc_examples.FRESH}
    assert len(lines) == 3, lines
    for kind, (_, _, contract) in BROKEN.items():
        assert [line for line in lines if line.startswith(f"bench check: {kind} {names[kind]}: {contract}: ")], \
            (kind, lines)


def test_a_column_no_row_makes_or_mlflow_logs_otherwise_breaks_its_contract(monkeypatch, capsys):
    """`bench check bench/store/columns.py` trains one tiny trial for every column: a column declared but made by
    no row, and one declared a param that the mirror logs as a metric, are one line each; the others hold."""
    from bench.store.columns import ROW, Column

    columns = str(Path(check.__file__).parents[1] / "store" / "columns.py")
    with monkeypatch.context() as patched:
        patched.setitem(ROW, "never_made", Column("never_made", "float64", "measurement", "metric"))
        assert main(["check", columns]) == 1
        assert capsys.readouterr().out.splitlines() == [
            "bench check: column never_made: is written: no trial's row makes it (bench.store.rows.make_row)"]
    test_acc = ROW["test_acc"]
    monkeypatch.setitem(ROW, "test_acc", Column("test_acc", test_acc.type, test_acc.group, "param"))
    assert main(["check", columns]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "bench check: column test_acc: is logged as declared: a trial's MLflow run holds no param test_acc"]


def test_a_dataset_whose_files_lie_at_the_data_root_trains_on_its_stand_in(tmp_path):
    """CIFAR-10's files lie at the data root itself (no `folder`): its contract writes its stand-in, as for every
    dataset read from files, rather than looking for the published files."""
    cifar10 = datasets()["cifar10"]
    assert cifar10.folder == "" and cifar10.files and cifar10.offers_stand_in()
    check.dataset_trains("cifar10", tmp_path)
    assert (tmp_path / "results" / "trials").is_dir()
