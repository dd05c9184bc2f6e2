"""Each rank builds only its own rows of the global batch, and before its step's timer starts."""

from __future__ import annotations

import time
import types
from typing import Any

import numpy as np
import pytest
import torch

from scalelab.measure import train
from scalelab.measure.train import TokenData, Trainer


@pytest.mark.parametrize("tokens", [False, True])
def test_rows_of_a_batch_are_the_global_batch_rows(tokens: bool, tmp_path: Any) -> None:
    path = None
    if tokens:
        path = str(tmp_path / "tokens.npy")
        np.save(path, np.arange(5000, dtype=np.int64) % 256)
    data = TokenData(256, 32, seed=3, path=path)
    inputs, labels = data.batch(7, 16)
    for rank in range(4):
        rows = slice(4 * rank, 4 * rank + 4)
        x, y = data.batch(7, 16, rows)
        assert x.shape == (4, 32)
        assert torch.equal(x, inputs[rows]) and torch.equal(y, labels[rows])


class _Spy(TokenData):
    def __init__(self) -> None:
        super().__init__(256, 32, seed=0)
        self.built_rows: list[int] = []

    def batch(
        self, step: int, global_batch: int, rows: slice | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().batch(step, global_batch, rows)
        self.built_rows.append(x.shape[0])
        return x, y


def test_a_rank_builds_only_its_rows() -> None:
    spy = _Spy()
    fake: Any = types.SimpleNamespace(
        data=spy,
        layout=types.SimpleNamespace(global_batch=2048),
        dp_rank=3,
        local_batch=2048 // 8,
        info=types.SimpleNamespace(device=torch.device("cpu")),
    )
    x, _ = Trainer.local_data(fake, 0)
    assert spy.built_rows == [256], "the whole global batch was materialised"
    assert torch.equal(x, TokenData(256, 32, seed=0).batch(0, 2048)[0][768:1024])


class _SlowDataTrainer:
    """A step that takes no time and data that takes 0.2 s to build."""

    def __init__(self) -> None:
        self.info = types.SimpleNamespace(device=torch.device("cpu"))

    def local_data(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(0.2)
        return torch.zeros(1), torch.zeros(1)

    def step(
        self, step: int, batch: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if batch is None:
            batch = self.local_data(step)
        return torch.zeros(()), torch.zeros(())


def test_data_is_built_outside_the_timed_step() -> None:
    times, _, _ = train._timed_steps(_SlowDataTrainer(), 0, 3)  # type: ignore[arg-type]
    assert max(times) < 0.1, times
