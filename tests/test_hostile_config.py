"""Hostile and careless configs (issue 13): names that would leave results/, errors that name
the key, position tables checked before any job, and no config that reaches a reference run or
another host's results."""

import copy
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from dag import ROOT, SNAKEMAKE, copy_workflow, other_host, snakemake

from decodelab import cli
from decodelab.core.hosts import MANIFEST

SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
DEFAULT = yaml.safe_load((ROOT / "config.yaml").read_text())
BAD_NAMES = [".", "..", ".hidden", "a/b", "../x", "a b", "x" * 65, ""]


def write_edited(workdir: Path, edit, name: str = "changed.yaml") -> Path:
    """The default config changed in place by `edit(config)`, as a file in `workdir`."""
    config = copy.deepcopy(DEFAULT)
    edit(config)
    path = workdir / name
    path.write_text(yaml.safe_dump(config))
    return path


def refusal(out: subprocess.CompletedProcess) -> str:
    """The one line a refused run says, less Snakemake's notices and frame lines."""
    noise = ("Using workflow specific profile", "decodelab: skipping backend",
             "WorkflowError in file", "  File \"")
    lines = [line for line in (out.stdout + out.stderr).splitlines()
             if line.strip() and not line.startswith(noise)]
    assert out.returncode != 0, out.stdout
    assert len(lines) == 1, "\n".join(lines)
    return lines[0]


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# -----------------------------------------------------------------------------
# names: one rule, in the schema and in decodelab.core.names


