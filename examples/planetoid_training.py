"""The training loop the Planetoid examples share: full-batch node classification with Adam.

Each epoch takes one optimizer step on the training nodes' cross entropy, then evaluates
all three splits; the test accuracy at the best validation epoch is returned, as in the
GAT paper.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def train_node_classifier(
    model: torch.nn.Module,
    logits_of: Callable[[], torch.Tensor],
    y: torch.Tensor,
    masks: dict[str, torch.Tensor],
    epochs: int,
    lr: float = 0.005,
    weight_decay: float = 5e-4,
    train_epoch: Callable[[torch.optim.Optimizer], torch.Tensor] | None = None,
) -> float:
    """Train ``model`` for ``epochs``; ``logits_of()`` runs it on the whole graph ([N, classes]).

    ``masks`` holds boolean node masks ``train``, ``val`` and ``test``.  An epoch is one full-batch
    step on the training nodes, or ``train_epoch(optimizer)`` (returning its last loss: mini-batches).
    Prints progress every 10 epochs; returns the test accuracy at the best validation epoch.
    """
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    best_val, best_test = -1.0, 0.0
    started = time.perf_counter()
    for epoch in range(1, epochs + 1):
        model.train()
        if train_epoch is not None:
            loss = train_epoch(optimizer)
        else:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(logits_of()[masks["train"]], y[masks["train"]])
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            pred = logits_of().argmax(1)
        acc = {k: (pred[m] == y[m]).float().mean().item() for k, m in masks.items()}
        if acc["val"] >= best_val:
            best_val, best_test = acc["val"], acc["test"]
        if epoch % 10 == 0 or epoch == epochs:
            print(f"epoch {epoch:3d}  loss {loss.item():.4f}  train {acc['train']:.3f}  val {acc['val']:.3f}  "
                  f"test {acc['test']:.3f}  ({time.perf_counter() - started:.1f} s)", flush=True)
    print(f"test accuracy at the best validation epoch: {best_test:.3f} (val {best_val:.3f})")
    return best_test
