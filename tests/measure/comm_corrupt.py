"""`scalelab comm` with a deliberately corrupted all-gather on rank 1 (run under torchrun by
tests/measure/test_comm_check.py): after each real all-gather, rank 1 adds 1 to the first element
of its result, so that the result check must count one wrong element per checked mode."""

from __future__ import annotations

import sys

import torch.distributed as dist

from scalelab.cli import main

_real_all_gather = dist.all_gather_single


def _corrupted_all_gather(output, input, *args, **kwargs):  # type: ignore[no-untyped-def]
    result = _real_all_gather(output, input, *args, **kwargs)
    if dist.get_rank() == 1:
        output.view(-1)[0] += 1
    return result


if __name__ == "__main__":
    dist.all_gather_single = _corrupted_all_gather
    main(sys.argv[1:])
