# %% [markdown]
# # 11 · Hyperparameter tuning: a Vertex AI study, run here first, then priced and submitted
#
# A Vertex AI **HyperparameterTuningJob** runs the same training job many times (trials), each
# with values the service suggests, reads the metric each trial reports, and stops trials that
# fall behind. This notebook builds that job for `labkit train`, runs **the same study on this
# machine** (every trial through the local Vertex emulator, a real optimiser suggesting the
# values), prices it on Spot from the trial times it measured, and shows the request Vertex would
# receive.
#
# - The study tunes `labkit train` flags: the learning rate on a log scale and the batch size
#   from a list. Vertex passes each trial's values as `--lr=0.003 --batch-size=32`.
# - The metric is the **held-out loss**: the loss on 256 samples the trial never trained on,
#   measured at every checkpoint and at the end. The last minibatch's training loss would rank
#   trials by the noise of one batch, and reward a run that memorised its data.
# - Each trial reports its metric the way the tuning service reads it (the cloudml-hypertune
#   file format, written by labkit itself at every checkpoint and at the end), so the median
#   stopping rule has something to compare.
# - Locally, Optuna suggests the values (Bayesian TPE by default, with Vertex's median stopping
#   rule), `parallel_trials` at a time.

# %% tags=["parameters"]
scale = "auto"
model = "cnn"
steps = None
trials = None
parallel_trials = 2
lr_range = (1e-4, 3e-2)
batch_sizes = [16, 32, 64]
machine_type = "g2-standard-8"
accelerator_type = "NVIDIA_L4"
accelerator_count = 1
seed = 0
output_uri = "gs://YOUR_BUCKET/labkit/11_tuning"
time_budget_s = 0.0

# %%
from labkit.notebooks import artifacts_dir, key_comparison, key_figure, route_kernel_stderr

route_kernel_stderr()  # C/C++ library and child-process output goes to this notebook's log file

import json

from labkit import vertex
from labkit.core import config, stats
from labkit.core.metrics import LEARNED_BELOW
from labkit.core.models import build_config
from labkit.core.train_config import TrainConfig
from labkit.course import sizing, tables, tuning
from labkit.data.synthetic import best_possible_loss, chance_loss

# %%
scale = config.resolve_scale(scale)
plan = sizing.plan("11_hyperparameter_tuning", scale, time_budget_s=time_budget_s, model=model,
                   parallel_trials=parallel_trials)
