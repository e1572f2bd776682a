"""Every column set of the results folder, declared once: a trial row's core columns, the epochs table's columns,
and the per-epoch diagnostics' columns. The store writes them, the MLflow mirror logs them, the analysis reads them.
"""

from __future__ import annotations

DIAGNOSTIC_COLUMNS = ("test_acc", "train_clean_acc", "train_noisy_acc_flipped", "train_noisy_acc_kept",
                 "det_flagged", "det_precision", "det_recall", "det_auroc")


# Columns other tools rely on, first and in this order.
CORE_COLUMNS = [
    "trial_id", "experiment", "dataset", "model", "method", "noise", "r", "seed", "lr", "batch_size",
    "status", "best_epoch", "val_loss", "test_acc", "test_bal_acc", "last_test_acc", "noise_rate",
    "noise_hash", "wall_s", "device", "git_commit", "torch_version",
]


# The per-epoch curves of a trial: column -> its parquet (arrow) type.
EPOCH_COLUMNS = {"trial_id": "string", "stage": "string", "epoch": "int64", "train_loss": "float64",
                 "val_loss": "float64", "val_acc": "float64", "seconds": "float64",
                 **dict.fromkeys(DIAGNOSTIC_COLUMNS, "float64")}
