"""labkit's one process launcher, on real (tiny) Python subprocesses: output capture, a failure
taking the group down, no time limit unless asked (then SIGTERM before SIGKILL), servers stopped
when the work is done, signals with a grace period, SIGTERM and Ctrl-C passed on to the group,
processes that die with their launcher, and the environment a labkit child starts from."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from labkit.core import cluster
from labkit.core.launcher import (
    GroupConfig,
    LaunchError,
    LaunchTimeout,
    Process,
    ProcessSpec,
    child_env,
    run_group,
)
from tests.conftest import child_pids

SLEEPER = "import time; print('sleeping', flush=True); time.sleep(60)"
# Ignores SIGTERM: only SIGKILL ends it.
STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
# The same from a shell, which ignores SIGTERM within milliseconds of starting: on a loaded
# machine a timeout cannot reach it before it does.
STUBBORN_SHELL = ["sh", "-c", "trap '' TERM; echo ready; exec sleep 60"]


def py(name: str, script: str, **kw) -> ProcessSpec:
    return ProcessSpec(name, [sys.executable, "-c", script], **kw)


def wait_for(predicate, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_every_process_finishes_and_its_output_is_captured():
    result = run_group([py("a", "print('from a')"),
                        py("b", "import sys; print('out b'); print('err b', file=sys.stderr)")])
    assert result.ok and result.returncodes == [0, 0] and result.check() is result
    assert [r.name for r in result.results] == ["a", "b"]
    assert result.results[0].output == "from a\n"
    assert "out b" in result.results[1].output and "err b" in result.results[1].output
    assert all(r.ended_by == "exit" for r in result.results)


def test_a_failing_process_takes_the_others_down_and_its_tail_is_reported():
    result = run_group([py("rank 0", SLEEPER),
                        py("rank 1", "import sys; print('x' * 5000 + 'boom', flush=True); sys.exit(3)")],
                       GroupConfig(timeout_s=120, tail_chars=100))
    assert not result.ok and result.failed.name == "rank 1" and not result.timed_out
    assert result.returncodes == [-9, 3]
    assert result.results[0].ended_by == "killed"
    with pytest.raises(LaunchError) as err:
        result.check("DDP replica")
    message = str(err.value)
    assert message.startswith("DDP replica") and all(f in message.splitlines()[0] for f in ("rank 1", "of 2", "[-9, 3]"))
    assert message.endswith("boom\n") and "x" * 101 not in message  # only the tail


def test_ok_codes_are_not_failures():
    result = run_group([py("a", "import sys; sys.exit(143)"), py("b", "pass")],
                       GroupConfig(ok_codes=(0, 143)))
    assert result.ok and result.returncodes == [143, 0]


def test_no_time_limit_unless_one_is_asked_for():
    assert GroupConfig().timeout_s is None  # training runs for hours


@pytest.mark.slow  # waits out a 3 s timeout
def test_past_the_timeout_everything_gets_sigterm_then_sigkill_after_the_grace():
    result = run_group([py("quick", "pass"), py("slow", SLEEPER), ProcessSpec("stubborn", STUBBORN_SHELL)],
                       GroupConfig(timeout_s=3.0, timeout_grace_s=0.5))
    assert result.timed_out and result.failed is None
    assert result.returncodes == [0, -15, -9]  # SIGTERM first (labkit replicas checkpoint on it)
    assert [r.ended_by for r in result.results] == ["exit", "killed", "killed"]
    with pytest.raises(LaunchTimeout) as err:
        result.check("worker")
    assert isinstance(err.value, TimeoutError) and "worker slow of 3 was still running" in str(err.value)
    assert "sleeping" in str(err.value)
    assert "\n" not in err.value.summary and "timed out after 3s" in err.value.summary


def test_a_failure_has_a_one_line_summary_quoting_its_last_line():
    result = run_group([py("rank 0", "import sys; print('labkit train: bad setting'); sys.exit(2)")])
    with pytest.raises(LaunchError) as err:
        result.check("DDP replica")
    summary = err.value.summary
    assert "\n" not in summary and summary.endswith("labkit train: bad setting")  # its last line
    assert all(f in summary for f in ("DDP replica", "rank 0", "exit code 2"))
    assert err.value.returncode == 2


# Handles SIGTERM as a labkit replica does: exit 143 once "checkpointed"; touches argv[1] when ready.
POLITE = ("import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(143)); "
          "open(sys.argv[1], 'w').close(); time.sleep(60)")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_to_the_launcher_reach_every_process(tmp_path, sig):
    """The launcher runs in a process of its own here, so the signal hits it, not pytest."""
    script = textwrap.dedent(f"""
        import sys
        from labkit.core.launcher import GroupConfig, ProcessSpec, run_group
        spec = lambda name: ProcessSpec(name, [sys.executable, "-c", {POLITE!r}, {str(tmp_path)!r} + "/" + name])
        result = run_group([spec("a"), spec("b")], GroupConfig(ok_codes=(0, 143)))
        print("codes", result.returncodes, "signal", result.signal, flush=True)
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: (tmp_path / "a").exists() and (tmp_path / "b").exists(), 60)
        launcher.send_signal(sig)
        out, _ = launcher.communicate(timeout=60)
    finally:
        launcher.kill()
    assert launcher.returncode == 0 and f"codes [143, 143] signal {int(sig)}" in out, out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals are Linux's")
