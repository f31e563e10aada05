#!/usr/bin/env python3
"""A small elastic PyTorch training job for Muster (CPU, gloo backend).

Launched by torchrun (`muster submit --torchrun`, or by hand):

    python -m torch.distributed.run --nnodes=1 --nproc-per-node=2 \
        --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29500 --rdzv-id=demo \
        examples/train_elastic.py --steps 50 --ckpt-every 10 --ckpt-dir /shared/ckpt

It fits a linear model to synthetic data (fixed seed), averaging gradients across all
ranks with all_reduce, so it runs at any world size. Rank 0 checkpoints every
`--ckpt-every` steps (written to a temporary file, then renamed: a reader never sees a
half-written checkpoint); on start every rank resumes from the checkpoint if there is
one, so a job that Muster restarts after a fault, possibly on fewer nodes, continues
where it was. One line per step on stdout:

    step=12 world_size=3 rank=0 loss=0.1234 restart=0
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

FEATURES = 8
CHECKPOINT = "checkpoint.pt"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="train until this step")
    parser.add_argument("--ckpt-every", type=int, default=10, help="checkpoint period (steps)")
    parser.add_argument(
        "--ckpt-dir",
        default=os.environ.get("MUSTER_CHECKPOINT_DIR", "checkpoints"),
        help="shared checkpoint directory (default: $MUSTER_CHECKPOINT_DIR or ./checkpoints)",
    )
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=1234)
    return parser.parse_args(argv)


def true_weights(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(FEATURES, 1, generator=gen), torch.randn(1, generator=gen)


def batch(seed: int, step: int, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's samples for `step`: reproducible whatever the restart history."""
    w, b = true_weights(seed)
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(size, FEATURES, generator=gen)
    noise = 0.01 * torch.randn(size, 1, generator=gen)
    return x, x @ w + b + noise


def load_checkpoint(directory: Path, model: torch.nn.Module, opt: torch.optim.Optimizer) -> int:
    path = directory / CHECKPOINT
    if not path.exists():
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_checkpoint(
    directory: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer
) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{CHECKPOINT}.{os.getpid()}.tmp"
    state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
    torch.save(state, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, directory / CHECKPOINT)


def average_gradients(model: torch.nn.Module, world_size: int) -> None:
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad, op=dist.ReduceOp.SUM)
            param.grad /= world_size


def say(line: str) -> None:
    """One whole line per write: ranks sharing an output file never split a line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    restart = os.environ.get("MUSTER_RESTART_COUNT") or os.environ.get(
        "TORCHELASTIC_RESTART_COUNT", "0"
    )
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    model = torch.nn.Linear(FEATURES, 1)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    directory = Path(args.ckpt_dir)
    start = load_checkpoint(directory, model, opt)
    if start:
        say(
            f"resumed_from={start} world_size={world_size} rank={rank} "
            f"local_rank={local_rank} restart={restart}"
        )

    for step in range(start + 1, args.steps + 1):
        x, y = batch(args.seed, step, rank, args.batch)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves it unannotated
        average_gradients(model, world_size)
        opt.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
        mean_loss /= world_size
        say(
            f"step={step} world_size={world_size} rank={rank} "
            f"loss={mean_loss.item():.4f} restart={restart}"
        )
        if rank == 0 and (step % args.ckpt_every == 0 or step == args.steps):
            save_checkpoint(directory, step, model, opt)
        if args.sleep:
            time.sleep(args.sleep)

    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
