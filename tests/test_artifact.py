"""Several hosts, the reference comparison, benchmark summaries, their TeX: synthetic fixtures."""

from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest
from fixtures import (
    REAL,
    ROOT,
    SELECTED,
    build_paper,
    generate,
    host_dir,
    overfull,
    settings_dict,
    strip_comments,
    tex_sources,
    write_stats,
)

from decodelab.core import hosts
from decodelab.core.errors import DecodelabError
from decodelab.paper import artifact
from decodelab.paper.build import write_generated
from decodelab.report import benchmarks, reference, tex
from decodelab.report.settings import PARALLEL_K

# -----------------------------------------------------------------------------
# import

def test_import_copies_a_host_with_its_provenance(tmp_path):
    src = host_dir(tmp_path / "mac-results", backends=("mps",), pairs=("mps-mps",))
    dest = hosts.import_host(src, "mac", tmp_path / "results")
    assert dest == tmp_path / "results" / "mac"
    assert (dest / "stats" / "latency.csv").read_bytes() == (src / "stats/latency.csv").read_bytes()
    assert (dest / "figures" / "latency.pdf").is_file()
    manifest = (dest / hosts.MANIFEST).read_text()
    assert str(src.resolve()) in manifest and "stats/environment.csv" in manifest
    assert not list((tmp_path / "results").glob(".import-*")), "staging left behind"


def test_import_from_a_tarball(tmp_path):
    src = host_dir(tmp_path / "cuda-box", backends=("cuda",), pairs=("cuda-cuda",))
    tarball = tmp_path / "cuda-box.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(src, arcname="cuda-box")
    dest = hosts.import_host(tarball, "cuda-h200", tmp_path / "results")
    env = pd.read_csv(dest / "stats" / "environment.csv")
    assert list(env["backend"]) == ["cuda"]


def test_import_names_every_missing_file_and_leaves_nothing(tmp_path):
    src = host_dir(tmp_path / "partial")
    (src / "stats" / "regimes.csv").unlink()
    (src / "stats" / "skipped.csv").unlink()
    with pytest.raises(DecodelabError, match=r"missing stats/regimes\.csv, stats/skipped\.csv"):
        hosts.import_host(src, "mac", tmp_path / "results")
    assert not (tmp_path / "results" / "mac").exists()
    assert not list((tmp_path / "results").glob(".import-*"))


def test_import_refuses_to_overwrite_without_replace(tmp_path):
    src = host_dir(tmp_path / "src")
    hosts.import_host(src, "mac", tmp_path / "results")
    with pytest.raises(DecodelabError, match="--replace"):
        hosts.import_host(src, "mac", tmp_path / "results")
    (src / "stats" / "extra.csv").write_text("a\n1\n")
    dest = hosts.import_host(src, "mac", tmp_path / "results", replace=True)
    assert (dest / "stats" / "extra.csv").is_file()


@pytest.mark.parametrize("name", ["reference", "combined", "paper", "a/b", "", "my host"])
def test_import_refuses_reserved_or_odd_host_names(tmp_path, name):
    with pytest.raises(DecodelabError, match="not a usable name"):
        hosts.import_host(host_dir(tmp_path / "src"), name, tmp_path / "results")


def test_import_of_a_missing_source(tmp_path):
    with pytest.raises(DecodelabError, match="does not exist"):
        hosts.import_host(tmp_path / "nowhere", "mac", tmp_path / "results")


# -----------------------------------------------------------------------------
# merge

@pytest.fixture
def merged(tmp_path) -> Path:
    """vm (cpu, local) + mac (cpu and mps, imported) merged into one stats directory."""
    vm = host_dir(tmp_path / "results" / "vm")
    hosts.import_host(host_dir(tmp_path / "mac-src", backends=("cpu", "mps"),
                               pairs=("cpu-cpu", "mps-mps")), "mac", tmp_path / "results")
    out = tmp_path / "results" / "combined" / "stats"
    names = ["latency", "kv_speedup", "regimes", "environment", "skipped", "models",
             "speculative_speedup", "verification_levels", "benchmarks", "hosts"]
    hosts.merge({"vm": vm, "mac": tmp_path / "results" / "mac"}, "vm", out, names)
    return out


def test_merge_keeps_rows_per_host_and_qualifies_shared_names(merged):
    env = pd.read_csv(merged / "environment.csv")
    assert sorted(zip(env["host"], env["backend"], strict=True)) == [
        ("mac", "cpu@mac"), ("mac", "mps"), ("vm", "cpu")]
    latency = pd.read_csv(merged / "latency.csv")
    assert set(latency["backend"]) == {"cpu", "cpu@mac", "mps"}
    assert (latency[latency["backend"] == "cpu"]["host"] == "vm").all()
    speedup = pd.read_csv(merged / "speculative_speedup.csv")
    assert set(speedup["pair"]) == {"cpu-cpu", "cpu-cpu@mac", "mps-mps"}


