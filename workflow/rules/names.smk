# Names that become path components (the host, models, pairs) and the trees this run may write,
# checked from the config alone, before the rules that need torch are read. The name rule itself
# is decodelab.names; the schema has already held every name to it.
import re
import socket
from pathlib import Path

from snakemake.exceptions import WorkflowError

from decodelab.hosts import MANIFEST, REQUIRED, RESERVED
from decodelab.names import NAME_PATTERN, NAME_RULE, is_valid_name

# Model and pair wildcards match names only, so that no name reaches two rules.
NAME_REGEX = NAME_PATTERN.removeprefix("^").removesuffix("$")
# Names no host may take: results/<x> entries that are not a host's (`make report` writes
# results/report.html). This host may not take either the entries of logs/ and benchmarks/ that
# rules outside any host write, which logs/<host>/ and benchmarks/<host>/ would meet.
NOT_RESULTS = (*RESERVED, "report.html")
NOT_HOSTS = (*NOT_RESULTS, "prepare_model", "merge_hosts.log", "paper.log")
# Other hosts: results imported with `decodelab import` into results/<host>/ that the paper
# merges beside this host's. They are inputs, never outputs: only this host's rules match.
IMPORTED = config.get("hosts", [])


def this_host():
    """Config 'host', else this machine's hostname: its first label, other characters as '-',
    less any leading ones that cannot start a name."""
    if config.get("host"):
        return config["host"]
    hostname = socket.gethostname()
    label = next((part for part in hostname.split(".") if part), "")
    name = re.sub(r"[^A-Za-z0-9_-]", "-", label)[:64]
    while name and not is_valid_name(name):
        name = name[1:]
    if not name:
        raise WorkflowError(
            f"this machine's hostname {hostname!r} gives no usable host name; "
            f"set config 'host' ({NAME_RULE})"
        )
    return name


def check_model_names():
    sweep, pairs = config["sweep"], config["speculative"]["pairs"]
    named = [("sweep.models", m) for m in sweep["models"]]
    named += [
        (f"models.{n}.teacher", s["teacher"]) for n, s in config["models"].items() if "teacher" in s
    ]
    named += [
        (f"speculative.pairs.{n}.{role}", p[role])
        for n, p in pairs.items()
        for role in ("target", "draft")
    ]
    for key, name in named:
        if name not in config["models"]:
            raise WorkflowError(f"config '{key}': no model named {name!r} in 'models'")
    for name in sweep.get("ablation_models", []):
        if name not in sweep["models"]:
            raise WorkflowError(f"config 'sweep.ablation_models': {name!r} is not in sweep.models")


def check_verification_pairs():
    pairs = config["speculative"]["pairs"]
    for name in config["verification"]["pairs"]:
        if name not in pairs:
            raise WorkflowError(
                f"config 'verification.pairs': no pair named {name!r} in "
                f"'speculative.pairs' (known: {', '.join(pairs)})"
            )


def case_twin(names):
    """Two of `names` equal but for case (one directory on macOS's file system), or None."""
    seen = {}
    for name in names:
        if name.casefold() in seen:
            return seen[name.casefold()], name
        seen[name.casefold()] = name
    return None


def check_names_differ_by_more_than_case():
    named = {"models": config["models"], "speculative.pairs": config["speculative"]["pairs"]}
    for key, names in named.items():
        twins = case_twin(names)
        if twins:
            raise WorkflowError(
                f"config '{key}': {twins[0]!r} and {twins[1]!r} differ only by case, and name "
                "the same directory on a case-insensitive file system (macOS); rename one"
            )


def check_hosts():
    """This host writes only results/<host>/: never a reserved folder, never an imported host."""
    if HOST.casefold() in {name.casefold() for name in NOT_HOSTS}:
        raise WorkflowError(
            f"host name {HOST!r} is reserved ({', '.join(NOT_HOSTS)} are "
            "entries of results/, logs/ or benchmarks/ that are not a host's, in "
            "any case); set config 'host' to another name"
        )
    twins = case_twin([HOST, *IMPORTED])
    if twins:
        raise WorkflowError(
            f"config 'hosts': {twins[1]!r} names the same results/ directory as "
            f"{twins[0]!r} (this host or another listed one; case does not tell "
            "names apart on macOS)"
        )
    if Path(f"results/{HOST}/{MANIFEST}").is_file():
        raise WorkflowError(
            f"host name {HOST!r}: results/{HOST}/ holds results imported from "
            f"another host (results/{HOST}/{MANIFEST}), which this run must not "
            "overwrite; set config 'host' to another name"
        )
    for host in IMPORTED:
        if host.casefold() in {name.casefold() for name in NOT_RESULTS}:
            raise WorkflowError(
                f"config 'hosts': {host!r} is a reserved name "
                f"({', '.join(NOT_RESULTS)}, in any case), not a host's results"
            )
        missing = [
            f"results/{host}/stats/{t}.csv"
            for t in REQUIRED
            if not Path(f"results/{host}/stats/{t}.csv").is_file()
        ]
        if missing:
            raise WorkflowError(
                f"config 'hosts' lists {host!r} but {', '.join(missing)} is "
                f"missing; import it first: decodelab import --from <dir or "
                f"tarball> --host {host}"
            )


HOST = this_host()
check_model_names()
check_verification_pairs()
check_names_differ_by_more_than_case()
check_hosts()


wildcard_constraints:
    host=re.escape(HOST),
    model=NAME_REGEX,
    pair=NAME_REGEX,
