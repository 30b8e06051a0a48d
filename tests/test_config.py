"""decodelab.config.settings: the typed settings, the JSON each rule passes, and every check the
schema
cannot express (a valid config passes each; each bad one gets its message)."""

import copy
import json
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml
from snakemake.utils import validate

from decodelab.cli import typed
from decodelab.config import settings as cfg
from decodelab.config.check import schema_problem, with_defaults
from decodelab.config.settings import Confidence, Pair, Sampling, Settings, Stability
from decodelab.core.errors import DecodelabError

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "workflow/schemas/config.schema.yaml"
PROFILES = ["config.yaml", "config/gpu.yaml", "config/paper.yaml", "config/paper-offline.yaml",
            "config/quantized.yaml", "config/long.yaml"]


def validated(path: str = "config.yaml", **changes) -> dict:
    config = yaml.safe_load((ROOT / path).read_text()) | changes
    validate(config, str(SCHEMA))
    return config


def settings(**changes) -> Settings:
    return Settings.from_config(validated(**changes))


def spec_json(obj) -> str:
    return json.dumps(obj, sort_keys=True)


@pytest.mark.parametrize("profile", PROFILES)
def test_job_specs_are_the_config_sections_as_given(profile):
    """The JSON a rule passes is stamped into raw files: it must stay the config's keys and
    values exactly (the dicts the rules built before the typed settings)."""
    config = validated(profile)
    s = Settings.from_config(config)
    sweep, spec, verify = config["sweep"], config["speculative"], config["verification"]
    keys = ("budgets", "prompt_lengths", "dtype", "inner_repeats", "warmup", "sdp_backends",
            "engine")
    assert spec_json(s.sweep.job_spec()) == spec_json(
        {**{k: sweep[k] for k in keys if k in sweep}, "seed": config["seed"]})
    keys = ("ks", "modes", "temperature", "top_k", "top_p", "prompts", "prompt_len", "budget",
            "hf_assisted")
    backends = {"sdp_backends": spec["sdp_backends"]} if "sdp_backends" in spec else {}
    assert spec_json(s.speculative.job_spec()) == spec_json(
        {**{k: spec[k] for k in keys}, "seed": config["seed"], **backends})
    assert spec_json(s.speculative.parallelism_spec("bfloat16")) == spec_json(
        {**spec["parallelism"], "dtype": "bfloat16", "seed": config["seed"], **backends})
    assert spec_json({n: p.job_spec() for n, p in s.speculative.pairs.items()}) == spec_json(
        spec["pairs"])
    assert spec_json(s.verification.job_spec()) == spec_json(
        {**{k: v for k, v in verify.items() if k != "pairs"}, "seed": config["seed"]})
    stats = {k: v for k, v in config["stats"].items() if k != "stability"}
    assert spec_json(s.stats.job_spec()) == spec_json(stats)
    assert spec_json(s.stability.job_spec()) == spec_json(config["stats"]["stability"])
    assert spec_json(s.regimes.job_spec()) == spec_json(config["regimes"])
    assert spec_json(s.regimes.rule_spec()) == spec_json(
        {k: config["regimes"][k] for k in ("window", "threshold", "consistency", "alpha")})
    assert spec_json(s.paper_settings("h")) == spec_json({
        "host": "h", "backends": config["backends"], "shuffle_seed": config["seed"], **sweep,
        "models": {n: config["models"][n] for n in sweep["models"]},
        "regimes": config["regimes"], "stats": config["stats"], "speculative": spec,
        "verification": verify,
        **({"long_verification": config["long"]["verification"]}
           if "verification" in config.get("long", {}) else {})})


def test_settings_are_typed_and_frozen():
    s = settings()
    assert s.sweep.budgets[0] == 8 and isinstance(s.sweep.budgets, tuple)
    assert s.stats == Confidence(0.95, 2000, 7)
    assert s.stability == Stability(cv_between=0.25, cv_within=0.35, max_over_median=2.0,
                                    background=0.15, noisy_share=0.2)
    assert s.speculative.sampling == Sampling(1.0, 0, 1.0)
    assert s.speculative.pairs["cpu-cuda"] == Pair("target", "draft", "cuda", "cpu", "float32")
    assert s.speculative.pairs["cpu-cuda"].devices == {"cpu", "cuda"}
    assert s.sweep.ablation == s.sweep.models  # no ablation_models: every swept model
    with pytest.raises(AttributeError):
        s.sweep.repeats = 1