def test_merge_takes_host_independent_rows_once(merged):
    levels = pd.read_csv(merged / "verification_levels.csv", keep_default_na=False)
    mac = levels[levels["host"] == "mac"]
    assert len(mac) and (mac["level"] == 3).all()  # levels 1-2 are the local host's only
    assert set(pd.read_csv(merged / "models.csv")["host"]) == {"vm"}


def test_merge_writes_absent_tables_empty_and_lists_hosts(merged):
    assert (merged / "benchmarks.csv").read_text().strip() == ""
    table = pd.read_csv(merged / "hosts.csv")
    assert list(table["host"]) == ["vm", "mac"] and list(table["role"]) == ["local", "imported"]
    assert table.loc[1, "backends"] == "cpu mps" and table.loc[1, "imported_at"]


def test_merge_refuses_a_host_without_its_tables(tmp_path):
    vm = host_dir(tmp_path / "vm")
    (tmp_path / "mac" / "stats").mkdir(parents=True)
    with pytest.raises(DecodelabError, match="host 'mac'.*missing .*stats/environment.csv"):
        hosts.merge({"vm": vm, "mac": tmp_path / "mac"}, "vm", tmp_path / "out", ["latency"])


def test_paper_macros_from_merged_hosts(merged, tmp_path):
    m = generate(merged, tmp_path / "gen")
    assert m["NumHosts"] == "2" and m["ifMultiHost"] == "true"
    assert m["HostsImported"] == r"\texttt{mac}"
    assert m["ifMpsRan"] == "true"  # the Mac's MPS run counts as run for the paper
    hosts_tex = (tmp_path / "gen" / "tab_hosts.tex").read_text()
    assert r"\texttt{mac} & imported & cpu, mps" in hosts_tex


# -----------------------------------------------------------------------------
# reference comparison

def test_comparison_matches_same_configurations_with_ratios(tmp_path):
    local = host_dir(tmp_path / "local", scale=2.0)
    ref = host_dir(tmp_path / "reference" / "default-cpu")
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    assert set(table["status"]) == {"matched"}
    decode = table[table["quantity"] == "decode_s"]
    assert len(decode) == 3 * 10  # three models x ten budgets on cpu
    assert decode["ratio"].round(9).eq(2.0).all()
    acceptance = table[table["quantity"] == "acceptance"]
    assert acceptance["ratio"].round(9).eq(1.0).all() and len(acceptance) == 12
    chi = table[table["quantity"] == "chi2"]
    assert list(chi["pair"]) == ["cpu-cpu"] and chi["ratio"].iloc[0] == 1.0
    assert (table["local_device"] == "cpu device_0").any()
    assert ref.is_dir()


@pytest.mark.parametrize("pair, devices", [
    ("cpu-cuda", "host cpu / an H200"), ("gpt2-xl.cpu-cuda", "host cpu / an H200"),
    ("opt-1.3b.cuda-cuda", "an H200"), ("bloom-1b7.cpu-cpu", "host cpu")])
def test_row_device_reads_both_devices_of_a_pair_named_after_a_model(pair, devices):
    by_backend = {"cpu": "host cpu", "cuda": "an H200", "gpt2": "wrong", "xl.cpu": "wrong"}
    row = pd.Series({"backend": "", "pair": pair})
    assert reference.row_device(row, by_backend) == devices


def test_comparison_refuses_unlike_configurations(tmp_path):
    local = host_dir(tmp_path / "local")
    host_dir(tmp_path / "reference" / "cuda-h200", backends=("cuda",), pairs=("cuda-cuda",))
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    assert (table["status"] != "matched").all() and table["ratio"].isna().all()
    assert set(table[table["status"] == "only local"]["backend"]) == {"cpu", ""}
    assert "cuda-cuda" in set(table[table["status"] == "only reference"]["pair"])
    summary = reference.summary(table)
    assert summary["ratio"].isna().all()


def test_comparison_matches_a_different_dtype_not(tmp_path):
    local = host_dir(tmp_path / "local")
    ref = host_dir(tmp_path / "reference" / "half")
    latency = pd.read_csv(ref / "stats" / "latency.csv").assign(dtype="float16")
    latency.to_csv(ref / "stats" / "latency.csv", index=False)
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    decode = table[table["quantity"] == "decode_s"]
    assert set(decode["status"]) == {"only local", "only reference"}


