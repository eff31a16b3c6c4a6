"""Nothing ampgan starts tries to leave the machine: MLflow's usage telemetry is off unless opted in.

Each command runs in a network namespace of its own (`unshare -n`, loopback only) under
`strace -f -e trace=connect`, with every variable removed by which MLflow would turn telemetry
off by itself (CI, PYTEST_CURRENT_TEST, ...; and the two that ampgan sets), so that the command
has to turn it off on its own. The namespace keeps this test from sending anything out; the
opted-in control shows that the trace does see MLflow's attempt when telemetry is on.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from ampgan.training.parallel import free_port
from tests.conftest import ROOT

# the variables by which MLflow 3.17 turns telemetry off (mlflow/telemetry/utils.py) ...
MLFLOW_CI_VARS = ("PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "CI", "CIRCLECI", "GITLAB_CI", "JENKINS_URL", "TRAVIS",
                  "TF_BUILD", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE", "TEAMCITY_VERSION",
                  "CLOUD_RUN_EXECUTION", "RUNBOT_HOST_URL", "RUNBOT_BUILD_NAME", "RUNBOT_WORKER_ID",
                  "CODEX_SANDBOX", "CODEX_CI", "CODEX_THREAD_ID")
# ... and the ones ampgan sets or reads
TELEMETRY_VARS = ("MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", "AMPGAN_TELEMETRY")
CONNECT = re.compile(r'connect\(\d+, \{sa_family=AF_INET6?, sin6?_port=htons\((\d+)\), '
                     r'(?:sin_addr=inet_addr\("([^"]+)"\)|sin6_flowinfo=[^,]*, inet_pton\(AF_INET6, "([^"]+)"\))')


def plain_env(outputs, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in MLFLOW_CI_VARS + TELEMETRY_VARS}
    return {**env, "AMPGAN_OUTPUTS": str(outputs), "PATH": f"{os.path.dirname(sys.executable)}:{env['PATH']}", **extra}


def off_machine(trace: str) -> list[str]:
    """Every connect() in an strace log to an address off loopback, as 'address:port'."""
    found = []
    for port, v4, v6 in CONNECT.findall(trace):
        address = ipaddress.ip_address(v4 or v6)
        if not address.is_loopback:
            found.append(f"{address}:{port}")
    return found


def traced(script: str, env: dict[str, str], tmp_path, timeout: float = 300) -> tuple[str, subprocess.CompletedProcess]:
    """`script` (bash) in a fresh network namespace with loopback up, every process traced."""
    log = tmp_path / "connect.trace"
    inner = f"ip link set lo up && exec strace -f -qq -e trace=connect -o {log} bash -c {shlex_quote(script)}"
    done = subprocess.run(["unshare", "-n", "bash", "-c", inner], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    return (log.read_text() if log.exists() else ""), done


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


@pytest.fixture(autouse=True)
def _tools():
    missing = [t for t in ("unshare", "strace", "ip") if shutil.which(t) is None]
    assert not missing, f"missing {missing}: `make services` installs them"
    assert os.geteuid() == 0, "unshare -n needs root"


TRAIN = f"{sys.executable} -m ampgan.train trainer=smoke tracking.background=always"


def test_a_run_and_its_tracking_helper_send_nothing_off_the_machine(tmp_path):
    trace, done = traced(TRAIN, plain_env(tmp_path / "out"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 6/6" in done.stderr + done.stdout
    assert off_machine(trace) == [], trace[-3000:]


@pytest.mark.slow  # `make test-full` (CI's time): the run's and the dashboard's traces stay
def test_the_opted_in_control_is_seen_by_the_trace(tmp_path):
    """With AMPGAN_TELEMETRY=true, MLflow's client looks up its telemetry host: the trace catches it."""
    trace, done = traced(TRAIN, plain_env(tmp_path / "out", AMPGAN_TELEMETRY="true"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert off_machine(trace) != [], "telemetry on, yet no connect() off loopback: the test could not tell"


@pytest.mark.slow  # `make test-full` (CI's 30 minutes on a slow machine)
def test_the_dashboard_server_sends_nothing_off_the_machine(tmp_path):
    """`python -m ampgan.tracking ui` (MLflow's server) serving its pages and the UI's telemetry config."""
    port = free_port()
    client = textwrap.dedent(f"""
        import json, time, urllib.request
        base = "http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(base + "/health", timeout=5); break
            except OSError:
                time.sleep(1)
        urllib.request.urlopen(base + "/", timeout=30).read()
        print(json.load(urllib.request.urlopen(base + "/ajax-api/3.0/mlflow/ui-telemetry", timeout=30)))
        time.sleep(3)
    """)
    (tmp_path / "client.py").write_text(client)
    script = (f"{sys.executable} -m ampgan.tracking ui --port {port} & server=$!; "
              f"{sys.executable} {tmp_path / 'client.py'}; status=$?; "
              f"pkill -TERM -P $server; kill $server; wait; exit $status")
    trace, done = traced(script, plain_env(tmp_path / "out"), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'disable_ui_telemetry': True" in done.stdout, done.stdout
    assert off_machine(trace) == [], trace[-3000:]