def test_sampling_modes():
    sampled = Sampling(0.7, 40, 0.9)
    assert sampled.in_mode("sampled") == sampled and not sampled.greedy
    assert sampled.in_mode("greedy") == Sampling() and Sampling().greedy


def test_confidence_round_trips_its_spec():
    spec = {"confidence": 0.9, "bootstrap_resamples": 300, "seed": 3}
    assert Confidence.from_spec(spec).job_spec() == spec


@pytest.mark.parametrize("profile", PROFILES)
def test_defaults_are_filled_as_snakemake_fills_them(profile):
    raw = yaml.safe_load((ROOT / profile).read_text())
    assert with_defaults(copy.deepcopy(raw), yaml.safe_load(SCHEMA.read_text())) == validated(
        profile)


def test_load_settings_outside_snakemake(tmp_path):
    assert cfg.load_settings(ROOT / "config.yaml", SCHEMA) == settings()
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "config.yaml").read_text().replace("budget: 64", "budget: 1"))
    with pytest.raises(DecodelabError, match=r"bad.yaml: config 'speculative.budget': 1 is not"):
        cfg.load_settings(bad, SCHEMA)


def test_position_needs():
    needs = settings().position_needs()
    assert needs["gpt2-tiny"] == (160, "config 'sweep' (budget 128 + prompt length 32)")
    batched = "config 'batched' (longest context 192 + budget 16 + 2 K + 1 = 215)"
    assert needs["target"] == (215, batched) and needs["draft"] == (215, batched)
    without = {k: v for k, v in validated().items() if k != "batched"}
    needs = Settings.from_config(without).position_needs()
    assert needs["target"] == (
        169, "config 'speculative.parallelism' (context 128 + 24 for 5 inner repeats + K 16 + 1)")
    assert needs["draft"] == (104, "config 'speculative' (prompt_len 32 + budget 64 + K 8)")


# --- the checks: valid passes (negative control), each bad config gets its message -------------

def test_this_host():
    assert cfg.this_host("given", "ignored") == "given"
    assert cfg.this_host(None, "node-1.cluster.example") == "node-1"
    assert cfg.this_host(None, "-a b.x") == "a-b"
    with pytest.raises(DecodelabError, match="hostname '...' gives no usable host name; set con"):
        cfg.this_host(None, "...")


def test_check_model_names():
    cfg.check_model_names(settings())
    with pytest.raises(DecodelabError, match="config 'sweep.models': no model named 'nope' in"):
        cfg.check_model_names(settings(sweep=validated()["sweep"] | {"models": ["nope"]}))
    config = validated()
    config["models"]["draft"]["teacher"] = "ghost"
    with pytest.raises(DecodelabError, match="config 'models.draft.teacher': no model named 'gh"):
        cfg.check_model_names(Settings.from_config(config))
    config = validated()
    config["speculative"]["pairs"]["cpu-cpu"]["draft"] = "ghost"
    with pytest.raises(DecodelabError, match="'speculative.pairs.cpu-cpu.draft': no model named"):
        cfg.check_model_names(Settings.from_config(config))
    config = validated()
    config["sweep"]["ablation_models"] = ["target"]
    with pytest.raises(DecodelabError, match="'sweep.ablation_models': 'target' is not in sweep"):
        cfg.check_model_names(Settings.from_config(config))


def test_check_verification_pairs():
    cfg.check_verification_pairs(settings())
    config = validated()
    config["verification"]["pairs"] = ["cpu-cpu", "gpu-gpu"]
    with pytest.raises(DecodelabError, match=r"'verification.pairs': no pair named 'gpu-gpu' in "
                                             r"'speculative.pairs' \(known: cpu-cpu, cuda-cuda"):
        cfg.check_verification_pairs(Settings.from_config(config))


