"""Train a small image classifier on a folder of JPEG files, the way a first script usually
looks: its own Dataset (one subfolder per class), its own model, one device, a plain loop.

    python train.py --data images --epochs 3
    python train.py --data images --epochs 3 --num-workers 4    # decode JPEGs in parallel

It prints the loss every few steps and the held-out accuracy after each epoch, and saves the
weights to --out.
"""

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset


class JpegFolder(Dataset):
    """DIR/<class>/<image>.jpg -> (a CHW float tensor in [0, 1], the class index)."""

    def __init__(self, folder: str, size: int):
        self.classes = sorted(p.name for p in Path(folder).iterdir() if p.is_dir())
        self.files = [(f, i) for i, c in enumerate(self.classes) for f in sorted((Path(folder) / c).glob("*.jpg"))]
        self.size = size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        path, label = self.files[index]
        image = Image.open(path).convert("RGB").resize((self.size, self.size))
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
        return pixels.permute(2, 0, 1), label


class SmallCNN(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def evaluate(model, loader, device) -> float:
    model.eval()
    right = total = 0
    with torch.no_grad():
        for x, y in loader:
            right += (model(x.to(device)).argmax(1).cpu() == y).sum().item()
            total += len(y)
    model.train()
    return right / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", default="images", help="folder with train/ and val/, one subfolder per class")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--out", default="model.pt")
    args = p.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train = JpegFolder(f"{args.data}/train", args.image_size)
    val = JpegFolder(f"{args.data}/val", args.image_size)
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers)
    val_loader = DataLoader(val, batch_size=args.batch_size, num_workers=args.num_workers)
    model = SmallCNN(len(train.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(f"{len(train)} training images, {len(val)} held out, {len(train.classes)} classes, on {device}")
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        for step, (x, y) in enumerate(loader, 1):
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step}: loss {loss.item():.4f}", flush=True)
        accuracy = evaluate(model, val_loader, device)
        print(f"Epoch {epoch}/{args.epochs}: held-out accuracy {accuracy:.3f} ({time.time() - start:.1f}s)", flush=True)
    torch.save(model.state_dict(), args.out)
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
