"""Vertex AI: CustomJob specs, submission (with preflight and dry run), and a local emulator
of Vertex's multi-replica environment. Framework-free; google-cloud-aiplatform is imported only
to validate and submit."""

from labkit.vertex.emulator import Fault, LocalJob, describe_environments, replica_envs, run_local
from labkit.vertex.pricing import CostEstimate, estimate_cost
from labkit.vertex.specs import (
    PREBUILT_IMAGES,
    REDUCTION_SERVER_IMAGE,
    PoolConfig,
    custom_job_spec,
    gcs_fuse_path,
    notebook_job,
    reduction_server_pool,
    to_rest_json,
    training_job,
    validate,
)
from labkit.vertex.submit import DryRun, Preflight, VertexNotConfigured, dry_run, preflight, submit

__all__ = [
    "PREBUILT_IMAGES", "REDUCTION_SERVER_IMAGE", "CostEstimate", "DryRun", "Fault", "LocalJob",
    "PoolConfig", "describe_environments", "replica_envs", "run_local",
    "Preflight", "VertexNotConfigured", "custom_job_spec", "dry_run", "estimate_cost",
    "gcs_fuse_path", "notebook_job", "preflight", "reduction_server_pool", "submit",
    "to_rest_json", "training_job", "validate",
]