def test_comparison_matches_a_pair_of_other_models_not(tmp_path):
    local = host_dir(tmp_path / "local")
    pd.DataFrame({"model": ["target", "draft"], "source": ["train", "train"],
                  "parameters": [1_750_000, 756_000]}).to_csv(local / "stats" / "models.csv",
                                                              index=False)
    ref = host_dir(tmp_path / "reference" / "gpu-pair")
    pd.DataFrame({"model": ["target", "draft"], "source": ["train", "train"],
                  "parameters": [29_676_544, 3_808_256]}).to_csv(ref / "stats" / "models.csv",
                                                                 index=False)
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    spec = table[table["quantity"].isin(["acceptance", "spec_speedup", "chi2"])]
    assert len(spec) and set(spec["status"]) == {"only local", "only reference"}
    assert set(table[table["quantity"] == "decode_s"]["status"]) == {"matched"}


def test_comparison_counts_spikes_on_the_rules_metric_only(tmp_path):
    local = host_dir(tmp_path / "local")
    ref = host_dir(tmp_path / "reference" / "noisy")
    regimes = pd.read_csv(ref / "stats" / "regimes.csv")
    on = (regimes["experiment"] == "sweep") & (regimes["model"] == "gpt2-tiny")
    first = {m: regimes.index[on & (regimes["metric"] == m)][0] for m in ("total_s", "decode_s")}
    regimes.loc[list(first.values()), "spike"] = True
    regimes.loc[first["total_s"], "ratio_median"] = 3.5
    regimes.to_csv(ref / "stats" / "regimes.csv", index=False)
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    gpt2 = table[table["model"] == "gpt2-tiny"].set_index("quantity")
    assert gpt2.loc["spikes", "reference_value"] == 1 and gpt2.loc["spikes", "local"] == 0
    assert gpt2.loc["max_ratio", "reference_value"] == 3.5


def test_a_cuda_references_step_ups_reach_the_comparison_and_the_macros(tmp_path):
    local = host_dir(tmp_path / "local")
    ref = host_dir(tmp_path / "reference" / "cuda-h200", backends=("cuda",),
                   pairs=("cuda-cuda",))
    keys = {"backend": "cuda", "family": "gpt2", "dtype": "float32", "prompt_len": 8,
            "repeat": 0, "inner": 0, "steps": 63}
    pd.DataFrame([{**keys, "experiment": exp, "model": "gpt2-tiny", "budget": 64,
                   "onset": onset, "step_up": 5.0 if onset >= 0 else float("nan")}
                  for exp, onset in [("sweep", 31), ("sweep", -1), ("sweep", 15),
                                     ("ablation", 7)]]
                 ).to_csv(ref / "stats" / "regime_onsets.csv", index=False)
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    ups = table[table["quantity"] == "step_ups"]
    assert list(ups["reference_value"]) == [2]  # sweep runs only
    macros = artifact.cuda_reference_macros(table)
    assert macros["RefCudaStepUps"] == "2"


def test_a_cuda_references_speculative_and_verification_results_reach_the_macros(tmp_path):
    local = host_dir(tmp_path / "local")
    host_dir(tmp_path / "reference" / "default-cpu")
    ref = host_dir(tmp_path / "reference" / "cuda-h200", backends=("cuda",),
                   pairs=("cuda-cuda",))
    pd.DataFrame([{"pair": "cuda-cuda", "k": k, "ours_s": 1.0, "hf_s": ratio,
                   "ours_over_hf": ratio} for k, ratio in ((2, 1.3), (4, 1.5))]
                 ).to_csv(ref / "stats" / "speculative_hf.csv", index=False)
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    cuda = table[(table["reference"] == "cuda-h200") & (table["status"] == "only reference")]
    chi = cuda[cuda["quantity"] == "chi2_p"].set_index("sampler")["reference_value"]
    assert chi.to_dict() == {s: p for s, (_, p) in REAL["two-sample chi-square"][1].items()}
    assert list(cuda[cuda["quantity"] == "parallelism"]["backend"].unique()) == ["cuda"]
    cpu = table[table["reference"] == "default-cpu"]
    cpu_p = cpu[cpu["quantity"].isin(reference.NO_RATIO)]
    assert len(cpu_p) == 6 and (cpu_p["status"] == "matched").all()
    assert cpu_p["ratio"].isna().all()  # a ratio of p-values measures nothing
    macros = artifact.cuda_reference_macros(table)
    assert macros["RefCudaChiPAcceptAll"] == tex.pval(0.041)
    assert macros["RefCudaLogRatioPResampleFromP"] == tex.pval(2.1e-6)
    at_k = cuda[(cuda["quantity"] == "parallelism") & (cuda["k"] == PARALLEL_K)]
    assert macros["RefCudaParallel"] == tex.sig(at_k["reference_value"].iloc[0])
    assert (macros["RefCudaHfMin"], macros["RefCudaHfMax"]) == ("1.30", "1.50")
    best = cuda[cuda["quantity"] == "spec_speedup"]["reference_value"].max()
    assert macros["RefCudaSpecBest"] == tex.sig(best)
    label, estimate, (low, high), _ = SELECTED["speculative_best"]
    assert [macros[f"RefCudaSpecSel{part}"] for part in ("", "Low", "High", "On")] == [
        tex.sig(estimate), tex.sig(low), tex.sig(high), tex.tt("cuda-cuda, sampled, K = 4")]
    _, flags = artifact.reference_macros(table)
    assert flags["RefAnyCudaSpec"] and flags["RefAnyCudaVerification"]
    assert flags["RefCudaSpecSelected"]
    macros, flags = artifact.reference_macros(cpu)
    assert not flags["RefAnyCudaSpec"] and not flags["RefAnyCudaVerification"]
    assert not flags["RefCudaSpecSelected"] and macros["RefCudaSpecSel"] == artifact.NONE