def test_processes_die_with_their_launcher_even_after_sigkill():
    script = textwrap.dedent(f"""
        import sys
        from labkit.core.launcher import ProcessSpec, run_group
        run_group([ProcessSpec(n, [sys.executable, "-c", {SLEEPER!r}]) for n in ("a", "b")])
    """)
    launcher = subprocess.Popen([sys.executable, "-c", script], env=child_env())
    try:
        wait_for(lambda: len(child_pids(launcher.pid)) == 2)
        children = child_pids(launcher.pid)
    finally:
        launcher.kill()
        launcher.wait()
    wait_for(lambda: not any(_alive(c) for c in children))


def test_servers_are_stopped_once_the_primary_has_finished(tmp_path):
    # The chief finishes only once the stubborn server ignores SIGTERM (a loaded machine may
    # start it late): the test is about how servers are stopped, not about start-up order.
    flag = tmp_path / "stubborn-ready"
    stubborn = STUBBORN.replace("print('ready', flush=True)", f"open({str(flag)!r}, 'w').close()")
    chief = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.02)\nprint('done')"
    result = run_group([py("chief", chief), py("ps", SLEEPER, server=True),
                        py("stubborn", stubborn, server=True)], GroupConfig(stop_grace_s=0.5))
    assert result.ok, result.results
    assert [r.ended_by for r in result.results] == ["exit", "stopped", "stopped"]
    assert result.returncodes == [0, -15, -9]  # SIGTERM; ignored, so SIGKILL after the grace


def test_a_group_of_only_servers_is_refused():
    with pytest.raises(ValueError, match="specs"):
        run_group([py("ps", "pass", server=True)])
    with pytest.raises(ValueError, match="names"):
        run_group([py("a", "pass"), py("a", "pass")])


def test_sigterm_then_kill_after_the_grace_period():
    ready = threading.Event()
    stubborn = Process(py("stubborn", STUBBORN, on_line=lambda line: ready.set()))
    polite = Process(py("polite", "import signal, sys, time; signal.signal(signal.SIGTERM, "
                                  "lambda *a: sys.exit(7)); print('ready', flush=True); time.sleep(60)"))
    try:
        assert ready.wait(30)
        wait_for(lambda: "ready" in polite.output())
        stubborn.send_signal("SIGTERM", kill_after_s=0.3)
        polite.send_signal("SIGTERM", kill_after_s=30)
        assert stubborn.wait(30) == -9  # ignored SIGTERM, killed after the grace period
        assert polite.wait(30) == 7  # its own handler ran; the pending kill is cancelled
    finally:
        stubborn.close()
        polite.close()


def test_stop_and_kill_reach_the_whole_process_group(tmp_path):
    # The child starts a grandchild and reports its pid; killing the child's group ends both.
    script = ("import subprocess, sys, time; "
              "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              "print('grandchild', g.pid, flush=True); time.sleep(60)")
    p = Process(py("parent", script, log_path=tmp_path / "logs" / "parent.log"))
    try:
        wait_for(lambda: "grandchild" in p.output())
        grandchild = int(p.output().split()[1])
        assert p.stop(grace_s=5) == -15
        wait_for(lambda: not _alive(grandchild))
        assert "grandchild" in (tmp_path / "logs" / "parent.log").read_text()
    finally:
        p.close()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


def test_lines_reach_the_callback_as_they_arrive():
    lines = []
    p = Process(py("steps", "import sys\nfor i in range(3): sys.stdout.write(f'step {i}\\r')\n"
                            "print('end')", on_line=lines.append))
    try:
        assert p.wait(30) == 0
        assert lines == ["step 0", "step 1", "step 2", "end"]
    finally:
        p.close()


def test_an_error_in_the_callback_is_raised_by_wait():
    def bad(line: str) -> None:
        raise KeyError(line)

    p = Process(py("p", "print('hello')", on_line=bad))
    try:
        with pytest.raises(KeyError, match="hello"):
            p.wait(30)
    finally:
        p.close()


def test_child_env_drops_an_enclosing_jobs_cluster_and_finds_labkit():
    base = {"CLUSTER_SPEC": "{}", "TF_CONFIG": "{}", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1",
            cluster.POOL2_ROLE_ENV: "ps", "PYTHONPATH": "/elsewhere", "KEEP": "1"}
    env = child_env({"RANK": "0"}, base=base)
    assert env["KEEP"] == "1" and env["RANK"] == "0"
    assert not set(env) & (set(cluster.CLUSTER_VARIABLES) - {"RANK"})
    root, rest = env["PYTHONPATH"].split(os.pathsep)
    assert rest == "/elsewhere" and os.path.isfile(os.path.join(root, "labkit", "core", "launcher.py"))


@pytest.mark.parametrize("make,field", [
    (lambda: ProcessSpec("", ["x"]), "name"),
    (lambda: ProcessSpec("a", []), "argv"),
    (lambda: ProcessSpec("a", "python -c pass"), "argv"),
    (lambda: GroupConfig(timeout_s=-1), "timeout_s"),
    (lambda: GroupConfig(ok_codes=[0]), "ok_codes"),
    (lambda: GroupConfig(stop_grace_s="5"), "stop_grace_s"),
    (lambda: GroupConfig(timeout_grace_s=-1), "timeout_grace_s"),
])
def test_bad_specs_and_configs_name_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_bad_signal_name():
    p = Process(py("p", SLEEPER))
    try:
        with pytest.raises(ValueError, match="SIGTREM"):
            p.send_signal("SIGTREM")
    finally:
        p.close()
    assert p.returncode == -9  # close() killed it
