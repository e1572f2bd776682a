"""Fashion-MNIST and CIFAR-10: the same weights through bench and the authors' code (issue #36 item 2): the weights,
a forward pass, L_DMI and a step. (Their scripts seed nothing; Fashion-MNIST's whole run, with a declared seed, is
matched by tests/protocol/test_fashion_authors_exact.py.)

The figures below were printed by the authors' own `CNNModel` (Newbeeer/L_DMI, fashion/fashion.py:227-254) and
`DMI_loss` (fashion/main.py:15-23, the matrix averaged over the batch), commit 7d5e4bc, taken out of their modules
(which load the data at import) and run under the portable numerics' pins (`bench.numerics`: the same on any x86-64
CPU; re-run for issue #53), torch 2.14.1, one thread, `Tensor.cuda` the identity: weights
from `torch.manual_seed(0)` at construction, a batch of N(0, 1) images from generator seed 1, labels from seed 2,
dropout from `torch.manual_seed(3)`, one `torch.optim.Adam(lr=1e-4)` step on the training-mode L_DMI, as their
main_dmi takes it (fashion/main.py:26-42, 118-121). Their code does not enter this repository; its printed figures
do, and bench's model (`fashion_cnn`), its `dmi_script_form` "mean" and its method-stage optimiser must give them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from bench import models
from bench.data import get_dataset
from bench.dmi import script_dmi_loss
from bench.exec.stage import make_optimizer
from tests.tolerances import f32

THEIRS = {  # printed by their code (repr of the float) under the portable numerics' pins, see above
    "eval_logits_sum": 40.77332670614123,
    "dmi_eval": 6.226678371429443,
    "dmi_train": 5.765130043029785,
    "after_step_logits_sum": 42.30684600584209,
    "after_step_dmi_eval": 6.477658748626709,
}


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Their figures are one thread's float order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_fashion_cnn_forward_loss_and_step_are_the_authors(portable_figures, one_thread) -> None:
    assert _figures() == THEIRS


def _figures() -> dict[str, float]:
    dataset = get_dataset("fashion_mnist")
    assert dataset.protocol("authors").setting("dmi_script_form") == "mean"
    torch.manual_seed(0)
    net = models.create(dataset.model, 2)
    x = torch.randn(128, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 2, (128,), generator=torch.Generator().manual_seed(2))
    figures = {}
    net.eval()
    with torch.no_grad():
        out = net(x)
    figures["eval_logits_sum"] = out.double().sum().item()
    figures["dmi_eval"] = script_dmi_loss(out, y, 2, "mean").item()
    net.train()
    torch.manual_seed(3)
    loss = script_dmi_loss(net(x), y, 2, "mean")
    figures["dmi_train"] = loss.item()
    optimizer = make_optimizer(list(net.parameters()), dataset.stage_schedule("dmi"))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    net.eval()
    with torch.no_grad():
        out = net(x)
    figures["after_step_logits_sum"] = out.double().sum().item()
    figures["after_step_dmi_eval"] = script_dmi_loss(out, y, 2, "mean").item()
    return figures


# Printed by their CIFAR-10 `ResNet34` (CIFAR-10/model.py, imported as is) and `DMI_loss` (CIFAR-10/DMI.py:12-19,
# taken out with ast: DMI.py loads the data at import), commit 7d5e4bc (both files as at 54e0d5d, which
# datasets/cifar10.py cites), under the same pins, one thread: weights from `torch.manual_seed(0)` at construction,
# 64 N(0, 1) images (generator seed 1) and labels (seed 2), a training-mode forward (batch statistics). At
# initialisation the 10 x 10 matrix is near singular, so both give -log(1e-3) exactly.
THEIR_CIFAR = {"init_sum": 8497.842005332033, "train_logits_sum": 2.201116345822811, "dmi_train": 6.907755374908447}


def test_resnet34_weights_are_the_authors_and_its_forward_within_the_pooling_rounding(portable_figures,
                                                                                      one_thread) -> None:
    """Bit-equal weights; the forward pass differs only where bench averages the last 4 x 4 map with `mean` and
    theirs with `avg_pool2d(4)`: each pooled value (16 non-negative terms) within f32(16, 1) of exact in both, and
    each logit's 512-term product rounded in both, which bounds the difference of the logits' sum."""
    dataset = get_dataset("cifar10")
    torch.manual_seed(0)
    net = models.create(dataset.model, 10)
    x = torch.randn(64, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(2))
    pooled = []
    net.classifier.register_forward_pre_hook(lambda _m, args: pooled.append(args[0].detach().double()))
    logits = net.train()(x)
    assert sum(p.double().sum().item() for p in net.parameters()) == THEIR_CIFAR["init_sum"]
    w, b = net.classifier.weight.detach().double().abs(), net.classifier.bias.detach().double().abs()
    products = pooled[0] @ w.T + b  # (64, 10): sum_j |W_ij| p_j + |b_i| per logit (p_j >= 0 after the ReLU)
    bound = float((2 * f32(16, 1) * (pooled[0] @ w.T) + 2 * f32(513) * products).sum())
    assert abs(logits.double().sum().item() - THEIR_CIFAR["train_logits_sum"]) <= bound
    assert script_dmi_loss(logits, y, 10, dataset.protocol("authors").setting("dmi_script_form")).item() \
        == THEIR_CIFAR["dmi_train"]