def write_long(stats: Path, backend: str, speedup: float) -> Path:
    """A long-context study's speedup and acceptance tables: self-speculation with retrieval
    and the full cache at two context lengths, greedy, the second length's speedup halved."""
    rows = []
    for length, scale in ((4096, 1.0), (8192, 0.5)):
        for policy, budget, alpha in (("full", 0, 1.0), ("retrieval", 256, 0.8)):
            rows.append({"target": "long-target", "backend": backend, "drafter": "self",
                         "policy": policy, "kv_budget": budget, "length": length,
                         "mode": "greedy", "k": 4, "alpha": alpha, "ci_low": alpha - 0.05,
                         "ci_high": min(alpha + 0.05, 1.0), "speedup": speedup * scale,
                         "n": 3})
    stats.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame(rows)
    df.drop(columns=["speedup"]).assign(
        proposal_acceptance=df["alpha"], proposal_ci_low=df["ci_low"],
        proposal_ci_high=df["ci_high"], tokens_per_call=3.0).to_csv(
        stats / "long_acceptance.csv", index=False)
    df.assign(ci_low=df["speedup"] * 0.9, ci_high=df["speedup"] * 1.1, spec_s=1.0,
              autoregressive_s=df["speedup"], cost_ratio=0.5, predicted=df["speedup"]).to_csv(
        stats / "long_speedup.csv", index=False)
    return stats


def test_a_references_sub_study_is_a_reference_of_its_own(tmp_path):
    # results/reference/cuda-h200/long/stats: read as 'cuda-h200/long', on its own quantities,
    # its device from cuda-h200's environment; a sub-study with no key numbers is left out.
    local = host_dir(tmp_path / "local")
    write_long(local / "stats", "cpu", 0.8)
    host_dir(tmp_path / "reference" / "cuda-h200", backends=("cuda",), pairs=("cuda-cuda",))
    write_long(tmp_path / "reference" / "cuda-h200" / "long" / "stats", "cuda", 1.5)
    batched = tmp_path / "reference" / "cuda-h200" / "batched" / "stats"
    batched.mkdir(parents=True)
    (batched / "batched_costs.csv").write_text("backend,batch\ncuda,1\n")
    cpu_long = write_long(tmp_path / "reference" / "default-cpu" / "long" / "stats", "cpu", 0.4)
    shutil.copy(local / "stats" / "models.csv", cpu_long)  # rows match on the same models
    refs = reference.reference_dirs(tmp_path / "reference")
    assert set(refs) == {"cuda-h200", "cuda-h200/long", "cuda-h200/batched", "default-cpu/long"}
    table = reference.compare(local / "stats", refs)
    assert set(table["reference"]) == {"cuda-h200", "cuda-h200/long", "default-cpu/long"}
    long = table[table["reference"] == "cuda-h200/long"]
    assert set(long["quantity"]) == {"long_speedup", "long_speedup_low", "long_speedup_high",
                                     "long_alpha", "long_alpha_low", "long_alpha_high"}
    assert len(long) == 2 * 6 * 4  # only local (cpu) and only reference (cuda), 4 settings
    assert set(long["reference_device"]) - {""} == {"cuda device_0"}  # cuda-h200's
    cpu = table[(table["reference"] == "default-cpu/long") & (table["quantity"] ==
                                                               "long_speedup")]
    assert (cpu["status"] == "matched").all() and cpu["ratio"].round(9).eq(2.0).all()
    # the paper's long section quotes the CUDA one from the comparison, nothing typed
    table.to_csv(local / "stats" / "reference_comparison.csv", index=False)
    m = generate(local / "stats", tmp_path / "gen")
    assert m["ifLongRefReady"] == "true" and m["LongRefName"] == r"\texttt{cuda-h200/long}"
    assert m["LongRefDevice"] == "cuda device\\_0" and m["LongRefLengths"] == "4096, 8192"
    assert m["LongRefSelfSentence"] == (
        r"self-speculation with retrieval runs 1.50 to 1.50$\times$ at $L=4,096$ and 0.750 "
        r"to 0.750$\times$ at $L=8,192$, its interval above 1 in 1 of 2 settings")
    assert m["LongRefSpeedupSentence"].startswith(r"1.50 [1.35, 1.65] at $L=4,096$")
    assert "full cache is 1.00 to 1.00" in m["LongRefFullSentence"]
    # without a CUDA reference of the study, the flag is false and the macros say so
    empty = generate(host_dir(tmp_path / "bare")  / "stats", tmp_path / "gen2")
    assert empty["ifLongRefReady"] == "false" and empty["LongRefSelfSentence"] == "--"