def test_check_engines():
    cfg.check_engines(settings())  # eager everywhere by default
    config = validated("config/gpu.yaml")
    config["speculative"]["pairs"]["cuda-cuda"]["engine"] = "graph"
    config["sweep"]["engine"] = "graph"
    graph = Settings.from_config(config)
    cfg.check_engines(graph)
    assert graph.speculative.pairs["cuda-cuda"].job_spec()["engine"] == "graph"
    assert graph.sweep.job_spec()["engine"] == "graph"
    assert "engine" not in settings().speculative.pairs["cpu-cpu"].job_spec()  # old hashes kept
    assert "engine" not in settings().sweep.job_spec()
    config["speculative"]["pairs"]["cpu-cuda"]["engine"] = "graph"
    with pytest.raises(DecodelabError, match=r"'speculative.pairs.cpu-cuda.engine': engine "
                                             r"'graph' needs CUDA devices only \(here: cpu, cuda"):
        cfg.check_engines(Settings.from_config(config))
    config = validated(sweep={**validated()["sweep"], "engine": "graph"})
    with pytest.raises(DecodelabError, match="'sweep.engine': engine 'graph' needs CUDA"):
        cfg.check_engines(Settings.from_config(config))
    with pytest.raises(Exception, match="'jit' is not one of"):
        validated(sweep={**validated()["sweep"], "engine": "jit"})


def test_check_names_differ_by_more_than_case():
    cfg.check_names_differ_by_more_than_case(settings())
    config = validated()
    config["models"]["Target"] = config["models"]["target"]
    with pytest.raises(DecodelabError, match="config 'models': 'target' and 'Target' differ only"):
        cfg.check_names_differ_by_more_than_case(Settings.from_config(config))
    config = validated()
    config["speculative"]["pairs"]["CPU-cpu"] = config["speculative"]["pairs"]["cpu-cpu"]
    with pytest.raises(DecodelabError, match="config 'speculative.pairs': 'cpu-cpu' and 'CPU-cp"):
        cfg.check_names_differ_by_more_than_case(Settings.from_config(config))


def test_check_hosts(tmp_path):
    from decodelab.core import tables
    from decodelab.core.hosts import MANIFEST

    other = tmp_path / "other" / "stats"
    other.mkdir(parents=True)
    for table in tables.required():
        (other / f"{table}.csv").write_text("x\n")
    cfg.check_hosts("here", ["other"], tmp_path)
    with pytest.raises(DecodelabError, match="host name 'Paper' is reserved"):
        cfg.check_hosts("Paper", [], tmp_path)
    with pytest.raises(DecodelabError, match="config 'hosts': 'OTHER' names the same results/ di"):
        cfg.check_hosts("other", ["OTHER"], tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / MANIFEST).write_text("{}")
    with pytest.raises(DecodelabError, match="host name 'mine': results/mine/ holds results impo"):
        cfg.check_hosts("mine", [], tmp_path)
    with pytest.raises(DecodelabError, match="config 'hosts': 'combined' is a reserved name"):
        cfg.check_hosts("here", ["combined"], tmp_path)
    with pytest.raises(DecodelabError, match="config 'hosts' lists 'absent' but results/absent/"):
        cfg.check_hosts("here", ["absent"], tmp_path)


def test_check_cluster_backends():
    cfg.check_cluster_backends(settings(cluster="slurm", backends=["cpu", "cuda"]))
    cfg.check_cluster_backends(settings())  # mps without a cluster
    with pytest.raises(DecodelabError, match="config 'backends' lists 'mps', but the slurm prof"):
        cfg.check_cluster_backends(settings(cluster="slurm"))


def cpu_only(backend):
    return backend == "cpu"


def why(backend):
    return f"no {backend} here"


def test_plan_backends():
    assert cfg.plan_backends(settings(), cpu_only, why) == (["cpu"], ["cuda", "mps"])
    assert cfg.plan_backends(settings(assume_available=["mps"]), cpu_only, why) == (
        ["cpu", "mps"], ["cuda"])
    assert cfg.plan_backends(settings(cluster="slurm"), cpu_only, why)[1] == []
    assert cfg.plan_backends(settings(strict=True, backends=["cpu"]), cpu_only, why)[0] == ["cpu"]
    with pytest.raises(DecodelabError, match=r"config 'backends' lists 'cuda', which is not "
                                             r"available on this host \(no cuda here\); remove"):
        cfg.plan_backends(settings(strict=True), cpu_only, why)
    with pytest.raises(DecodelabError, match="none of the backends in config 'backends' is avail"):
        cfg.plan_backends(settings(backends=["cuda"]), cpu_only, why)


def test_sweep_backends():
    assert cfg.sweep_backends(settings(), ["cpu", "mps"], "h") == ["cpu", "mps"]
    gpu = Settings.from_config(validated("config/gpu.yaml"))
    assert cfg.sweep_backends(gpu, ["cpu", "cuda"], "h") == ["cuda"]
    with pytest.raises(DecodelabError, match=r"none of config 'sweep.backends' \(cuda\) is "
                                             r"available on this host \(h\)"):
        cfg.sweep_backends(gpu, ["cpu"], "h")


