"""Step 2: the fix the profile of step 1 named. The JPEGs are decoded by DataLoader worker
processes while the model trains, batches are pinned for a fast copy to the GPU, and the
workers live across epochs.

    python step2_loader.py --data images --epochs 3 --num-workers 4
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

    def __init__(self, folder, size):
        self.classes = sorted(p.name for p in Path(folder).iterdir() if p.is_dir())
        self.files = [(f, i) for i, c in enumerate(self.classes) for f in sorted((Path(folder) / c).glob("*.jpg"))]
        self.size = size

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        path, label = self.files[index]
        image = Image.open(path).convert("RGB").resize((self.size, self.size))
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
        return pixels.permute(2, 0, 1), label


class SmallCNN(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def evaluate(model, loader, device):
    model.eval()
    loss = right = total = 0.0
    with torch.no_grad():
        for x, y in loader:
            logits = model(x.to(device))
            loss += nn.functional.cross_entropy(logits, y.to(device), reduction="sum").item()
            right += (logits.argmax(1).cpu() == y).sum().item()
            total += len(y)
    model.train()
    return loss / total, right / total


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", default="images")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--out", default="model.pt")
    p.add_argument("--num-workers", type=int, default=4)
    args = p.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train = JpegFolder(f"{args.data}/train", args.image_size)
    val = JpegFolder(f"{args.data}/val", args.image_size)
    workers = {"num_workers": args.num_workers, "pin_memory": device == "cuda",
               "persistent_workers": args.num_workers > 0}
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, **workers)
    val_loader = DataLoader(val, batch_size=args.batch_size, **workers)
    model = SmallCNN(len(train.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    print(f"{len(train)} training images, {len(val)} held out, {len(train.classes)} classes, on {device}")
    for epoch in range(args.epochs):
        start = time.time()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        test_loss, accuracy = evaluate(model, val_loader, device)
        print(f"Epoch {epoch + 1}/{args.epochs}: train loss {loss.item():.4f}, test loss {test_loss:.4f}, "
              f"test accuracy {accuracy:.3f} ({time.time() - start:.3f}s)", flush=True)
    torch.save(model.state_dict(), args.out)


if __name__ == "__main__":
    main()