def write_quantized(stats: Path, device: str = "cuda") -> Path:
    """A quantized study's tables: a batch-parallel CUDA backend (ratio 1.2 at every K) and a
    serial one (ratio K + 1), and one pair whose greedy run diverged once; plus a speculative
    speedup table, as the study's own spec-stats writes it, with an outsized speedup."""
    stats.mkdir(parents=True, exist_ok=True)
    verify = [{"backend": f"llama.cpp-{q}-{device}", "quantization": q, "device": device,
               "model": "target", "context": 128, "k": k, "ratio": ratio, "ci_low": ratio * 0.9,
               "ci_high": ratio * 1.1, "n": 3, "extra_per_token": (ratio - 1) / k,
               "stable": k != 4, "unstable_reason": ""}
              for q, serial in (("Q4_0", False), ("F16", True)) for k in (4, 8, 16)
              for ratio in [k + 1.0 if serial else 1.2]]
    pd.DataFrame(verify).to_csv(stats / "quantized_verify_cost.csv", index=False)
    spec = [{"pair": "q4-q8-cuda", "target_backend": "llamacpp", "target_quant": "Q4_0",
             "draft_backend": "llamacpp", "draft_quant": "Q8_0", "mode": mode, "k": k,
             "speedup": 0.5 + k / 10, "ci_low": 0.4 + k / 10, "ci_high": 0.6 + k / 10,
             "agree": (0.75 if k == 2 else 1.0) if mode == "greedy" else None, "sequences": 8,
             "diverged": (2 if k == 2 else 0) if mode == "greedy" else None,
             "first_divergence": 63 if mode == "greedy" and k == 2 else None,
             "min_margin": 0.05 if mode == "greedy" and k == 2 else None}
            for mode in ("greedy", "sampled") for k in (1, 2, 4)]
    pd.DataFrame(spec).to_csv(stats / "quantized_speculative.csv", index=False)
    pd.DataFrame([{"pair": "q4-q8-cuda", "mode": "greedy", "k": 1, "baseline": "fair",
                   "speedup": 9.0, "ci_low": 8.0, "ci_high": 10.0}]).to_csv(
        stats / "speculative_speedup.csv", index=False)
    return stats


def test_a_quantized_cuda_reference_reaches_the_quantized_section_only(tmp_path):
    # results/reference/cuda-h200/quantized/stats: the quantized section quotes it (this build
    # ran no quantized job), with the serial/batch-parallel verdict computed from its ratios;
    # the sub-study's speculative rows stay out of the CUDA reference's own claims.
    local = host_dir(tmp_path / "local")
    host_dir(tmp_path / "reference" / "cuda-h200", backends=("cuda",), pairs=("cuda-cuda",))
    write_quantized(tmp_path / "reference" / "cuda-h200" / "quantized" / "stats")
    # a CPU reference of the study, named to sort first: the CUDA paragraph does not quote it
    write_quantized(tmp_path / "reference" / "a-cpu" / "quantized" / "stats", device="cpu")
    refs = reference.reference_dirs(tmp_path / "reference")
    assert list(refs)[0] == "a-cpu/quantized"
    table = reference.compare(local / "stats", refs)
    quantized = table[table["reference"] == "cuda-h200/quantized"]
    assert {"quant_verify_cost", "quant_speedup", "quant_min_margin"} <= set(quantized["quantity"])
    theirs = quantized[quantized["status"] == "only reference"]
    assert set(theirs["reference_device"]) == {"cuda device_0"}  # cuda-h200's, by suffix
    table.to_csv(local / "stats" / "reference_comparison.csv", index=False)
    m = generate(local / "stats", tmp_path / "gen")
    assert m["ifQuantizedReady"] == "false" and m["ifQuantRefReady"] == "true"
    assert m["QuantRefName"] == r"\texttt{cuda-h200/quantized}"
    assert m["QuantRefSerialSentence"].startswith(
        r"verification is batch-parallel on \texttt{llama.cpp-Q4\_0-cuda} (0.025) and serial on "
        r"\texttt{llama.cpp-F16-cuda} (1.0)")
    assert "1.20 (unstable) at $K=4$" in m["QuantRefVerifySummary"]
    assert m["QuantRefSpeedupSentence"] == (
        r"\texttt{q4-q8-cuda} greedy 0.900 [0.800, 1.00] at $K=4$ and \texttt{q4-q8-cuda} "
        r"sampled 0.900 [0.800, 1.00] at $K=4$")
    assert m["QuantRefGreedySentence"].endswith(
        "2 diverged, the earliest at position 63, the smallest top-2 logit margin there 0.0500")
    assert m["RefCudaSpecBest"] != "9.00"  # the sub-study's pair is not the reference's best
    empty = generate(host_dir(tmp_path / "bare") / "stats", tmp_path / "gen2")
    assert empty["ifQuantRefReady"] == "false" and empty["QuantRefSerialSentence"] == "--"