def test_check_positions(tmp_path):
    s = settings()
    cfg.check_positions(s, s.position_needs())
    config = validated()
    config["sweep"]["budgets"] = [8, 2000]
    s = Settings.from_config(config)
    with pytest.raises(DecodelabError, match="model 'gpt2-tiny'.*config 'sweep' \\(budget 2000"):
        cfg.check_positions(s, s.position_needs())


def test_known_positions(tmp_path):
    assert cfg.known_positions("t", {"source": "train", "n_positions": 256}) == 256
    assert cfg.known_positions("h", {"source": "hf", "repo": "a/b", "revision": "0" * 40}) is None
    assert cfg.known_positions("g", {"source": "init", "preset": "gpt2"}) == 1024
    with pytest.raises(DecodelabError, match="config 'models.g.preset': unknown preset 'gpt9'; "):
        cfg.known_positions("g", {"source": "init", "preset": "gpt9"})
    with pytest.raises(DecodelabError, match="config 'models.m.path': '/nowhere' has no config."):
        cfg.known_positions("m", {"source": "local", "path": "/nowhere"})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_positions": 64}))
    assert cfg.known_positions("m", {"source": "local", "path": str(tmp_path)}) == 64


def test_stability_limits_default_to_pyperfs_and_bad_ones_are_refused_by_key():
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    del raw["stats"]["stability"]
    defaults = with_defaults(copy.deepcopy(raw), yaml.safe_load(SCHEMA.read_text()))
    assert Stability.from_spec(defaults["stats"]["stability"]) == Stability()
    for key, bad in (("cv_between", 0), ("max_over_median", 0.9), ("background", 1.5),
                     ("noisy_share", 1), ("cv", 0.1)):
        config = yaml.safe_load((ROOT / "config.yaml").read_text())
        config["stats"]["stability"][key] = bad
        problem = schema_problem(config, SCHEMA)
        assert problem and f"'stats.stability.{key}'" in problem, (key, problem)


def test_check_changepoints():
    cfg.check_changepoints(settings())
    regimes = validated()["regimes"]
    cfg.check_changepoints(settings(regimes=regimes | {
        "changepoints": regimes["changepoints"] | {"model": "constant", "min_size": 2}}))
    with pytest.raises(DecodelabError, match="'regimes.changepoints.min_size': model 'linear' ne"):
        cfg.check_changepoints(settings(regimes=regimes | {
            "changepoints": regimes["changepoints"] | {"min_size": 2}}))


def test_check_local_images(tmp_path):
    image = tmp_path / "cpu.sif"
    image.write_text("")
    ok = {"cpu": str(image), "cuda": "docker://x/y"}
    cfg.check_local_images(settings(containers=ok), ["cpu", "cuda"])
    cfg.check_local_images(settings(containers=ok | {"cuda": "/absent.sif"}), ["cpu"])
    with pytest.raises(DecodelabError, match="config 'containers.cuda': image '/absent.sif' does"):
        cfg.check_local_images(settings(containers=ok | {"cuda": "/absent.sif"}), ["cpu", "cuda"])


def rule_jsons(s: Settings) -> list[tuple[type, dict]]:
    """Each verb's typed settings with the JSON its rule passes (`as_arg`)."""
    jobs = [(cfg.SweepJob, s.sweep.job_spec()), (cfg.SpeculativeJob, s.speculative.job_spec()),
            (cfg.ParallelismJob, s.speculative.parallelism_spec("Q4_0")),
            (cfg.Verification, s.verification.job_spec()), (cfg.Confidence, s.stats.job_spec()),
            (cfg.SpikeRule, s.regimes.rule_spec()), (cfg.Regimes, s.regimes.job_spec()),
            *[(Pair, p.job_spec()) for p in s.speculative.pairs.values()]]
    if s.long is not None:
        jobs.append((cfg.LongJob, s.long.job_spec()))
    if s.batched is not None:
        jobs.append((cfg.BatchedJob, s.batched.job_spec()))
    return jobs


