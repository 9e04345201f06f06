"""Submitting distributed training to Vertex AI with the google-cloud-aiplatform SDK: worker pools,
Spot VMs, Reduction Server.

    python -m labkit.recipes.vertex_job --project PROJECT --region us-central1 --bucket gs://BUCKET \
        --image-uri IMAGE --machine-type a2-highgpu-1g --accelerator NVIDIA_TESLA_A100 \
        --replicas 2 --reduction-servers 2 --spot --wait -- --model gpt --steps 1000 --batch-size 256

Every training replica runs labkit.recipes.ddp under torchrun, one process per GPU; the flags
after `--` go to it. IMAGE must hold PyTorch and the training code (labkit here).

Worker pools, by position: 0 the primary replica (always exactly one), 1 the other workers,
2 parameter servers or Reduction Server, 3 evaluators. A Reduction Server pool runs Google's
reducer image on CPU machines: the GPUs' NCCL all-reduce goes through the reducers, which
suits many GPU nodes on slow links; the training code does not change, but the training image
needs Reduction Server's NCCL transport plugin (see Vertex AI's Reduction Server guide).
Spot VMs cost much less and can be taken back at any time: the training code must checkpoint
and resume (labkit.recipes.preemptible). The job's outputs go under a base output directory;
Vertex passes its subfolders to the code as AIP_MODEL_DIR, AIP_CHECKPOINT_DIR and
AIP_TENSORBOARD_LOG_DIR, and mounts the bucket at /gcs/BUCKET.

Vertex AI TensorBoard: --tensorboard projects/P/locations/L/tensorboards/ID uploads the event
files found under AIP_TENSORBOARD_LOG_DIR to that TensorBoard while the job runs. It sees a file
only once Cloud Storage holds it as a finished object, and a file written through /gcs becomes one
when it is closed (Cloud Storage FUSE does not finalize on fsync with streaming writes), so write
event files on local disk and copy them there every half minute, as labkit's writer does, or the
curves appear when training ends. Vertex requires --service-account with it, an account that can write the bucket and
use Vertex AI (Use Vertex AI TensorBoard with custom training,
https://docs.cloud.google.com/gemini-enterprise-agent-platform/machine-learning/experiments/tensorboard-training,
read 2026-11-26). --env NCCL_DEBUG=INFO (repeatable) sets a variable in every training container.

--endpoint sends the request to another JobService, such as the local fake in
labkit.vertex.fake_service (which needs no sign-in).
"""

from __future__ import annotations

import argparse
import shlex
import time
from datetime import datetime

from google.auth.credentials import AnonymousCredentials
from google.cloud import aiplatform
from google.cloud.aiplatform_v1 import JobState, Scheduling

REDUCTION_SERVER_IMAGE = "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"

# Run by every training replica before torchrun (argument: the job's node count). Vertex sets
# CLUSTER_SPEC on every replica (https://docs.cloud.google.com/vertex-ai/docs/training/distributed-training,
# read 2026-11-28): pool 0 holds the primary replica, whose address every node meets at; a node's
# rank is its place in pools 0 then 1. Without it a multi-node job stops here instead of every
# node training alone.
CLUSTER_PY = """
import json, os, sys
nodes = int(sys.argv[1])
if not os.environ.get("CLUSTER_SPEC"):
    if nodes > 1:
        sys.exit(f"CLUSTER_SPEC is not set: a {nodes}-node job cannot find its other nodes")
    print("NNODES=1 NODE_RANK=0 MASTER_HOST=localhost MASTER_PORT=29500")
    sys.exit()
spec = json.loads(os.environ["CLUSTER_SPEC"])
pools, task = spec["cluster"], spec["task"]
found = len(pools.get("workerpool0", [])) + len(pools.get("workerpool1", []))
if found != nodes:
    sys.exit(f"CLUSTER_SPEC lists {found} training node(s) in workerpool0 and workerpool1, not {nodes}")
rank = 0 if task["type"] == "workerpool0" else 1 + int(task["index"])
host, port = pools["workerpool0"][0].rsplit(":", 1)
print(f"NNODES={nodes} NODE_RANK={rank} MASTER_HOST={host} MASTER_PORT={port}")
"""
FINISHED = (JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED)