def test_the_fastest_reference_shows_where_speculation_pays(tmp_path):
    # A slow reference and a fast one (two pairs, as cuda-h200/graph-engine's eager and graph):
    # the paper quotes the fast one's pairs at their best K with c, alpha and the theory's fit.
    local = host_dir(tmp_path / "local")
    host_dir(tmp_path / "reference" / "slow", backends=("cuda",), pairs=("cuda-cuda",))
    fast = tmp_path / "reference" / "slow" / "fast" / "stats"
    fast.mkdir(parents=True)
    rows = [{"pair": pair, "mode": mode, "k": k, "alpha": 0.8, "cost_ratio": c,
             "predicted": 3.0, "measured": speedup * k / 4}
            for pair, c, speedup in (("gpu-eager", 0.11, 2.5), ("gpu-graph", 0.07, 3.0))
            for mode in ("greedy", "sampled") for k in (2, 4)]
    pd.DataFrame(rows).to_csv(fast / "speculative_theory.csv", index=False)
    pd.DataFrame(rows).rename(columns={"measured": "speedup"}).assign(baseline="fair").to_csv(
        fast / "speculative_speedup.csv", index=False)
    pd.DataFrame([{"model": "draft", "source": "train", "parameters": 7_600_000},
                  {"model": "target", "source": "train", "parameters": 80_100_000}]).to_csv(
        fast / "models.csv", index=False)
    table = reference.compare(local / "stats", reference.reference_dirs(tmp_path / "reference"))
    table.to_csv(local / "stats" / "reference_comparison.csv", index=False)
    m = generate(local / "stats", tmp_path / "gen")
    assert m["ifSpecPaysReady"] == "true" and m["SpecPaysRef"] == r"\texttt{slow/fast}"
    assert m["SpecPaysGreedy"] == r"3.00$\times$ (\texttt{gpu-graph})"
    assert m["SpecPaysModels"] == r"\texttt{draft} 7.60M and \texttt{target} 80.1M parameters"
    pays = (tmp_path / "gen" / "tab_spec_pays.tex").read_text()
    assert r"\texttt{gpu-eager} & greedy & 2.50$\times$ & 0.110 & 0.800 & 0.833" in pays
    assert "cuda-cuda" not in pays  # the slow reference's pair
    empty = generate(host_dir(tmp_path / "bare") / "stats", tmp_path / "gen2")
    assert empty["ifSpecPaysReady"] == "false" and empty["SpecPaysGreedy"] == "--"


def test_comparison_without_references_is_empty(tmp_path):
    local = host_dir(tmp_path / "local")
    assert reference.reference_dirs(tmp_path / "absent") == {}
    table = reference.compare(local / "stats", {})
    assert not len(table) and list(table.columns) == reference.COLUMNS


def test_reference_tex_says_what_matched_and_what_did_not(tmp_path):
    local = host_dir(tmp_path / "local", scale=2.0)
    host_dir(tmp_path / "reference" / "default-cpu")
    host_dir(tmp_path / "reference" / "cuda-h200", backends=("cuda",), pairs=("cuda-cuda",))
    refs = reference.reference_dirs(tmp_path / "reference")
    reference.compare(local / "stats", refs).to_csv(local / "stats/reference_comparison.csv",
                                                     index=False)
    m = generate(local / "stats", tmp_path / "gen")
    assert m["NumReferences"] == "2" and m["ifRefAnyNotComparable"] == "true"
    assert m["RefNotComparable"] == r"\texttt{cuda-h200}"
    tex = (tmp_path / "gen" / "tab_reference.tex").read_text().replace(r"\allowbreak{}", "")
    assert re.search(r"decode \(ms\) & cuda/gpt2-tiny & 10 & -- & [\d.]+ \[[\d.]+, [\d.]+\] & "
                     r"\\emph\{not comparable\}", tex)
    assert re.search(r"decode \(ms\) & cpu/gpt2-tiny & 10 & [\d.]+ & [\d.]+ & 2\.00", tex)


# -----------------------------------------------------------------------------
# benchmarks

TSV = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def write_tsv(path: Path, seconds: float, rss: float | str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TSV + f"{seconds}\t0:00:01\t{rss}\t1\t1\t1\t0\t0\t50\t1\n")
    return str(path)


