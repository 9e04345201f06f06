"""Vertex AI: CustomJob and HyperparameterTuningJob specs, jobs of Vertex's own notebook
executor (NotebookExecutionJob), submission (with preflight and dry run), the container images
jobs run, machine/accelerator pairings, and a local emulator of
Vertex's multi-replica environment and of a tuning study. Framework-free;
google-cloud-aiplatform is imported only to validate and submit, Optuna only to run a study."""

from labkit.vertex.emulator import Fault, LocalJob, describe_environments, replica_envs, run_local
from labkit.vertex.images import (
    FRAMEWORK_MINIMUMS,
    PREBUILT_IMAGES,
    build_plan,
    check_image,
    default_image,
    image_tag,
    labkit_image,
)
from labkit.vertex.machines import (
    TRAINING_MACHINE_TYPES,
    boot_disk_type,
    check_machine,
    machine_arch,
    network_gbps,
)
from labkit.vertex.notebook_execution import (
    NotebookExecutionSpec,
    check_notebook_execution,
    execution_rest_json,
    notebook_execution_job,
    validate_notebook_execution,
)
from labkit.vertex.pricing import CostEstimate, estimate_cost
from labkit.vertex.reduction import ReducerSizing, size_reducers
from labkit.vertex.scheduling import DEFAULT_TIMEOUT_S
from labkit.vertex.specs import (
    REDUCTION_SERVER_IMAGE,
    JobSpec,
    PoolConfig,
    check_output_uri,
    check_spec,
    custom_job_spec,
    gcs_fuse_path,
    labkit_container,
    notebook_job,
    reduction_server_pool,
    refuse_placeholders,
    to_rest_json,
    training_job,
    validate,
    with_bucket,
)
from labkit.vertex.submit import (
    DryRun,
    Preflight,
    VertexNotConfigured,
    cancel,
    dry_run,
    get_job,
    job_service_client,
    job_state,
    notebook_execution_missing,
    notebook_service_client,
    preflight,
    refuse_submitting_placeholders,
    submission_placeholder,
    submit,
    submit_notebook_execution,
    wait,
)
from labkit.vertex.tuning import (
    StudyCost,
    TrialRecord,
    run_local_tuning,
    study_cost,
    study_summary,
    tuning_job,
    validate_tuning_job,
)

__all__ = [
    "DEFAULT_TIMEOUT_S", "JobSpec", "ReducerSizing", "TRAINING_MACHINE_TYPES", "check_output_uri",
    "image_tag", "machine_arch", "network_gbps", "size_reducers",
    "FRAMEWORK_MINIMUMS", "PREBUILT_IMAGES", "REDUCTION_SERVER_IMAGE", "CostEstimate", "DryRun",
    "Fault", "LocalJob", "PoolConfig", "Preflight", "StudyCost", "TrialRecord",
    "VertexNotConfigured", "boot_disk_type", "build_plan", "check_image", "check_machine",
    "check_spec", "custom_job_spec", "default_image", "describe_environments", "dry_run",
    "estimate_cost", "gcs_fuse_path", "labkit_container", "labkit_image", "notebook_job",
    "preflight", "reduction_server_pool", "replica_envs", "run_local", "run_local_tuning",
    "study_cost", "study_summary", "submit", "to_rest_json", "training_job", "tuning_job",
    "validate", "validate_tuning_job", "cancel", "get_job", "job_service_client", "job_state", "wait",
    "refuse_placeholders", "refuse_submitting_placeholders", "submission_placeholder",
    "with_bucket", "NotebookExecutionSpec", "check_notebook_execution", "execution_rest_json",
    "notebook_execution_job", "validate_notebook_execution", "notebook_execution_missing",
    "notebook_service_client", "submit_notebook_execution",
]