print(plan.text())
steps = steps or plan["steps"]
trials = trials or plan["trials"]
config.check_int("parallel_trials", parallel_trials, minimum=1, maximum=trials)
workdir = artifacts_dir("11_hyperparameter_tuning")
base = TrainConfig(model=model, scale=scale, steps=steps, checkpoint_every=max(1, steps // 3), progress=False)
print(f"scale {scale}: {trials} trials of {steps} steps, {parallel_trials} at a time; files in {workdir}")

# %% [markdown]
# ## The study, as Vertex AI receives it
# `vertex.tuning_job` writes the HyperparameterTuningJob: the metric and its goal, one parameter
# spec per tuned flag (a log-scaled DOUBLE range, a DISCRETE set), the median stopping rule, and
# the trial job: `labkit.vertex.trial` wrapping `labkit train` on the machine you name.
# `aiplatform_v1.types.HyperparameterTuningJob(**spec)` accepts the dict as it is.

# %%
spec = vertex.tuning_job(base, output_uri=output_uri, metric="heldout_loss", goal="minimize",
                         parameters={"lr": ("log", *lr_range), "batch_size": list(batch_sizes)},
                         max_trial_count=trials, parallel_trial_count=parallel_trials, machine_type=machine_type,
                         accelerator_type=accelerator_type, accelerator_count=accelerator_count, spot=True)
print(json.dumps(spec["study_spec"], indent=1))
trial_pool = spec["trial_job_spec"]["worker_pool_specs"][0]
print("each trial runs:", " ".join(trial_pool["container_spec"].get("command", []) + trial_pool["container_spec"].get("args", [])))

# %% [markdown]
# ## Run the study here
# Before running: which learning rate do you expect to win after only a few steps, the largest
# one or a middle one? And will the batch size matter as much?
#
# Every trial is the spec's trial job run by the local emulator (one process per replica, the
# environment Vertex gives it, its own `AIP_*` folders in a stand-in bucket). A running trial
# whose best report so far is worse than the median of the completed trials' running averages
# up to that step is stopped early: the rule as Vertex's API states it (study.proto's
# `MedianAutomatedStoppingSpec`). What differs from the service: its default search (Vertex's
# own Bayesian optimisation; here TPE) and `max_failed_trial_count=0` (there the service decides
# how many failed trials end the study; here none does).

# %%
records = vertex.run_local_tuning(spec, workdir / "study", seed=seed, env={"LABKIT_NO_PROGRESS": "1"})
summary = vertex.study_summary(records, goal="minimize")
print(summary.text())

# %%
# Assigned, not left as the cell's value: Jupyter would show the last figure a second time.
lr_plot = tuning.plot_study(records, "lr")
batch_plot = tuning.plot_study(records, "batch_size", log_x=False)

# %% [markdown]
# ## Is the best trial really the best?
# A study ranks each trial on one run with one seed. Before naming a winner: does the best value
# sit at the edge of the range searched (then the optimum may lie outside it), how much of the
# search did TPE guide (Optuna's TPE suggests at random for its first trials), and does the best
# trial stay best when it and the runner-up are trained again with other seeds? The re-runs are a
# small grid study over `seed` with each trial's values fixed: the study you would submit to
# Vertex to check a winner. Before running: will the top two still be in the same order?

# %%
for edge in tuning.range_edges(summary.best, {"lr": ("log", *lr_range)}):
    print(f"The best {edge.name}, {edge.value:.3g}, sits at the {edge.side} edge of the range searched ({edge.low:g} to "
          f"{edge.high:g}): the optimum may lie beyond it, so widen the range past that edge before trusting this value.")
tpe = tuning.tpe_share(len(records))
if tpe.guided:
    print(f"TPE suggested {tpe.guided} of the {tpe.trials} trials; the first {tpe.startup} were random.")
else:
    print(f"All {tpe.trials} trials were TPE's random start-up trials (it guides the search from trial "
          f"{tpe.startup + 1} on): at this size the study is a random search.")

# %%
confirm = tuning.confirm_top(base, records, metric="heldout_loss", goal="minimize", output_uri=output_uri,
                             workdir=workdir / "confirm", env={"LABKIT_NO_PROGRESS": "1"})
print(tables.table(confirm, ["trial", "values", "seeds", "median", "range"]))
top_cmp = tuning.top_comparison(confirm, "minimize")
held = tuning.confirmation(confirm, top_cmp)

# %% [markdown]
# The study's best trial against its runner-up, seed by seed: "better" only when it was better on
# every seed (their ranges do not overlap), otherwise "no measurable difference here".

# %%
if held is None:
    print("Fewer than two trials finished: there is no runner-up to check the winner against.")
else:
    meaning = {"better": "the study's winner holds", "worse": "the study's ranking was one seed's luck",
               stats.NO_DIFFERENCE: "the study names no single winner between them"}
    print(f"Re-run with {held.seeds} seeds each, the study's best trial {held.best['trial']} against its runner-up, trial "
          f"{held.runner_up['trial']} (held-out loss {held.best['range']} against {held.runner_up['range']}): "
          f"{held.verdict}, so {meaning[held.verdict]}.")

# %% [markdown]
# ## What the study costs on Spot
# Vertex bills every trial for the time it ran, stopped ones included. Priced from the trial
# times measured here at the catalog price of the trial machine (on a GPU the trials are
# faster: these times are an upper bound for a study at this size).

# %%
spot_cost = vertex.study_cost(records, spec, spot=True)
on_demand_cost = vertex.study_cost(records, spec, spot=False)
print(spot_cost.text())
print(tables.table(tuning.cost_rows(spot_cost, on_demand_cost)))

# %% [markdown]
# ## What this study shows
# Every sentence below is written from the trial records and prices above (`tuning.findings`):
# a study names a best configuration only when its best trial learned, i.e. ended well under the
# held-out loss of guessing (`LEARNED_BELOW` × chance).

# %%
chance, floor = chance_loss(build_config(model, scale)), best_possible_loss(build_config(model, scale))
found = tuning.findings(summary, records, spot_cost, on_demand_cost, chance=chance, floor=floor)
best = found.best
if best is None:
    print("No trial finished, so the study has no best configuration.")
elif not found.learned:
    print(f"No trial learned: the best held-out loss, {best.metric:.4g}, is not under {found.learned_below:.4f} "
          f"({LEARNED_BELOW:g} × chance, {chance:.4f}), so the ranking of these trials is noise and names no best "
          f"configuration. Give the trials more steps.")
else:
    print(f"Best of {found.trials} trials: trial {best.trial_id} ({tuning.values_text(best.parameters)}), held-out loss "
          f"{best.metric:.4g} at its last report (chance {chance:.4f}).")

# %%
if found.learned and found.finished_spread is not None:
    print(f"The {found.finished} finished trials ended between {found.finished_low:.4f} and {found.finished_high:.4f} "
          f"({found.finished_spread:.1%} apart): that is how much lr and batch_size moved the held-out loss in {steps} steps.")
if found.learned and found.above_floor is not None:
    print(f"No model can score below {floor:.3f} on this data (a share of the training labels are random): the best "
          f"trial ended {found.above_floor:.3f} above that floor and {found.below_chance:.3f} below chance.")
if found.stopped:
    print(f"{found.stopped} trial(s) were stopped early by the median rule after {found.stopped_seconds:.0f} s in all, "
          "instead of running to the end.")
if found.spot_saving is not None:
    print(f"On Spot the study's trial time costs ${found.spot_usd:,.4f} instead of ${found.on_demand_usd:,.4f} on demand "
          f"({found.spot_saving:.0%} less), at the trial machine's catalog prices, for the trial times measured here.")

# %%
if found.learned and held is not None and held.verdict == "better":  # named only when it held on every seed
    key_figure("best learning rate found", best.parameters["lr"],
               note=f"held-out loss {best.metric:.3g}, chance {chance:.4f}; best on every seed")
elif top_cmp is not None:
    key_comparison("study's best trial vs its runner-up over seeds", top_cmp, "best", "runner-up", "held-out loss")
key_figure("trials stopped early by the median rule", found.stopped, note=f"of {found.trials}")
key_figure("study cost on Spot / on demand", found.spot_usd / found.on_demand_usd, "×")

# %% [markdown]
# ## Submit it
# With a Google Cloud project, credentials and a bucket configured, `vertex.submit(spec, ...)`
# creates the job and `vertex.wait(job.name)` follows it. Without them (as in CI), the same
# `submit` call goes to a local stand-in of the Vertex JobService, so you see exactly the
# request the real client library sends.

# %%
print(vertex.preflight().text())
sent = tuning.submit_or_preview(spec, display_name="labkit-11-tuning")
if sent.job:
    print(f"submitted: {sent.job}")
elif sent.not_sent:
    print(sent.not_sent)
else:
    why = ("not configured to submit" if sent.placeholder is None else f"{sent.placeholder} still holds a placeholder "
           "(set output_uri to a bucket of yours to submit; the stand-in got gs://labkit-local there)")
    print(f"{why}, so the request went to a local stand-in of the Vertex JobService, which received "
          f"{sent.display_name!r}: {sent.trials} trials, {sent.parallel} in parallel, metric {sent.metric} ({sent.goal}); "
          f"state after polling: {sent.state}.")

# %% [markdown]
# ## Your own script in a study
# Any training script can be the trial: it reads the values as flags (in the service's own
# formatting: a DISCRETE value arrives as `32.0`) and reports its metric with Google's
# cloudml-hypertune package, from the primary replica, once per evaluation. The lines a script
# adds are marked "tuning" in the recipe below. `labkit job --tune-metric ... --param ...`
# builds the HyperparameterTuningJob around your command (`labkit emulate` with the same flags
# runs the study here first); below, the study spec it builds for the recipe.

# %%
from labkit.course import recipe_view
from labkit.vertex import own_job

recipe_view.show("hypertune_report")
study_request = own_job.JobRequest(command=["python", "-m", "labkit.recipes.hypertune_report", "--epochs", "5"],
                                   output=output_uri, tune_metric="accuracy", goal="maximize",
                                   param=["lr=log:0.001:0.3", "momentum=0.0,0.5,0.9"], trials=trials,
                                   parallel_trials=parallel_trials, image="us-central1-docker.pkg.dev/my-project/training/trainer:1")
print(own_job.cli_line(study_request, verb="job"))
user_study = own_job.build(study_request, for_emulator=False, staging=workdir / "own-study")
print(json.dumps(user_study.spec["study_spec"], indent=1))
