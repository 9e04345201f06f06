"""Train a small classifier with PyTorch DistributedDataParallel, one process per machine, the
way a Vertex AI custom job runs it.

Vertex gives every replica MASTER_ADDR, MASTER_PORT, WORLD_SIZE (machines) and RANK (this
machine), and, with a base output directory, AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and
AIP_TENSORBOARD_LOG_DIR as gs:// addresses. This script reaches the bucket through its /gcs/
mount, checkpoints every epoch, resumes from the last checkpoint when the job restarts (a Spot
preemption), and on SIGTERM finishes the epoch, checkpoints and exits 143.

    python train.py --epochs 5                      # one process, outputs in ./model etc.
    torchrun --nproc-per-node 2 train.py --epochs 5 # two local processes
"""

import argparse
import csv
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def on_disk(uri: str) -> str:
    """gs://bucket/path -> /gcs/bucket/path, where Vertex mounts the bucket."""
    return "/gcs/" + uri[len("gs://"):] if uri.startswith("gs://") else uri


def load(path: str) -> TensorDataset:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))[1:]
    features = torch.tensor([[float(v) for v in row[:-1]] for row in rows])
    labels = torch.tensor([int(row[-1]) for row in rows])
    return TensorDataset(features, labels)


def parse_args():
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--data", default="data", help="folder with train.csv and test.csv")
    p.add_argument("--model-dir", default=env("AIP_MODEL_DIR", "model"))
    p.add_argument("--checkpoint-dir", default=env("AIP_CHECKPOINT_DIR", "checkpoints"))
    p.add_argument("--log-dir", default=env("AIP_TENSORBOARD_LOG_DIR", "logs"))
    return p.parse_args()


def main() -> int:
    args = parse_args()
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if world > 1:
        dist.init_process_group("nccl" if device == "cuda" else "gloo")  # reads MASTER_ADDR etc.
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # finish the epoch, then stop

    torch.manual_seed(0)
    train, test = load(os.path.join(args.data, "train.csv")), load(os.path.join(args.data, "test.csv"))
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ddp = DistributedDataParallel(model) if world > 1 else model

    checkpoint = os.path.join(on_disk(args.checkpoint_dir), "checkpoint.pt")
    start = 0
    if os.path.exists(checkpoint):  # the job restarted: carry on from the last epoch
        state = torch.load(checkpoint, map_location=device)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
        print(f"resumed from {checkpoint} after epoch {start}", flush=True)
    writer = None
    if rank == 0:  # only the chief writes TensorBoard summaries (imported here: it is slow to load)
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(on_disk(args.log_dir))

    for epoch in range(start, args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(ddp(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            x, y = test.tensors
            logits = model(x.to(device))
            test_loss = nn.functional.cross_entropy(logits, y.to(device)).item()
            accuracy = (logits.argmax(1).cpu() == y).float().mean().item()
        print(f"Epoch {epoch + 1}/{args.epochs}: train loss {loss.item():.4f}, "
              f"test loss {test_loss:.4f}, test accuracy {accuracy:.3f}", flush=True)
        if rank == 0:
            writer.add_scalar("loss/test", test_loss, epoch + 1)
            writer.add_scalar("accuracy/test", accuracy, epoch + 1)
            writer.flush()
            os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                       checkpoint + ".tmp")
            os.replace(checkpoint + ".tmp", checkpoint)
        stopping = torch.tensor([1.0 if stop else 0.0])
        if world > 1:  # every replica stops after the same epoch
            dist.all_reduce(stopping, op=dist.ReduceOp.MAX)
        if stopping.item():
            print(f"SIGTERM: stopped after epoch {epoch + 1}, checkpoint saved", flush=True)
            return 143

    if rank == 0:
        os.makedirs(on_disk(args.model_dir), exist_ok=True)
        torch.save(model.state_dict(), os.path.join(on_disk(args.model_dir), "model.pt"))
        writer.close()
        print(f"model saved to {args.model_dir}", flush=True)
    if world > 1:
        dist.barrier()  # the others wait while the chief writes: none leaves a peer mid-call
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