def main(argv: list[str] | None = None) -> aiplatform.CustomJob:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--project", required=True)
    p.add_argument("--region", default="us-central1")
    p.add_argument("--bucket", required=True, help="gs://BUCKET for the job's outputs")
    p.add_argument("--image-uri", required=True, help="training image with PyTorch and the code")
    p.add_argument("--machine-type", default="n1-standard-8")
    p.add_argument("--accelerator", default=None, help="e.g. NVIDIA_L4, NVIDIA_TESLA_A100, NVIDIA_H100_80GB")
    p.add_argument("--accelerator-count", type=int, default=1, help="GPUs per replica")
    p.add_argument("--replicas", type=int, default=1, help="training nodes: the primary + workers")
    p.add_argument("--reduction-servers", type=int, default=0, help="Reduction Server replicas")
    p.add_argument("--reduction-server-machine", default="n1-highcpu-16")
    p.add_argument("--spot", action="store_true", help="run on Spot VMs")
    p.add_argument("--tensorboard", default=None, help="projects/P/locations/L/tensorboards/ID")
    p.add_argument("--service-account", default=None, help="the account the job runs as")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="environment variable for the training containers, e.g. NCCL_DEBUG=INFO")
    p.add_argument("--display-name", default="labkit-ddp")
    p.add_argument("--endpoint", default=None, help="another JobService, e.g. http://127.0.0.1:PORT")
    p.add_argument("--wait", action="store_true", help="poll the job until it ends")
    p.add_argument("--poll-seconds", type=float, default=30.0)
    p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then labkit.recipes.ddp flags")
    args = p.parse_args(argv)
    if args.replicas < 1:
        p.error(f"--replicas must be >= 1 (got {args.replicas})")
    if args.reduction_servers and args.replicas < 2:
        p.error("--reduction-servers needs --replicas >= 2: the reducers serve several nodes")
    if args.tensorboard and not args.service_account:
        p.error("--tensorboard needs --service-account: Vertex uploads the logs as that account")
    if any("=" not in e for e in args.env):
        p.error(f"--env takes NAME=VALUE (got {[e for e in args.env if '=' not in e]})")
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args

    # Outputs of this run; in the container the bucket is a folder under /gcs/, so plain file
    # writes land in Cloud Storage (a "gs://..." string given to open() would not).
    base_output_dir = f"{args.bucket.rstrip('/')}/{args.display_name}-{datetime.now():%Y%m%d-%H%M%S}"
    metrics = base_output_dir.replace("gs://", "/gcs/", 1) + "/metrics.json"

    # Each replica finds its place from CLUSTER_SPEC (CLUSTER_PY above); torchrun then starts
    # one process per GPU with global ranks.
    gpus = args.accelerator_count if args.accelerator else 1
    script = (f"set -e; cluster=$(python -c {shlex.quote(CLUSTER_PY)} {args.replicas}); eval \"$cluster\"; "
              "torchrun --nnodes=$NNODES --node-rank=$NODE_RANK "
              "--master-addr=$MASTER_HOST --master-port=$MASTER_PORT "
              f"--nproc-per-node={gpus} -m labkit.recipes.ddp "
              + shlex.join([*train_args, "--metrics-out", metrics]))
    machine = {"machine_type": args.machine_type}
    if args.accelerator:
        machine |= {"accelerator_type": args.accelerator, "accelerator_count": args.accelerator_count}
    trainer = {"machine_spec": machine,
               "disk_spec": {"boot_disk_type": "pd-ssd", "boot_disk_size_gb": 100},
               "container_spec": {"image_uri": args.image_uri, "command": ["bash", "-c", script],
                                  "env": [dict(zip(("name", "value"), e.split("=", 1), strict=True))
                                          for e in args.env]}}
    pools = [{**trainer, "replica_count": 1}]  # pool 0: the primary replica
    if args.replicas > 1:
        pools.append({**trainer, "replica_count": args.replicas - 1})  # pool 1: the workers
    if args.reduction_servers:  # pool 2: the reducers, on CPU machines
        pools.append({"machine_spec": {"machine_type": args.reduction_server_machine},
                      "replica_count": args.reduction_servers,
                      "container_spec": {"image_uri": REDUCTION_SERVER_IMAGE}})

    local = {"api_endpoint": args.endpoint, "api_transport": "rest",
             "credentials": AnonymousCredentials()} if args.endpoint else {}
    aiplatform.init(project=args.project, location=args.region, staging_bucket=args.bucket, **local)
    job = aiplatform.CustomJob(display_name=args.display_name, worker_pool_specs=pools,
                               base_output_dir=base_output_dir)
    # DDP cannot continue without one of its processes: when a replica restarts, restart all.
    # With a TensorBoard, Vertex uploads the event files it finds under AIP_TENSORBOARD_LOG_DIR.
    job.submit(scheduling_strategy=Scheduling.Strategy.SPOT if args.spot else None,
               restart_job_on_worker_restart=args.replicas > 1,
               tensorboard=args.tensorboard, service_account=args.service_account)
    print(f"submitted {job.resource_name}; outputs under {base_output_dir}", flush=True)

    while args.wait:
        state = job.state  # one GetCustomJob call
        print(f"{datetime.now():%H:%M:%S} {state.name}", flush=True)
        if state in FINISHED:
            break
        time.sleep(args.poll_seconds)
    return job


if __name__ == "__main__":
    main()
