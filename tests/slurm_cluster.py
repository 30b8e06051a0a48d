"""A one-node SLURM cluster on localhost for the tests, started as root and stopped after them.

munge (a key generated here), MariaDB and slurmdbd (so that `sacct` answers), slurmctld and slurmd
run in the foreground as children of the test, with every file in one temporary directory. The
node has a `cpu` partition (the default) and a `gpu` partition without GPUs. The Snakemake plugin
clears `SLURM_CONF` in its job steps, so the generated slurm.conf is linked to
/etc/slurm/slurm.conf for the session; a slurm.conf already there is never touched (skip), but
for this fixture's own link left behind by a killed session, which is removed.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

PROFILE = Path(__file__).resolve().parents[1] / "profiles/slurm/config.yaml"
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
PROGRAMS = ["mungekey", "munged", "mariadb-install-db", "mariadbd", "mariadb", "slurmdbd",
            "slurmctld", "slurmd", "sacctmgr", "sinfo", "sbatch", "squeue", "sacct", "scancel"]
PACKAGES = "slurm-wlm munge slurmdbd mariadb-server"
CLUSTER = "decodelab"
DB_PASSWORD = "decodelab-test"
PREFIX = "decodelab-slurm-"  # of the cluster's temporary directory
NODE_CPUS = 2 * os.cpu_count()


def why_no_cluster() -> str | None:
    """Why a cluster cannot be started here, or None."""
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        return (f"{', '.join(missing)} not found: `apt-get install -y {PACKAGES}` as root "
                "(`make slurm-tools` does it)")
    if os.geteuid() != 0:
        return "starting slurmctld, slurmd, slurmdbd and munged needs root"
    if left_by_a_killed_test():
        SYSTEM_CONF.unlink()
    if SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
        return f"{SYSTEM_CONF} exists (a real cluster's?): the test cluster never replaces it"
    return None


def left_by_a_killed_test() -> bool:
    """Whether /etc/slurm/slurm.conf is this fixture's link into a temporary directory of a
    session that was killed before it could remove it (its slurmctld no longer runs)."""
    if not SYSTEM_CONF.is_symlink():
        return False
    root = SYSTEM_CONF.readlink().parent
    if not (root.parent == Path(tempfile.gettempdir()) and root.name.startswith(PREFIX)):
        return False
    pid = root / "slurmctld.pid"
    return not (pid.exists() and Path(f"/proc/{pid.read_text().strip()}").exists())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(ready, what: str, log: Path | None = None, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"test cluster: {what} not ready after {timeout:.0f} s\n{tail}")
        time.sleep(0.2)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def node_memory_mb() -> int:
    meminfo = Path("/proc/meminfo").read_text().split()
    return int(meminfo[meminfo.index("MemTotal:") + 1]) // 1024


def largest_memory_ask_mb() -> int:
    """The most memory one job of profiles/slurm asks for."""
    profile = yaml.safe_load(PROFILE.read_text())
    asks = [int(r.split("=")[1]) for r in profile["default-resources"] if r.startswith("mem_mb=")]
    return max(asks + [r["mem_mb"] for r in profile["set-resources"].values() if "mem_mb" in r])


def slurm_conf(root: Path, ports: dict, memory_mb: int) -> str:
    host = socket.gethostname()
    return f"""\