@pytest.mark.parametrize("profile", PROFILES)
def test_every_verb_types_its_rules_json_and_hashes_it_unchanged(profile):
    """A verb builds its typed settings from the rule's JSON and stamps its raw file with their
    `job_spec()`: the same JSON, so the same hash as the dict the verb read before."""
    jobs = rule_jsons(Settings.from_config(validated(profile)))
    assert {cls for cls, _ in jobs} >= {cfg.SpeculativeJob, cfg.ParallelismJob, Pair}
    for cls, spec in jobs:
        job = typed(cls, spec_json(spec))
        assert isinstance(job, cls) and spec_json(job.job_spec()) == spec_json(spec), cls


def test_the_long_jobs_document_tokens_is_hashed_only_when_set():
    spec = settings().long.job_spec()
    assert "document_tokens" not in spec
    job = cfg.LongJob.from_spec({**spec, "document_tokens": 4096})
    assert job.document_tokens == 4096 and job.job_spec() == {**spec, "document_tokens": 4096}


TYPED_JOBS = [cfg.SpeculativeJob, cfg.ParallelismJob, cfg.LongJob, cfg.BatchedJob,
              cfg.SpikeRule, Pair]


@pytest.mark.parametrize("cls", TYPED_JOBS, ids=lambda c: c.__name__)
def test_a_spec_missing_or_adding_a_key_is_refused_naming_it(cls):
    spec = dict(next(s for c, s in rule_jsons(settings()) if c is cls))
    required = [f.name for f in fields(cls) if f.default is MISSING]
    assert required
    for key in required:
        with pytest.raises(DecodelabError, match=rf"^--spec \({cls.__name__}\): missing key "
                                                 rf"'{key}'$"):
            typed(cls, spec_json({k: v for k, v in spec.items() if k != key}))
    with pytest.raises(DecodelabError, match=rf"\({cls.__name__}\): unknown key 'budgte'"):
        typed(cls, spec_json({**spec, "budgte": 1}))
    with pytest.raises(DecodelabError, match=r"^--spec: not JSON"):
        typed(cls, "{ks: [1]}")
    with pytest.raises(DecodelabError, match=rf"^--spec: expected a JSON object of {cls.__name__}"):
        typed(cls, "[1, 2]")


def test_regime_depths_spec_names_a_missing_key_of_its_sections():
    spec = settings().regimes.job_spec()
    with pytest.raises(DecodelabError, match=r"\(Regimes\): onsets: missing key 'baseline'"):
        typed(cfg.Regimes, spec_json({**spec, "onsets": {"factor": 2.5, "run": 8}}))
    with pytest.raises(DecodelabError, match=r"\(Regimes\): missing key 'changepoints'"):
        typed(cfg.Regimes, spec_json({k: v for k, v in spec.items() if k != "changepoints"}))


MEASURING_VERBS = {  # each verb's settings and the arguments it takes besides --repeat, --out
    "speculative": (cfg.SpeculativeJob, [
        "--target-dir", "t", "--draft-dir", "d", "--pair", "p",
        "--pair-spec", spec_json(Pair("t", "d", "cpu", "cpu").job_spec())]),
    "parallelism": (cfg.ParallelismJob, ["--model-dir", "m", "--model", "m", "--backend", "cpu"]),
    "verify-cost": (cfg.ParallelismJob, ["--gguf", "g", "--model", "m", "--device", "cpu"]),
    "llama-peer": (cfg.SpeculativeJob, ["--pair", "p", "--target-gguf", "t", "--draft-gguf", "d",
                                        "--target-dir", "t", "--device", "cpu"]),
    "long": (cfg.LongJob, ["--target-dir", "t", "--target", "t", "--backend", "cpu"]),
    "batched": (cfg.BatchedJob, ["--target-dir", "t", "--draft-dir", "d", "--backend", "cpu",
                                 "--costs", "c"]),
}


def verb_error(verb: str, spec: str, capsys, args: list[str] | None = None) -> str:
    """`decodelab <verb>`'s error on `spec`; none of the directories or files named exists."""
    from decodelab import cli

    code = cli.main([verb, *(args or MEASURING_VERBS[verb][1]), "--spec", spec, "--repeat", "0",
                     "--out", "o"])
    assert code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("verb", MEASURING_VERBS)
def test_each_measuring_verb_refuses_a_spec_without_its_seed_naming_it(verb, capsys):
    cls = MEASURING_VERBS[verb][0]
    spec = next(s for c, s in rule_jsons(settings()) if c is cls)
    err = verb_error(verb, spec_json({k: v for k, v in spec.items() if k != "seed"}), capsys)
    assert err == f"decodelab {verb}: error: --spec ({cls.__name__}): missing key 'seed'\n"


