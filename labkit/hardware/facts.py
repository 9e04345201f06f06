"""What Google Cloud documents about Spot VMs and Vertex AI custom training, each fact with the
page it comes from and the date it was read, so code and notebooks quote one sourced value.
(Vertex AI's documentation now also appears under the name Gemini Enterprise Agent Platform;
the training pages cited below are those.)

Where a value matters to the code but the service does not document it, the fact says so
(`documented=False`) and labkit assumes less than the nearest documented figure: the grace a
training container gets after SIGTERM is such a value (see `labkit.hardware.spot`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

READ_ON = dt.date(2026, 11, 23)
# The restart and error rules were read again, in full, on this date (stored copies of the pages
# below under docs.cloud.google.com).
RULES_READ_ON = dt.date(2026, 11, 26)

VERTEX_TRAINING_ERRORS_URL = ("https://docs.cloud.google.com/gemini-enterprise-agent-platform/"
                              "machine-learning/training/understanding-training-service")
VERTEX_SPOT_TRAINING_URL = ("https://docs.cloud.google.com/gemini-enterprise-agent-platform/"
                            "machine-learning/training/use-spot-vms")
COMPUTE_SCHEDULING_API_URL = ("https://pub.dev/documentation/googleapis/latest/compute_v1/"
                              "Scheduling/skipGuestOsShutdown.html")
SPOT_PRICING_URL = "https://cloud.google.com/spot-vms/pricing"
VERTEX_DWS_URL = ("https://docs.cloud.google.com/gemini-enterprise-agent-platform/"
                  "machine-learning/training/schedule-jobs-dws")
# Google Cloud Japan's own engineers on DWS flex-start's prices for Vertex AI (a blog, not a
# price list: the rate card itself is https://cloud.google.com/products/dws/pricing).
DWS_PRICE_BLOG_URL = "https://zenn.dev/google_cloud_jp/articles/dws-flex-new-skus"
# Vertex AI's rate card (https://cloud.google.com/vertex-ai/pricing) as transcribed, with the
# page's figures quoted verbatim, on 2026-10-07; and Compute Engine's, from Google's Cloud
# Billing Catalog, as exported on 2026-07-30. Both pinned to a commit.
VERTEX_RATE_CARD_URL = ("https://github.com/api-evangelist/google-vertex-ai/blob/"
                        "342263c39279d72204c9e1bb3058dceba0d215e1/plans/google-vertex-ai-plans-pricing.yml")
COMPUTE_RATE_CARD_URL = ("https://github.com/Cyclenerd/google-cloud-pricing-cost-calculator/blob/"
                         "fd66b26ff84fee5cdd94f341ea89206e76c06b99/pricing.yml")


@dataclass(frozen=True)
class Fact:
    """One sourced statement: `value` in `unit`, the words it paraphrases, where and when it was
    read. `documented` False: the page does not give the value; `value` is labkit's assumption."""

    value: float
    unit: str
    statement: str
    url: str
    read_on: dt.date = READ_ON
    documented: bool = True

    def cite(self) -> str:
        return f"{self.url} (read {self.read_on.isoformat()})"

    def text(self) -> str:
        return f"{self.statement} [{self.cite()}]"


SPOT_SHUTDOWN_S = Fact(
    30, "s", "Compute Engine gives a Spot VM 30 seconds between the soft-off signal (ACPI G2, "
    "which the guest sees as a shutdown) and the hard stop (the Compute Engine API's "
    "Scheduling.skipGuestOsShutdown field: 120 s for standard VMs, 30 s for Spot VMs)",
    COMPUTE_SCHEDULING_API_URL)

CONTAINER_SIGTERM_GRACE_S = Fact(
    15, "s", "Vertex AI does not document how long a custom-training container has between "
    "SIGTERM and being killed when its Spot VM is preempted; labkit assumes half of Compute "
    "Engine's 30 s, so a checkpoint on SIGTERM must be written well within that",
    VERTEX_SPOT_TRAINING_URL, documented=False)

SPOT_JOB_RESTARTS = Fact(
    6, "restarts", "When Spot VMs are preempted, the serverless training job fails with a STOCKOUT "
    "error and is restarted up to six times", VERTEX_SPOT_TRAINING_URL, RULES_READ_ON)

WORKER_RESTARTS = Fact(
    5, "restarts", "A worker that fails with a non-permanent error (any error not listed among the "
    "common errors, such as its VM failing) is restarted, up to five restarts per worker",
    VERTEX_TRAINING_ERRORS_URL, RULES_READ_ON)