def schema_walk(node, path=()):
    """(path, subschema) of every mapping in the schema."""
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from schema_walk(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from schema_walk(value, (*path, i))


def test_every_name_pattern_of_the_schema_is_the_name_rule():
    from decodelab.core.names import NAME_PATTERN

    schema = yaml.safe_load(SCHEMA.read_text())
    props = schema["properties"]
    spec = props["speculative"]["properties"]
    pair = spec["pairs"]["additionalProperties"]["properties"]
    train = props["models"]["additionalProperties"]["allOf"][3]["then"]["properties"]
    names = {
        "host": props["host"],
        "hosts": props["hosts"]["items"],
        "models (keys)": props["models"]["propertyNames"],
        "speculative.pairs (keys)": spec["pairs"]["propertyNames"],
        "pair target": pair["target"],
        "pair draft": pair["draft"],
        "sweep.models": props["sweep"]["properties"]["models"]["items"],
        "sweep.ablation_models": props["sweep"]["properties"]["ablation_models"]["items"],
        "verification.pairs": props["verification"]["properties"]["pairs"]["items"],
        "teacher": train["teacher"],
    }
    patterns = {key: s.get("pattern") for key, s in names.items()}
    assert patterns == dict.fromkeys(names, NAME_PATTERN)
    keys = [s["pattern"] for path, s in schema_walk(schema) if path[-1:] == ("propertyNames",)]
    assert set(keys) == {NAME_PATTERN}


@pytest.mark.parametrize("bad", BAD_NAMES, ids=repr)
def test_a_bad_name_anywhere_is_one_line_naming_the_key_and_the_rule(bad):
    from decodelab.config.check import schema_problem
    from decodelab.core.names import NAME_RULE

    pair = DEFAULT["speculative"]["pairs"]["cpu-cpu"]
    places = {
        "'models'": lambda c: c["models"].__setitem__(bad, {"source": "init", "preset": "gpt2"}),
        "'speculative.pairs'": lambda c: c["speculative"]["pairs"].__setitem__(bad, pair),
        "'host'": lambda c: c.__setitem__("host", bad),
        "'hosts[0]'": lambda c: c.__setitem__("hosts", [bad]),
        "'sweep.models[0]'": lambda c: c["sweep"].__setitem__("models", [bad]),
        "'speculative.pairs.cpu-cpu.target'":
            lambda c: c["speculative"]["pairs"]["cpu-cpu"].__setitem__("target", bad),
    }
    for key, edit in places.items():
        config = copy.deepcopy(DEFAULT)
        edit(config)
        problem = schema_problem(config, SCHEMA)
        assert problem and problem.startswith(f"config {key}: ") and NAME_RULE in problem, problem
        assert "\n" not in problem


def test_a_model_named_dotdot_is_refused_and_results_survive(tmp_path):
    """Issue 13, item 1: prepare() removed results/models/.. = all of results/."""
    workdir = copy_workflow(tmp_path)
    other_host(workdir / "results/mac")
    reference = workdir / "results/reference/default-cpu/README.md"
    reference.parent.mkdir(parents=True)
    reference.write_text("a committed reference\n")
    before = tree_digest(workdir / "results")

    def dotdot(c):  # one model, so that the old code prepares nothing else first
        c["models"] = {"..": {"source": "init", "preset": "gpt2-tiny"}}
        c["sweep"]["models"] = [".."]
        for pair in c["speculative"]["pairs"].values():
            pair.update(target="..", draft="..")

    out = snakemake(workdir, "-c1", "--until", "prepare_model", "--configfile",
                    str(write_edited(workdir, dotdot)), check=False)
    assert tree_digest(workdir / "results") == before
    assert refusal(out).startswith("config 'models': '..' is not a usable name: ")


@pytest.mark.parametrize("host", ["..", "."])
def test_a_host_of_dots_is_refused_and_nothing_lands_beside_results(tmp_path, host):
    """Item 2: `--until skipped` wrote stats/skipped.csv at the repository root."""
    workdir = copy_workflow(tmp_path)
    out = snakemake(workdir, "-c1", "--until", "skipped", "--configfile",
                    str(write_edited(workdir, lambda c: c.__setitem__("host", host))),
                    check=False)
    assert refusal(out).startswith(f"config 'host': {host!r} is not allowed; expected a name: ")
    assert not (workdir / "stats").exists() and not (workdir / "results").exists()


def test_a_pair_named_dotdot_is_refused(tmp_path):
    workdir = copy_workflow(tmp_path)

    def dotdot(c):
        c["speculative"]["pairs"][".."] = c["speculative"]["pairs"].pop("cpu-cpu")
        c["verification"]["pairs"] = [".."]

    out = snakemake(workdir, "-n", "--configfile", str(write_edited(workdir, dotdot)),
                    check=False)
    assert refusal(out).startswith("config 'speculative.pairs': '..' is not a usable name: ")


def test_two_model_names_equal_but_for_case_are_refused(tmp_path):
    workdir = copy_workflow(tmp_path)

    def twins(c):
        c["models"]["GPT2-tiny"] = c["models"]["gpt2-tiny"]
        c["sweep"]["models"] = ["gpt2-tiny", "GPT2-tiny"]

    out = snakemake(workdir, "-n", "--configfile", str(write_edited(workdir, twins)),
                    check=False)
    line = refusal(out)
    assert line.startswith("config 'models': 'GPT2-tiny' and 'gpt2-tiny' differ only by case")


# -----------------------------------------------------------------------------
# the machine's hostname, when config 'host' is null


def can_set_hostname() -> bool:
    if sys.platform != "linux" or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-u", "true"], capture_output=True).returncode == 0


def snakemake_on_host(workdir: Path, hostname: str, *args: str) -> subprocess.CompletedProcess:
    """snakemake in a UTS namespace of its own whose hostname is `hostname`."""
    boot = ("import os, socket, sys; socket.sethostname(sys.argv[1]); "
            "os.execv(sys.argv[2], sys.argv[2:])")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    command = ["unshare", "-u", sys.executable, "-c", boot, hostname, SNAKEMAKE, *args]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.skipif(not can_set_hostname(), reason="needs root and unshare (Linux)")
def test_a_hostname_that_makes_no_name_is_refused(tmp_path):
    workdir = copy_workflow(tmp_path)
    out = snakemake_on_host(workdir, "...", "-n", "--configfile",
                            str(write_edited(workdir, lambda c: c.__setitem__("host", None))))
    assert refusal(out).startswith("this machine's hostname '...' gives no usable host name; "
                                   "set config 'host' (letters, digits")


# -----------------------------------------------------------------------------
# every planned file of an adversarial-but-valid config: unique, inside its tree

ADVERSARIAL_HOST = "speculative"  # from the hostname ".speculative.example": its first label


def adversarial(c):
    """Names that are also directory and file names of the layout, every backend planned."""
    models = c["models"]
    renamed = {"gpt2-tiny": "sweep", "opt-tiny": "ablation", "bloom-tiny": "rep0.parquet",
               "target": "parallelism", "draft": "speculative", "long-target": "long"}
    c["models"] = {renamed[k]: v for k, v in models.items()}
    c["models"]["speculative"]["teacher"] = "parallelism"
    c["long"]["target"] = "long"
    c["batched"] |= {"target": "parallelism", "draft": "speculative"}
    c["models"]["stats"] = {"source": "hf", "repo": "org/model", "revision": "0" * 40}
    c["sweep"]["models"] = ["sweep", "ablation", "rep0.parquet", "stats"]
    pairs = {"exact": "cpu-cpu", "monte_carlo": "cuda-cuda", "cpu": "cpu-cuda",
             "real_exact": "mps-mps", "speculative": "cpu-mps"}
    c["speculative"]["pairs"] = {
        new: {**c["speculative"]["pairs"][old], "target": "parallelism", "draft": "speculative"}
        for new, old in pairs.items()}
    c["verification"]["pairs"] = list(pairs)
    c["assume_available"] = ["cuda", "mps"]
    c["host"] = None if can_set_hostname() else ADVERSARIAL_HOST


@pytest.fixture(scope="module")
def adversarial_plan(tmp_path_factory) -> str:
    workdir = copy_workflow(tmp_path_factory.mktemp("adversarial"))
    args = ("-n", "-p", "--configfile", str(write_edited(workdir, adversarial)))
    if can_set_hostname():
        out = snakemake_on_host(workdir, f".{ADVERSARIAL_HOST}.example", *args)
    else:
        out = snakemake(workdir, *args, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def planned_files(dry_run: str) -> list[tuple[str, str, str]]:
    """(rule, kind, path) of every output, log and benchmark file of a dry run."""
    files, rule = [], None
    for line in dry_run.splitlines():
        if m := re.match(r"^(?:local)?rule (\w+):$", line):
            rule = m[1]
        elif m := re.match(r"^    (output|log|benchmark): (.+)$", line):
            files += [(rule, m[1], path) for path in m[2].split(", ")]
    return files


def test_every_planned_file_is_unique_and_inside_its_tree(adversarial_plan):
    files = planned_files(adversarial_plan)
    host = ADVERSARIAL_HOST
    assert len(files) > 300
    paths = [path for _, _, path in files]
    assert len(paths) == len(set(paths)), sorted(p for p in paths if paths.count(p) > 1)
    for path in paths:
        assert os.path.normpath(path) == path and not path.startswith("/"), path
        parent = next((q for q in paths if path.startswith(q + "/")), None)
        assert parent is None, f"{parent} is a file and the directory of {path}"
    allowed = {
        "output": (f"results/{host}/", "results/models/", "results/combined/", "results/paper/"),
        "log": (f"logs/{host}/", "logs/combined/", "logs/prepare_model/", "logs/merge_hosts.log",
                "logs/paper.log"),
        "benchmark": (f"benchmarks/{host}/", "benchmarks/prepare_model/"),
    }
    outside = [(rule, kind, path) for rule, kind, path in files
               if not path.startswith(allowed[kind])]
    assert not outside, outside
    models = {path for rule, kind, path in files if rule == "prepare_model" and kind == "output"}
    assert models == {f"results/models/{m}" for m in
                      ("sweep", "ablation", "rep0.parquet", "parallelism", "speculative", "stats",
                       "long")}


def test_the_hf_model_job_is_given_the_longest_sequence_to_check(adversarial_plan):
    """Item 10: an hf model's positions are known only once downloaded; its prepare_model job
    refuses it then, before any sweep job (the budgets here reach 128 + 32 tokens)."""
    assert re.search(r"prepare-model --spec '\{[^']*\"source\": \"hf\"\}'.* --positions-needed 160 "
                     r"--out results/models/stats ", adversarial_plan)


# -----------------------------------------------------------------------------
# errors that name the key (item 9)


def unknown_pair(c):
    c["verification"]["pairs"] = ["nosuch"]


def no_parallelism_ks(c):
    c["speculative"]["parallelism"]["ks"] = []


def branch_revision(c):
    c["models"]["hub"] = {"source": "hf", "repo": "org/model", "revision": "main"}


@pytest.mark.parametrize("edit, message", [
    (unknown_pair, "config 'verification.pairs': no pair named 'nosuch' in 'speculative.pairs' "
                   "(known: cpu-cpu, "),
    (no_parallelism_ks, "config 'speculative.parallelism.ks': [] is not allowed; expected a "
                        "non-empty list, each an integer >= 1"),
    (branch_revision, "config 'models.hub.revision': 'main' is not allowed; expected a pinned "
                      "commit, 40 lowercase hex digits"),
], ids=["unknown pair", "empty parallelism ks", "branch revision"])
def test_a_bad_value_is_one_line_naming_the_key_and_what_is_allowed(tmp_path, edit, message):
    workdir = copy_workflow(tmp_path)
    out = snakemake(workdir, "-n", "--configfile", str(write_edited(workdir, edit)), check=False)
    assert refusal(out).startswith(message)


def test_every_list_of_the_schema_must_hold_something_unless_empty_makes_sense():
    from decodelab.config.check import schema_problem

    schema = yaml.safe_load(SCHEMA.read_text())
    lists = [path[1::2] for path, s in schema_walk(schema)  # lists at a fixed config key
             if s.get("type") == "array" and set(path[::2]) == {"properties"}]
    # No hosts to merge, nothing assumed, no model measured in llama.cpp and no peer run (the
    # default profile).
    may_be_empty = {("hosts",), ("assume_available",), ("quantized", "models"),
                    ("quantized", "peer")}
    assert {path for path in lists if not schema_at(schema, path).get("minItems")} == may_be_empty
    for path in set(lists) - may_be_empty:
        config = copy.deepcopy(DEFAULT)
        node = config
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = []
        assert schema_problem(config, SCHEMA).startswith(f"config '{'.'.join(path)}': [] ")


def schema_at(schema: dict, path: tuple) -> dict:
    for key in path:
        schema = schema["properties"][key]
    return schema


# -----------------------------------------------------------------------------
# position tables (item 10)


def test_a_local_model_too_short_for_the_budget_is_refused_when_the_dag_is_built(tmp_path):
    workdir = copy_workflow(tmp_path)
    local = tmp_path / "gpt2-dir"
    local.mkdir()
    (local / "config.json").write_text('{"model_type": "gpt2", "n_positions": 1024}')

    def long_budget(c):
        c["models"]["gpt2-local"] = {"source": "local", "path": str(local)}
        c["sweep"]["models"] = ["gpt2-local"]
        c["sweep"]["budgets"] = [8, 1000]

    out = snakemake(workdir, "-n", "--configfile", str(write_edited(workdir, long_budget)),
                    check=False)
    assert refusal(out).startswith(
        "model 'gpt2-local' has 1024 positions, fewer than the 1032 tokens of config 'sweep' "
        "(budget 1000 + prompt length 32)")


def test_prepare_model_refuses_a_model_too_short_and_leaves_nothing(tmp_path, capsys):
    out = tmp_path / "models" / "tiny"
    spec = '{"source": "init", "preset": "gpt2-tiny", "seed": 1}'
    code = cli.main(["prepare-model", "--spec", spec, "--positions-needed", "1500",
                     "--out", str(out)])
    assert code == 2
    assert "model 'tiny' has 1024 positions, fewer than the 1500 tokens" in capsys.readouterr().err
    assert not out.exists()


# -----------------------------------------------------------------------------
# no config reaches results/reference/ or another host's results/<host>/


@pytest.fixture(scope="module")
def tree_with_others(tmp_path_factory) -> Path:
    """A workflow copy holding a reference run and an imported host, `mac`."""
    root = copy_workflow(tmp_path_factory.mktemp("others"))
    other_host(root / "results/reference/default-cpu")
    other_host(root / "results/mac")
    (root / "results/mac" / MANIFEST).write_text('{"host": "mac"}\n')
    return root


@pytest.mark.parametrize("host, hosts, message", [
    ("mac", ["mac"], "config 'hosts': 'mac' names the same results/ directory as 'mac'"),
    ("mac", [], "host name 'mac': results/mac/ holds results imported from another host"),
    ("Reference", [], "host name 'Reference' is reserved"),
    ("prepare_model", [], "host name 'prepare_model' is reserved"),
], ids=["listed import", "unlisted import", "reference in another case", "prepare_model"])
def test_a_host_that_would_write_into_another_tree_is_refused(tree_with_others, host, hosts,
                                                              message):
    before = tree_digest(tree_with_others / "results")
    config = write_edited(tree_with_others, lambda c: c.update(host=host, hosts=hosts),
                          name=f"{host}.yaml")
    out = snakemake(tree_with_others, "-n", "--configfile", str(config), check=False)
    assert refusal(out).startswith(message)
    assert tree_digest(tree_with_others / "results") == before


# -----------------------------------------------------------------------------
# issue 60, round two: names that end in a newline, control characters, numbers without limits,
# config files that cost or run, an unwritable HOME


def edited(edit) -> dict:
    config = copy.deepcopy(DEFAULT)
    edit(config)
    return config


@pytest.mark.parametrize("key, edit", [
    ("host", lambda c: c.__setitem__("host", "x\n")),
    ("hosts[0]", lambda c: c.__setitem__("hosts", ["mac\n"])),
    ("sweep.models[0]", lambda c: c["sweep"].__setitem__("models", ["gpt2-tiny\n"])),
    ("quantized.peer[0]", lambda c: c.setdefault("quantized", {}).__setitem__("peer", ["p\n"])),
    ("gpu_model", lambda c: c.__setitem__("gpu_model", "H100\n")),
    ("models.hub.revision", lambda c: c["models"].__setitem__(
        "hub", {"source": "hf", "repo": "org/m", "revision": "0" * 40 + "\n"})),
], ids=lambda v: v if isinstance(v, str) else "")
def test_a_name_with_a_trailing_newline_is_refused_naming_the_key(key, edit):
    """`$` of a schema pattern matched before a final newline (re.search)."""
    from decodelab.config.check import schema_problem

    problem = schema_problem(edited(edit), SCHEMA)
    assert problem and problem.startswith(f"config '{key}': "), problem
    assert "\n" not in problem


def test_every_pattern_of_the_schema_is_anchored_at_both_ends_of_the_string():
    schema = yaml.safe_load(SCHEMA.read_text())
    patterns = [(path, s["pattern"]) for path, s in schema_walk(schema) if "pattern" in s]
    assert len(patterns) > 10
    for path, pattern in patterns:
        assert pattern.startswith("\\A") and pattern.endswith("\\Z"), (path, pattern)
        assert not re.search(pattern, "a\n") and not re.search(pattern, "org/m\n")


@pytest.mark.parametrize("key, edit, code", [
    ("containers.cpu", lambda c: c.__setitem__("containers", {"cpu": "a\x1b[2J.sif",
                                                              "cuda": "b.sif"}), "U+001B"),
    ("models.tiny.path", lambda c: c["models"].__setitem__(
        "tiny", {"source": "local", "path": "/tmp/a\u2028b"}), "U+2028"),
    ("models.tiny.preset", lambda c: c["models"].__setitem__(
        "tiny", {"source": "init", "preset": "gpt2\u200b"}), "U+200B"),
    ("models.gpt2-tiny.seed", lambda c: c["models"]["gpt2-tiny"].__setitem__("seed", "\x85"),
     "U+0085"),
], ids=["escape in an image", "line separator in a path", "zero-width space", "C1 NEL"])
def test_a_control_character_in_any_string_is_one_line_naming_the_key(key, edit, code):
    from decodelab.config.check import schema_problem

    problem = schema_problem(edited(edit), SCHEMA)
    assert problem == (f"config '{key}': the string holds a control character ({code}, at "
                       f"position {problem.split('position ')[1]}"), problem


def test_every_number_of_the_schema_has_a_minimum_and_a_maximum():
    """So that a new key cannot slip in unbounded: YAML's .inf passes any minimum."""
    schema = yaml.safe_load(SCHEMA.read_text())
    numbers = [(path, s) for path, s in schema_walk(schema)
               if {"number", "integer"} & set([s["type"]] if isinstance(s.get("type"), str)
                                              else s.get("type", []))]
    assert len(numbers) > 80
    for path, s in numbers:
        assert {"minimum", "exclusiveMinimum"} & s.keys(), path
        assert {"maximum", "exclusiveMaximum"} & s.keys(), path


@pytest.mark.parametrize("key, value", [
    ("regimes.threshold", float("nan")),
    ("stats.confidence", float("nan")),
    ("models.target.corpus_mb", float("inf")),
    ("speculative.parallelism.ks[1]", float("nan")),
    ("stats.stability.cv_between", float("inf")),
], ids=repr)
def test_nan_or_infinity_anywhere_is_refused_naming_the_key(key, value):
    from decodelab.config.check import schema_problem

    def edit(c):
        *parents, last = re.findall(r"[\w-]+|\[\d+\]", key)
        node = c
        for part in parents:
            node = node.setdefault(part, {})
        if last.startswith("["):
            node[int(last[1:-1])] = value
        else:
            node[last] = value

    problem = schema_problem(edited(edit), SCHEMA)
    assert problem and problem.startswith(f"config '{key}': {value} is not allowed; expected "), \
        problem


def test_yaml_nan_and_inf_in_a_file_are_refused_when_the_dag_is_built(tmp_path):
    workdir = copy_workflow(tmp_path)
    config = write_edited(workdir, lambda c: c.setdefault("regimes", {}).__setitem__(
        "threshold", float("nan")))
    assert "threshold: .nan" in config.read_text()
    out = snakemake(workdir, "-n", "--configfile", str(config), check=False)
    assert refusal(out) == ("config 'regimes.threshold': nan is not allowed; expected a finite "
                            "number")


@pytest.mark.parametrize("key, edit, allowed", [
    ("sweep.repeats", lambda c: c["sweep"].__setitem__("repeats", 10**9), "<= 100"),
    ("stats.bootstrap_resamples", lambda c: c.setdefault("stats", {}).__setitem__(
        "bootstrap_resamples", 10**12), "<= 1000000"),
    ("sweep.inner_repeats", lambda c: c["sweep"].__setitem__("inner_repeats", 10**7), "<= 1000"),
    ("verification.exact.vocab_sizes[0]", lambda c: c["verification"].setdefault(
        "exact", {}).__setitem__("vocab_sizes", [10**9]), "<= 262144"),
    ("models.target.n_layer", lambda c: c["models"]["target"].__setitem__("n_layer", 100_000),
     "<= 256"),
], ids=lambda v: v if isinstance(v, str) and "." in v else "")
def test_a_number_past_its_maximum_is_refused_naming_the_key_and_the_limit(key, edit, allowed):
    from decodelab.config.check import schema_problem

    problem = schema_problem(edited(edit), SCHEMA)
    assert problem and problem.startswith(f"config '{key}': ") and allowed in problem, problem


def bomb(levels: int) -> str:
    """The classic: each list nine aliases of the one before; `levels` 7 is 4.8M strings."""
    items = ["&a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def test_an_alias_bomb_is_refused_before_anything_expands_it(tmp_path):
    workdir = copy_workflow(tmp_path)
    config = workdir / "bomb.yaml"
    config.write_text((ROOT / "config.yaml").read_text().replace(
        "seed: ", f"seed: {bomb(7)} #", 1))
    assert config.stat().st_size < 10_000
    out = snakemake(workdir, "-n", "--configfile", str(config), check=False)
    assert re.fullmatch(rf"decodelab: config file {re.escape(str(config))}, line \d+: holds "
                        r"more than 100000 values once its aliases are expanded \(an alias "
                        r"bomb\?\); a config holds a few hundred", refusal(out))


def test_yte_in_a_config_file_never_runs(tmp_path):
    """Snakemake evaluates a `__use_yte__: true` file's Python while it parses the command line;
    the workflow profile's preflight refuses the file before that."""
    workdir = copy_workflow(tmp_path)
    marker = tmp_path / "ran"
    config = workdir / "yte.yaml"
    config.write_text(f"__use_yte__: true\n__definitions__:\n  - open({str(marker)!r}, 'w')\n"
                      + (ROOT / "config.yaml").read_text())
    out = snakemake(workdir, "-n", "--configfile", str(config), check=False)
    assert refusal(out).startswith(f"decodelab: config file {config}, line 1: '__use_yte__' "
                                   "(YTE templates, which Snakemake evaluates as Python) is not "
                                   "allowed")
    assert not marker.exists()


def test_without_the_workflow_profile_the_snakefile_still_refuses_yte(tmp_path):
    """`--workflow-profile none` skips the preflight: Snakemake has run the template by then
    (nothing here can stop that), but the run goes no further."""
    workdir = copy_workflow(tmp_path)
    config = workdir / "yte.yaml"
    config.write_text("__use_yte__: true\n" + (ROOT / "config.yaml").read_text())
    out = snakemake(workdir, "-n", "--workflow-profile", "none", "--configfile", str(config),
                    check=False)
    assert refusal(out).startswith(f"config file {config}, line 1: '__use_yte__'")


def test_a_home_where_snakemake_cannot_cache_is_one_line(tmp_path):
    workdir = copy_workflow(tmp_path)
    home = tmp_path / "home"
    home.write_text("a file, not a directory\n")
    env = {**os.environ, "HOME": str(home), "PATH": f"{Path(sys.executable).parent}"
           f"{os.pathsep}{os.environ['PATH']}"}
    env.pop("XDG_CACHE_HOME", None)
    out = subprocess.run([SNAKEMAKE, "-n"], cwd=workdir, env=env, capture_output=True,
                         text=True, timeout=600)
    line = refusal(out)
    assert line.startswith(f"decodelab: Snakemake's source cache {home}/.cache/snakemake/")
    assert line.endswith("cannot be written (Not a directory); set XDG_CACHE_HOME (or HOME) to a "
                         "writable directory")


@pytest.mark.parametrize("text, problem", [
    ("a: !!python/name:os.system x\n", "line 1: tag 'tag:yaml.org,2002:python/name:os.system'"),
    ("a: !custom x\n", "line 1: tag '!custom' is not allowed"),
    ("a: " + "[" * 70 + "]" * 70 + "\n", "line 1: nested deeper than 64 levels"),
    ("a: [unclosed\n", ": not valid YAML ("),
    ("x: &big [" + ", ".join(["1"] * 1000) + "]\ny: [" + ", ".join(["*big"] * 200) + "]\n",
     "line 2: holds more than 100000 values"),
], ids=["python tag", "custom tag", "deep", "invalid", "aliases"])
def test_a_config_file_is_plain_yaml_of_a_configs_size(tmp_path, text, problem):
    from decodelab.core.yamlsafe import file_problem

    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert problem in file_problem(path)
    path.write_text("a: 1\n" + "# " + "x" * (1 << 20) + "\n")
    assert file_problem(path).endswith("is larger than 1048576 bytes (1 MiB); a config is a few "
                                       "kilobytes")
    path.write_text((ROOT / "config.yaml").read_text())
    assert file_problem(path) is None


def test_the_preflight_finds_every_spelling_of_configfile():
    from decodelab.core.yamlsafe import configfiles_in

    argv = ["-n", "--configfile", "a.yaml", "b.yaml", "--config", "x=1", "--configf=c.yaml",
            "--configfiles", "d.yaml", "-c1", "e"]
    assert configfiles_in(argv) == ["a.yaml", "b.yaml", "c.yaml", "d.yaml"]