ClusterName={CLUSTER}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ports['slurmctld']}
SlurmdPort={ports['slurmd']}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
SlurmUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without a default every job takes the whole node's memory and jobs run one at a time
DefMemPerCPU=1024
ReturnToService=2
KillWait=2
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={ports['slurmdbd']}
AccountingStoragePass={root}/munge/munge.socket
AccountingStoreFlags=job_comment
# Backfill every second (default 30 s): a 1-CPU job queued behind a whole-node one starts at once.
SchedulerParameters=bf_interval=1
# the node is declared with twice this machine's cores, so that two whole-node jobs (`--cores`
# of the test) run side by side as on a cluster of several nodes, and with the memory the
# profile's jobs ask for (neither is enforced here: no cgroups)
SlurmdParameters=config_overrides
NodeName={host} CPUs={NODE_CPUS} RealMemory={memory_mb} State=UNKNOWN
PartitionName=cpu Nodes={host} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes={host} MaxTime=INFINITE State=UP
"""


def slurmdbd_conf(root: Path, ports: dict) -> str:
    return f"""\
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
DbdHost=localhost
DbdPort={ports['slurmdbd']}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={ports['mariadb']}
StorageUser=slurm
StoragePass={DB_PASSWORD}
StorageLoc=slurm_acct_db
LogFile={root}/log/slurmdbd.log
PidFile={root}/slurmdbd.pid
"""


@dataclass
class Cluster:
    root: Path
    memory_mb: int
    ports: dict = field(default_factory=lambda: {d: free_port() for d in
                                                 ("slurmctld", "slurmd", "slurmdbd", "mariadb")})
    daemons: list = field(default_factory=list)
    linked: bool = False

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *cmd: str, check: bool = True) -> str:
        proc = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.strip()}")
        return proc.stdout

    def daemon(self, name: str, *cmd: str) -> Path:
        log = self.root / "log" / f"{name}.out"
        with open(log, "w") as out:
            self.daemons.append(subprocess.Popen(cmd, env=self.env, stdout=out,
                                                 stderr=subprocess.STDOUT))
        return log

    def start(self) -> None:
        for sub in ("munge", "state", "spool", "log", "db"):
            (self.root / sub).mkdir(mode=0o755)
        self.root.chmod(0o755)  # munged wants every directory above its socket searchable
        self.conf.write_text(slurm_conf(self.root, self.ports, self.memory_mb))
        dbd = self.root / "slurmdbd.conf"  # found beside SLURM_CONF; slurmdbd wants mode 600
        dbd.write_text(slurmdbd_conf(self.root, self.ports))
        dbd.chmod(0o600)
        self.start_munge()
        self.start_database()
        log = self.daemon("slurmdbd", "slurmdbd", "-D")
        wait_for(lambda: listening(self.ports["slurmdbd"]), "slurmdbd", log)
        self.run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.symlink_to(self.conf)
        self.linked = True
        log = self.daemon("slurmctld", "slurmctld", "-D", "-f", str(self.conf))
        wait_for(lambda: listening(self.ports["slurmctld"]), "slurmctld", log)
        log = self.daemon("slurmd", "slurmd", "-D", "-f", str(self.conf))
        wait_for(lambda: self.run("sinfo", "-h", "-N", "-o", "%t", check=False).split()
                 == ["idle", "idle"], "the node (idle in cpu and gpu)", log)

    def start_munge(self) -> None:
        munge = self.root / "munge"
        subprocess.run(["mungekey", "--create", f"--keyfile={munge}/munge.key"], check=True)
        log = self.daemon("munged", "munged", "--foreground", f"--key-file={munge}/munge.key",
                          f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid",
                          f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed")
        wait_for((munge / "munge.socket").exists, "munged", log)

    def start_database(self) -> None:
        db, sock = self.root / "db", self.root / "mariadb.sock"
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={db}", "--user=root",
                        "--skip-test-db"], check=True, capture_output=True)
        log = self.daemon("mariadbd", "mariadbd", "--no-defaults", f"--datadir={db}",
                          f"--socket={sock}", f"--port={self.ports['mariadb']}",
                          "--bind-address=127.0.0.1", "--user=root",
                          f"--pid-file={self.root}/mariadbd.pid")
        client = ["mariadb", "--no-defaults", f"--socket={sock}", "-u", "root", "-e"]
        wait_for(lambda: subprocess.run([*client, "SELECT 1"], capture_output=True).returncode
                 == 0, "mariadbd", log)
        grants = " ".join(
            f"CREATE USER 'slurm'@'{h}' IDENTIFIED BY '{DB_PASSWORD}';"
            f" GRANT ALL ON slurm_acct_db.* TO 'slurm'@'{h}';" for h in ("localhost", "127.0.0.1"))
        subprocess.run([*client, grants], check=True)

    def stop(self) -> None:
        jobs = self.run("squeue", "-h", "-o", "%i", check=False).split() if self.daemons else []
        if jobs:
            self.run("scancel", *jobs, check=False)
            wait_for(lambda: not self.run("squeue", "-h", "-o", "%i", check=False).split(),
                     "the cancelled jobs' end", timeout=30)
        for proc in reversed(self.daemons):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.linked and SYSTEM_CONF.is_symlink() and SYSTEM_CONF.readlink() == self.conf:
            SYSTEM_CONF.unlink()
        shutil.rmtree(self.root, ignore_errors=True)

    def sacct(self, *job_ids: str) -> list[dict]:
        """Allocation rows (no steps) of the given jobs: partition, cpus, memory, time, state."""
        fields = ["JobID", "Partition", "AllocCPUS", "ReqMem", "TimelimitRaw", "State", "ExitCode",
                  "Start", "Elapsed", "Comment"]
        out = self.run("sacct", "-X", "-n", "-P", "-j", ",".join(job_ids),
                       f"--format={','.join(fields)}")
        return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines()]


@pytest.fixture(scope="session")
def slurm_cluster():
    reason = why_no_cluster()
    if reason:
        pytest.skip(reason)
    # room for two of the profile's largest jobs side by side, whatever this machine has
    memory = max(node_memory_mb(), 2 * largest_memory_ask_mb())
    cluster = Cluster(Path(tempfile.mkdtemp(prefix=PREFIX)), memory)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