JOB_RETRIES_AFTER_WORKER_RESTARTS = Fact(
    3, "retries", "After five restarts, if the worker fails again, the whole job is retried up "
    "to three times before it fails", VERTEX_TRAINING_ERRORS_URL, RULES_READ_ON)

PERMANENT_ERROR_RESTARTS = Fact(
    0, "restarts", "A worker that fails with a common error (a user code exception: 'The replica "
    "exited with a non-zero status'; out of memory) is a permanent error: the service shuts the "
    "whole job down and does not restart it", VERTEX_TRAINING_ERRORS_URL, RULES_READ_ON)

TRANSIENT_EXIT_RESTARTS = Fact(
    3, "restarts", "Exit codes that could be transient make the service restart the job up to "
    "three times: SIGABRT (exit code 6, or 134 in a custom container) and SIGSEGV (exit code 11, "
    "or 139 in a custom container)", VERTEX_TRAINING_ERRORS_URL, RULES_READ_ON)

STOCKOUT_RESTARTS = Fact(
    3, "restarts", "On a Compute Engine stockout (insufficient capacity in the region) the "
    "service attempts to restart the job up to three times", VERTEX_TRAINING_ERRORS_URL, RULES_READ_ON)

INTERNAL_ERROR_RESTARTS = Fact(
    2, "restarts", "On an internal error the service restarts the job twice (three attempts in "
    "all) before failing it", VERTEX_TRAINING_ERRORS_URL, RULES_READ_ON)

DWS_MAX_WAIT_DEFAULT_H = Fact(
    24, "h", "A Dynamic Workload Scheduler (FLEX_START) job waits for its GPUs at most "
    "scheduling.maxWaitDuration, by default 1 day (0: indefinitely)", VERTEX_DWS_URL, RULES_READ_ON)

DWS_MAX_TIMEOUT_DAYS = Fact(
    7, "days", "A FLEX_START job needs L4, A100, H100, H200 or B200 GPUs, the same machine "
    "configuration in every worker pool, and a timeout of 7 days or less", VERTEX_DWS_URL, RULES_READ_ON)

DWS_NOT_PREEMPTIBLE = Fact(
    0, "preemptions", "A FLEX_START job consumes preemptible quota, but only in name: its "
    "resources are not preemptible and behave like standard resources; it is billed at Dynamic "
    "Workload Scheduler prices", VERTEX_DWS_URL, RULES_READ_ON)

DWS_MAX_DISCOUNT = Fact(
    0.5, "fraction of the on-demand price", "With DWS flex-start's prices, accelerator-optimized "
    "machines with high-end GPUs cost up to about half of on-demand on Vertex AI (Google Cloud "
    "Japan, 'up to about half price')", DWS_PRICE_BLOG_URL, RULES_READ_ON)

SPOT_MAX_DISCOUNT = Fact(
    0.91, "fraction of the on-demand price", "Spot prices vary (they can change up to once a "
    "day) and give discounts of up to 91% off the on-demand price for many machine types, GPUs, "
    "TPUs and Local SSDs", SPOT_PRICING_URL)

VERTEX_TRAINING_N1_STANDARD_4 = Fact(
    0.21849885, "USD/h", "Vertex AI custom training bills an n1-standard-4 machine at "
    "$0.21849885 per hour (us-central1, no savings plan)", VERTEX_RATE_CARD_URL)

COMPUTE_N1_STANDARD_4 = Fact(
    0.189999, "USD/h", "Compute Engine bills the same n1-standard-4 machine at $0.189999 per "
    "hour on-demand (us-central1)", COMPUTE_RATE_CARD_URL)

# How much more Vertex AI's training rate is than Compute Engine's for the one machine both
# rate cards were read for: the catalog's Compute Engine prices are lower bounds for Vertex jobs.
VERTEX_TRAINING_PREMIUM = VERTEX_TRAINING_N1_STANDARD_4.value / COMPUTE_N1_STANDARD_4.value

def restart_rules() -> list[str]:
    """Vertex AI's documented restart rules, one sentence each with its source."""
    return [f.text() for f in (PERMANENT_ERROR_RESTARTS, TRANSIENT_EXIT_RESTARTS, STOCKOUT_RESTARTS,
                               SPOT_JOB_RESTARTS, WORKER_RESTARTS, JOB_RETRIES_AFTER_WORKER_RESTARTS,
                               INTERNAL_ERROR_RESTARTS)]