def test_the_speculative_verb_checks_its_pair_spec_by_key(capsys):
    pair = {k: v for k, v in Pair("t", "d", "cpu", "cpu").job_spec().items() if k != "draft"}
    args = [*MEASURING_VERBS["speculative"][1][:-1], spec_json(pair)]
    err = verb_error("speculative", spec_json(settings().speculative.job_spec()), capsys, args)
    assert "--pair-spec (Pair): missing key 'draft'" in err


def test_verifications_spec_names_a_missing_key_of_its_levels():
    spec = settings().verification.job_spec()
    with pytest.raises(DecodelabError, match=r"\(Verification\): real: missing key 'top'"):
        typed(cfg.Verification, spec_json({**spec, "real": {
            k: v for k, v in spec["real"].items() if k != "top"}}))
    with pytest.raises(DecodelabError, match=r"\(Verification\): missing key 'alpha'"):
        typed(cfg.Verification, spec_json({k: v for k, v in spec.items() if k != "alpha"}))


# --- issue 60: the host's name rule, model sizes, KV budgets, config files ----------------------

def test_the_configured_host_follows_the_name_rule():
    for bad in ("x\n", "a/b", "..", "x" * 1000):
        with pytest.raises(DecodelabError, match="config 'host': '.*' is not a usable name") as err:
            cfg.this_host(bad, "ignored")
        assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_kv_budget_as_large_as_every_context_is_refused():
    config = validated("config/long.yaml")
    config["long"]["kv_budgets"] = [256, 16384]
    with pytest.raises(DecodelabError, match=r"config 'long.kv_budgets': 16384 tokens is no sparse "
                                             r"view of the longest context \(16384, "):
        cfg.check_long(Settings.from_config(config))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profiles_models_fit_the_default_limits(profile):
    cfg.check_model_sizes(Settings.from_config(validated(profile)))


def test_a_model_past_the_limits_is_refused_when_the_dag_is_built_naming_the_key(tmp_path):
    config = validated()
    config["models"]["deep"] = {**config["models"]["target"], "n_layer": 100_000}
    with pytest.raises(DecodelabError, match=r"config 'models.deep': 100000 layers, more than "
                                             r"config 'limits.max_layers' \(512\); raise it"):
        cfg.check_model_sizes(Settings.from_config(config))
    del config["models"]["deep"]
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "n_layer": 48, "n_embd": 20000, "vocab_size": 50257}))
    config["models"]["wide"] = {"source": "local", "path": str(tmp_path)}
    with pytest.raises(DecodelabError, match=r"config 'models.wide': about 2.31e\+11 parameters "
                                             r"\(48 layers of width 20000, vocabulary 50257\), "
                                             r"more than config 'limits.max_params' \(4e\+09\)"):
        cfg.check_model_sizes(Settings.from_config(config))
    config["limits"] = {"max_params": 10**12, "max_layers": 512}
    cfg.check_model_sizes(Settings.from_config(config))


def test_the_size_estimate_is_within_a_tenth_of_every_presets_real_count():
    import torch
    from transformers import AutoModelForCausalLM

    from decodelab.backends.sources import preset_config
    from decodelab.core.shapes import PRESETS
    from decodelab.core.sizes import estimated_params, spec_fields

    for preset in PRESETS:
        with torch.device("meta"):  # counts without allocating
            model = AutoModelForCausalLM.from_config(preset_config(preset))
        real = sum(p.numel() for p in model.parameters())
        estimate = estimated_params(spec_fields({"source": "init", "preset": preset}), preset)
        assert abs(estimate - real) < 0.1 * real, (preset, estimate, real)


def test_load_settings_refuses_a_config_file_that_costs_before_loading_it(tmp_path):
    items = ["&a0 [x, x, x, x, x, x, x, x, x]"] + [
        f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("seed: [" + ", ".join(items) + "]\n")
    with pytest.raises(DecodelabError, match="holds more than 100000 values once its aliases"):
        cfg.load_settings(bomb)


def test_a_shared_value_counts_once_per_use_in_the_config_walk():
    from decodelab.config.check import data_problem

    value = [1]
    for _ in range(6):
        value = [value] * 10  # 10^6 uses of one list, a few hundred bytes of objects
    assert data_problem({"seed": value}).startswith("config holds more than 100000 values")
    assert data_problem(validated()) is None
