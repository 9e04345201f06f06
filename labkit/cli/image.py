"""`labkit image`: build labkit's container image with Cloud Build, or print how.

With credentials, a project, a region and the gcloud CLI it creates the Artifact Registry
repository (once) and runs the build; otherwise, or with --dry-run, it prints the exact
commands and what is missing. Jobs run this image by default (`labkit.vertex.images`).
"""

from __future__ import annotations

import argparse


def add_image_command(subparsers) -> None:
    p = subparsers.add_parser(
        "image", help="build labkit's training image with Cloud Build (or print the commands)",
        description="Build labkit's container image (the Dockerfile at the source root: labkit "
                    "with one framework at pyproject's minimum versions or newer) with Cloud "
                    "Build and push it to Artifact Registry. Without a configured cloud, or with "
                    "--dry-run, print the exact commands instead.")
    p.add_argument("--framework", choices=("torch", "tf"), default="torch")
    p.add_argument("--project", default=None)
    p.add_argument("--region", default=None)
    p.add_argument("--tag", default=None,
                   help="image tag (default: a digest of the sources the image is built from)")
    p.add_argument("--torch-cuda", choices=("cu128", "cu126"), default=None,
                   help="PyTorch's CUDA wheels for the torch image (default cu128: Turing to Blackwell; "
                        "cu126 runs P4, P100 and V100 but not Blackwell; the tag ends in -cu126)")
    p.add_argument("--dry-run", action="store_true", help="only print the commands")
    p.set_defaults(handler=_image_command)


def _image_command(args: argparse.Namespace) -> int:
    from labkit.vertex.images import build, build_plan

    plan = build_plan(args.framework, project=args.project, region=args.region, tag=args.tag,
                      torch_cuda=args.torch_cuda)
    print(plan.text())
    if args.dry_run or not plan.ready:
        if plan.ready:
            print("dry run: nothing built")
        return 0
    return build(plan)
