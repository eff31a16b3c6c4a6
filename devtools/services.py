"""`python -m devtools.services cluster|cluster-stop|server|server-stop|install`: local stand-ins for a team's services.

    python -m devtools.services install        # apt-installs slurm-wlm, munge, postgresql when missing
    python -m devtools.services cluster        # a single-node SLURM on this machine (munge + slurmctld + slurmd)
    python -m devtools.services cluster-stop
    python -m devtools.services server         # PostgreSQL + `mlflow server` on 127.0.0.1 (served artifacts)
    python -m devtools.services server-stop

Everything a service writes (configs, pid files, logs, the database, artifacts) lives in its
state folder (`--state`, default `outputs/services/<cluster|server>/`); `state.json` there
records pids and ports, and the `-stop` commands stop exactly those processes and wait until
they are gone. A started service prints the lines that point ampgan at it (`SLURM_CONF=...`,
`tracking.uri=http://...`). `Cluster` and `Server` are the same thing for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from ampgan import AmpganError, report_error
from ampgan.config.schema import outputs_dir
from ampgan.training.parallel import free_port

STATE = "state.json"
PACKAGES = {  # a command each Debian package provides -> the package
    "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm", "munged": "munge",
    "mungekey": "munge", "initdb": "postgresql", "pg_ctl": "postgresql",
    "strace": "strace", "unshare": "util-linux", "ip": "iproute2",  # the telemetry test: connect() traced in a netns
}


# ---------------------------------------------------------------- system packages
def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def _have(command: str) -> bool:
    if command in ("initdb", "pg_ctl"):
        return _pg_bin() is not None
    return shutil.which(command) is not None or Path("/usr/sbin", command).exists()


def missing_packages() -> list[str]:
    return sorted({pkg for cmd, pkg in PACKAGES.items() if not _have(cmd)})


def install_packages() -> list[str]:
    """apt-install what is missing (root and apt-get needed); the packages installed. Idempotent."""
    missing = missing_packages()
    if not missing:
        return []
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise AmpganError(f"install {' '.join(missing)} (Debian packages; this needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]
            raise AmpganError(f"install {' '.join(missing)}: `{' '.join(cmd)}` failed: {tail[0]}")
    still = missing_packages()
    if still:
        raise AmpganError(f"install {' '.join(still)}: apt-get finished but their commands are still missing")
    return missing


def _sbin(command: str) -> str:
    return shutil.which(command) or str(Path("/usr/sbin", command))


# ---------------------------------------------------------------- helpers
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _stop_pid(pid: int | None, timeout: float = 30.0, group: bool = False) -> None:
    """SIGTERM (the process group with `group`), wait, then SIGKILL; returns when it is gone."""
    if not pid or not _alive(pid):
        return
    kill = os.killpg if group else os.kill
    try:
        kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + timeout
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        try:
            kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        while _alive(pid):
            time.sleep(0.1)


def _read_pid(path: Path, timeout: float = 20.0) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            return int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            time.sleep(0.1)
    raise AmpganError(f"{path.name} did not appear within {timeout:.0f}s (see the logs in {path.parent})")


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise AmpganError(f"{what}: `{' '.join(cmd[:2])}` failed: {detail[-1] if detail else done.returncode}")
    return done


def _wait(check, what: str, timeout: float, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if check():
            return
        time.sleep(0.3)
    where = f" (log: {log})" if log else ""
    raise AmpganError(f"{what} did not come up within {timeout:.0f}s{where}")


class _Service:
    name = ""

    def __init__(self, state_dir: Path | str | None = None):
        self.dir = Path(state_dir or outputs_dir() / "services" / self.name).resolve()

    @property
    def state(self) -> dict:
        try:
            return json.loads((self.dir / STATE).read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, state: dict) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / STATE).write_text(json.dumps(state, indent=1))

    def running(self) -> bool:
        pids = self.state.get("pids", {})
        return bool(pids) and all(_alive(p) for p in pids.values())

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- SLURM
class Cluster(_Service):
    """A single-node SLURM: munged (its own key and socket), slurmctld and slurmd on free ports.

    Clients find it through `SLURM_CONF` (`env()`); nothing under /etc is changed.
    """

    name = "cluster"
    partition = "ampgan"

    def __init__(self, state_dir: Path | str | None = None, spool_root: Path | str | None = None):
        super().__init__(state_dir)
        self.spool_root = spool_root  # where slurmd's spool folder is made (default: the system's temp folder)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm" / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60.0) -> dict:
        if self.running():
            return self.state
        self.stop()  # leftovers of a half-started cluster
        install_packages()
        self.dir.mkdir(parents=True, exist_ok=True)
        # munged runs as the munge user and refuses folders others can write: its own folder in /tmp
        munge = Path(tempfile.mkdtemp(prefix="ampgan-munge-"))
        user = pwd.getpwnam("munge")
        os.chown(munge, user.pw_uid, user.pw_gid)
        os.chmod(munge, 0o755)  # clients must reach the socket
        key, sock = munge / "munge.key", munge / "munge.socket"
        as_munge = ["runuser", "-u", "munge", "--"]
        _run([*as_munge, _sbin("mungekey"), "--create", f"--keyfile={key}"], "munge key")
        _run([*as_munge, _sbin("munged"), f"--socket={sock}", f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
              f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'munged.seed'}"], "munged")
        # slurmd makes a Unix socket per job step in its spool folder (<spool>/<node>_<job>.<step>), and a
        # socket's path has at most 108 bytes, which a deep state folder (a test's tmp_path) passes: jobs
        # then fail to launch and stay held. The spool gets a short folder of its own in /tmp.
        spool = Path(tempfile.mkdtemp(prefix="ampgan-slurmd-", dir=self.spool_root))
        state = {"munge_dir": str(munge), "spool_dir": str(spool), "pids": {"munged": _read_pid(munge / "munged.pid")}}
        self._save(state)

        slurm = self.conf.parent
        (slurm / "state").mkdir(parents=True, exist_ok=True)
        host = socket.gethostname().split(".")[0]
        cpus, mem = os.cpu_count() or 1, _memory_mb()
        ports = {"ctld": free_port(), "d": free_port()}
        self.conf.write_text("\n".join([
            "# written by `python -m devtools.services cluster`: a single-node SLURM for ampgan sweeps",
            "ClusterName=ampgan", f"SlurmctldHost={host}(127.0.0.1)", "SlurmUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={sock}", "CredType=cred/munge",
            f"SlurmctldPort={ports['ctld']}", f"SlurmdPort={ports['d']}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory", "ReturnToService=2", "MpiDefault=none",
            "SchedulerType=sched/backfill", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            f"StateSaveLocation={slurm / 'state'}", f"SlurmdSpoolDir={spool}",
            f"SlurmctldPidFile={slurm / 'slurmctld.pid'}", f"SlurmdPidFile={slurm / 'slurmd.pid'}",
            f"SlurmctldLogFile={slurm / 'slurmctld.log'}", f"SlurmdLogFile={slurm / 'slurmd.log'}",
            "SlurmctldTimeout=30", "SlurmdTimeout=30", "InactiveLimit=0", "MinJobAge=300", "KillWait=10",
            "MaxJobCount=10000", "MaxArraySize=10001",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO",
            ""]))
        env = {**os.environ, **self.env()}
        _run([_sbin("slurmctld"), "-f", str(self.conf)], "slurmctld", env=env)
        state["pids"]["slurmctld"] = _read_pid(slurm / "slurmctld.pid")
        self._save(state)
        _run([_sbin("slurmd"), "-f", str(self.conf)], "slurmd", env=env)
        state["pids"]["slurmd"] = _read_pid(slurm / "slurmd.pid")
        state.update(conf=str(self.conf), partition=self.partition, ports=ports, host=host, cpus=cpus)
        self._save(state)
        _wait(lambda: self._node_ready(env), "the SLURM node", timeout, slurm / "slurmd.log")
        return state

    def _node_ready(self, env: dict) -> bool:
        done = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
        return done.returncode == 0 and done.stdout.strip().rstrip("*") in ("idle", "mix", "alloc")

    def stop(self) -> None:
        state = self.state
        pids = state.get("pids", {})
        if pids.get("slurmctld") and _alive(pids["slurmctld"]) and self.conf.exists():
            # end this cluster's jobs first: their processes are ours too
            subprocess.run(["scancel", "--partition", self.partition], env={**os.environ, **self.env()},
                           capture_output=True, timeout=30)
        for name in ("slurmd", "slurmctld", "munged"):
            _stop_pid(pids.get(name))
        for folder in ("munge_dir", "spool_dir"):
            if state.get(folder):
                shutil.rmtree(state[folder], ignore_errors=True)
        if state:
            self._save({})


def _memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.9)
    except (ValueError, OSError):
        return 1024


# ---------------------------------------------------------------- PostgreSQL + mlflow server
class Server(_Service):
    """PostgreSQL (its own cluster in the state folder) and `mlflow server` on 127.0.0.1.

    The tracking store is the PostgreSQL database `mlflow`; artifacts are served by the server
    (`--artifacts-destination`), so clients need no shared file system. `database(name)` gives a
    SQLAlchemy URL of another database on the same PostgreSQL (e.g. an Optuna study's storage).
    """

    name = "server"

    def __init__(self, state_dir=None, port: int | None = None, pg_port: int | None = None):
        super().__init__(state_dir)
        self.port, self.pg_port = port, pg_port

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.state['port']}"

    def database(self, name: str) -> str:
        """postgresql+psycopg://... for database `name` (created if missing)."""
        pg_port = self.state["pg_port"]
        _createdb(Path(self.state["pg_bin"]), pg_port, name)
        return f"postgresql+psycopg://postgres@127.0.0.1:{pg_port}/{name}"

    def start(self, timeout: float = 120.0) -> dict:
        if self.running():
            return self.state
        self.stop()
        install_packages()
        pg_bin, data, run = _pg_bin(), self.dir / "pg" / "data", self.dir / "pg"
        run.mkdir(parents=True, exist_ok=True)
        postgres = pwd.getpwnam("postgres")
        for path in (run, *run.rglob("*")):
            os.chown(path, postgres.pw_uid, postgres.pw_gid)
        os.chmod(run, 0o700)
        _ensure_traversable(run)
        as_pg = ["runuser", "-u", "postgres", "--"]
        if not (data / "PG_VERSION").exists():
            _run([*as_pg, str(pg_bin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8"],
                 "initdb", cwd="/")
        pg_port = self.pg_port or free_port()
        _run([*as_pg, str(pg_bin / "pg_ctl"), "-D", str(data), "-l", str(run / "postgres.log"), "-w", "-t", "60",
              # TCP only: a Unix socket's path (its folder + /.s.PGSQL.<port>) has at most 108 bytes,
              # which a deep state folder (a test's tmp_path) passes
              "-o", f"-p {pg_port} -k '' -c listen_addresses=127.0.0.1", "start"], "PostgreSQL", cwd="/")
        state = {"pg_bin": str(pg_bin), "pg_port": pg_port, "pids": {"postgres": _read_pid(data / "postmaster.pid")}}
        self._save(state)
        _createdb(pg_bin, pg_port, "mlflow")

        port = self.port or free_port()
        artifacts = self.dir / "artifacts"
        artifacts.mkdir(exist_ok=True)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = (self.dir / "mlflow-server.log").open("ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
             f"postgresql+psycopg://postgres@127.0.0.1:{pg_port}/mlflow", "--artifacts-destination", str(artifacts),
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            env=env, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        state["pids"]["mlflow"] = proc.pid
        state["port"] = port
        self._save(state)
        _wait(lambda: _healthy(port) or proc.poll() is not None, "mlflow server", timeout, self.dir / "mlflow-server.log")
        if proc.poll() is not None:
            raise AmpganError(f"mlflow server exited with code {proc.returncode} (log: {self.dir / 'mlflow-server.log'})")
        return state

    def stop(self) -> None:
        state = self.state
        pids = state.get("pids", {})
        _stop_pid(pids.get("mlflow"), group=True)  # the server and its uvicorn / gunicorn workers
        data = self.dir / "pg" / "data"
        if pids.get("postgres") and _alive(pids["postgres"]):
            subprocess.run(["runuser", "-u", "postgres", "--", str(Path(state["pg_bin"]) / "pg_ctl"), "-D", str(data),
                            "-m", "fast", "-w", "-t", "60", "stop"], capture_output=True, cwd="/")
            _stop_pid(pids["postgres"])
        if state:
            self._save({})


def _ensure_traversable(path: Path) -> None:
    """The postgres user must reach its folder: give 'x' to every parent that lacks it for others."""
    for parent in list(path.parents)[::-1]:
        mode = parent.stat().st_mode
        if not mode & 0o001:
            os.chmod(parent, mode | 0o001)


def _createdb(pg_bin: Path, port: int, name: str) -> None:
    query = subprocess.run(["runuser", "-u", "postgres", "--", str(pg_bin / "psql"), "-h", "127.0.0.1", "-p", str(port),
                            "-tAc", f"SELECT 1 FROM pg_database WHERE datname = '{name}'"],
                           capture_output=True, text=True, cwd="/")
    if query.stdout.strip() != "1":
        _run(["runuser", "-u", "postgres", "--", str(pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(port), name],
             f"createdb {name}", cwd="/")


def _healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
    except OSError:
        return False


# ---------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.services", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["install", "cluster", "cluster-stop", "server", "server-stop"])
    parser.add_argument("--state", help="state folder (default: outputs/services/<cluster|server>)")
    parser.add_argument("--port", type=int, help="mlflow server port (default: 5001 if free, else any free port)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            done = install_packages()
            print(f"installed {' '.join(done)}" if done else "slurm-wlm, munge and postgresql are installed")
        elif args.command == "cluster":
            cluster = Cluster(args.state)
            state = cluster.start()
            print(f"SLURM partition '{state['partition']}' on {state['host']} ({state['cpus']} CPUs) is up; "
                  f"point SLURM's commands and ampgan at it with:\n  export SLURM_CONF={cluster.conf}\n"
                  f"then: python -m ampgan.train -m hydra/launcher=slurm tracking.uri=http://... <sweep>")
        elif args.command == "server":
            server = Server(args.state, port=args.port or _default_port())
            server.start()
            print(f"mlflow server (PostgreSQL store, served artifacts) on {server.uri}; log runs to it with:\n"
                  f"  python -m ampgan.train tracking.uri={server.uri} ...")
        elif args.command == "cluster-stop":
            Cluster(args.state).stop()
            print("cluster stopped")
        else:
            Server(args.state).stop()
            print("server and PostgreSQL stopped")
    except AmpganError as err:
        return report_error(err)
    return 0


def _default_port() -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 5001))
            return 5001
        except OSError:
            return free_port()


if __name__ == "__main__":
    sys.exit(main())