@pytest.mark.parametrize("path, rule", [
    ("benchmarks/vm/cpu/sweep/gpt2-tiny/rep0.tsv", "sweep"),
    ("benchmarks/vm/mps/ablation/opt-tiny/rep2.tsv", "sweep"),
    ("benchmarks/vm/cuda/parallelism/target/rep0.tsv", "parallelism"),
    ("benchmarks/vm/speculative/cpu-cpu/rep1.tsv", "speculative"),
    ("benchmarks/vm/verification/exact.tsv", "verify_exact"),
    ("benchmarks/vm/verification/monte_carlo.tsv", "verify_monte_carlo"),
    ("benchmarks/vm/verification/real_cpu-mps.tsv", "verify_real"),
    ("benchmarks/prepare_model/target.tsv", "prepare_model"),
])
def test_rule_of_a_benchmark_path(path, rule):
    assert benchmarks.rule_of(path) == rule


FILL = {"experiment": "sweep"}  # the one wildcard whose value names the rule


def declared_benchmarks() -> list[tuple[str, str]]:
    """(rule, benchmark path with its wildcards filled) for every `benchmark:` of the workflow."""
    pattern = re.compile(r'^rule (\w+):\n(?:(?!^rule ).*\n)*?    benchmark:\n\s+"([^"]+)"', re.M)
    found = []
    for smk in sorted((ROOT / "workflow" / "rules").glob("*.smk")):
        for rule, path in pattern.findall(smk.read_text()):
            filled = re.sub(r"\{(\w+)\}", lambda m: FILL.get(m[1], "x" + m[1]), path)
            found.append((rule, filled))
    return found


def test_every_declared_benchmark_has_its_rule():
    declared = declared_benchmarks()
    assert len(declared) >= 9, declared  # the reader still finds the workflow's benchmarks
    assert [(rule, benchmarks.rule_of(path)) for rule, path in declared] == [
        (rule, rule) for rule, _ in declared]


def test_rule_of_an_unknown_path():
    with pytest.raises(DecodelabError, match="no known rule"):
        benchmarks.rule_of("benchmarks/vm/other/x.tsv")


def test_summary_per_rule_counts_missing_jobs(tmp_path):
    b = tmp_path / "benchmarks"
    files = [write_tsv(b / f"vm/cpu/sweep/m/rep{r}.tsv", 10.0 * (r + 1), 400 + r)
             for r in range(3)]
    files.append(write_tsv(b / "vm/verification/exact.tsv", 6.0, "-"))
    files.append(str(b / "prepare_model/target.tsv"))  # never ran here
    table = benchmarks.summarise(files).set_index("rule")
    assert table.loc["sweep", "jobs"] == 3 and table.loc["sweep", "total_s"] == 60.0
    assert table.loc["sweep", "median_s"] == 20.0 and table.loc["sweep", "max_rss_mb"] == 402
    assert pd.isna(table.loc["verify_exact", "max_rss_mb"])
    assert table.loc["prepare_model", "jobs"] == 0 and table.loc["prepare_model", "expected"] == 1
    text = benchmarks.markdown(table.reset_index(), "vm")
    assert "| `sweep` | 3 of 3 | 1.0 | 20.0 | 30.0 | 402 |" in text


def test_summary_rejects_a_file_that_is_not_a_benchmark(tmp_path):
    bad = tmp_path / "benchmarks/vm/cpu/sweep/m/rep0.tsv"
    bad.parent.mkdir(parents=True)
    bad.write_text("hello\tworld\n1\t2\n")
    with pytest.raises(DecodelabError, match="lacks the columns"):
        benchmarks.summarise([str(bad)])


def test_benchmark_appendix_macros(tmp_path):
    stats = write_stats(tmp_path / "stats")
    b = tmp_path / "benchmarks"
    files = [write_tsv(b / f"vm/cpu/sweep/m/rep{r}.tsv", 60.0, 500) for r in range(2)]
    files.append(write_tsv(b / "vm/speculative/cpu-cpu/rep0.tsv", 240.0, 700))
    benchmarks.summarise(files).to_csv(stats / "benchmarks.csv", index=False)
    m = generate(stats, tmp_path / "gen")
    assert m["ifBenchmarksReady"] == "true" and m["BenchTotalMin"] == "6.00"
    assert m["BenchSlowestRule"] == r"\texttt{speculative}" and m["BenchMaxRssMb"] == "700"
    assert r"\texttt{sweep} & 2 of 2 & 120" in (tmp_path / "gen/tab_benchmarks.tex").read_text()


def test_artifact_tables_when_nothing_is_there(tmp_path):
    """A single host's stats without hosts.csv, comparison or benchmarks: empty, not an error."""
    m = generate(write_stats(tmp_path / "stats"), tmp_path / "gen")
    assert m["ifAnyReference"] == "false" and m["ifBenchmarksReady"] == "false"
    assert m["NumHosts"] == "0" and m["BenchTotalMin"] == "--"
    assert "no reference run" in (tmp_path / "gen/tab_reference.tex").read_text()


# -----------------------------------------------------------------------------
# every artifact macro is used by the paper

def test_every_artifact_macro_is_used_in_the_paper(tmp_path):
    section = artifact.parts(write_stats(tmp_path / "stats"), settings_dict())
    macros, flags, files = section.macros, section.flags, section.files
    text = "\n".join(strip_comments(p.read_text()) for p in tex_sources())
    unused = [m for m in macros if not re.search(rf"\\{m}(?![A-Za-z])", text)]
    unused += [f"if{f}" for f in flags if not re.search(rf"\\if{f}(?![A-Za-z])", text)]
    assert not unused, unused
    for name in files:
        assert f"generated/{name}" in text, name
    written = {p.name for p in write_generated(tmp_path / "stats", settings_dict(),
                                               tmp_path / "gen")}
    assert set(files) <= written


@pytest.mark.skipif(shutil.which("latexmk") is None, reason="latexmk not on PATH")
def test_paper_compiles_with_two_hosts_references_and_benchmarks(merged, tmp_path):
    local = tmp_path / "results" / "vm"
    host_dir(tmp_path / "reference" / "default-cpu")
    host_dir(tmp_path / "reference" / "cuda-h200", backends=("cuda",), pairs=("cuda-cuda",))
    for name in ("cuda-h200", "default-cpu"):
        write_quantized(tmp_path / "reference" / name / "quantized" / "stats")
    refs = reference.reference_dirs(tmp_path / "reference")
    reference.compare(local / "stats", refs).to_csv(merged / "reference_comparison.csv",
                                                    index=False)
    files = [write_tsv(tmp_path / f"benchmarks/vm/cpu/sweep/m/rep{r}.tsv", 30.0, 450)
             for r in range(3)]
    benchmarks.summarise(files).assign(host="vm").to_csv(merged / "benchmarks.csv",
                                                         index=False)
    pdf, log = build_paper(merged, tmp_path)
    assert pdf.read_bytes()[:5] == b"%PDF-"
    assert not overfull(log), overfull(log)
    text = (tmp_path / "build" / "generated" / "tab_reference.tex").read_text()
    assert "not comparable" in text and r"\texttt{default-\allowbreak{}cpu}" in text


# -----------------------------------------------------------------------------
# figures: every file a figure rule draws is in the paper, with the rule and its rerun command

def figure_rules() -> dict[str, str]:
    """figure stem -> the rule whose output it is, read from workflow/rules/figures.smk."""
    text = (Path(__file__).resolve().parents[1] / "workflow/rules/figures.smk").read_text()
    stems = {}
    for block in re.split(r"^rule ", text, flags=re.M)[1:]:
        rule = block.split(":", 1)[0].strip()
        output = block.split("output:", 1)[1].split("params:", 1)[0]
        for stem in re.findall(r"figures/(\w+)\.pdf", output):
            stems[stem] = rule
    return stems


def test_every_figure_file_is_in_the_paper_with_its_rule():
    rules = figure_rules()
    assert len(rules) >= 8, rules
    text = "\n".join(strip_comments(p.read_text()) for p in tex_sources())
    floats = re.findall(r"\\begin\{figure\}(.*?)\\end\{figure\}", text, flags=re.S)
    shown = {}
    for body in floats:
        graphics = re.findall(r"\\includegraphics(?:\[[^\]]*\])?\{figures/(\w+)\.pdf\}", body)
        assert graphics, body[:80]
        made = re.findall(r"\\madeby\{([^}]*)\}", body)
        assert len(made) == 1, f"a figure without its \\madeby: {graphics}"
        for stem in graphics:
            shown[stem] = made[0].replace("\\_", "_")
    assert shown == rules, {k: (shown.get(k), rules.get(k)) for k in set(shown) | set(rules)
                            if shown.get(k) != rules.get(k)}
    madeby = re.search(r"\\newcommand\{\\madeby\}\[1\]\{(.*?)\}\}", text, flags=re.S).group(1)
    assert "rule \\cmd{#1}" in madeby and "snakemake -{}-forcerun #1" in madeby


def test_a_reference_row_does_not_make_a_backend_shared(tmp_path):
    """vm's comparison lists a reference's mps rows; the Mac's mps still keeps its name."""
    vm = host_dir(tmp_path / "results" / "vm")
    pd.DataFrame([{"reference": "r", "quantity": "decode_s", "backend": "mps"}]).to_csv(
        vm / "stats" / "reference_comparison.csv", index=False)
    mac = host_dir(tmp_path / "results" / "mac", backends=("mps",), pairs=("mps-mps",))
    out = tmp_path / "combined"
    hosts.merge({"vm": vm, "mac": mac}, "vm", out, ["environment", "reference_comparison"])
    assert set(pd.read_csv(out / "environment.csv")["backend"]) == {"cpu", "mps"}
