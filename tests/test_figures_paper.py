"""Figures, generated TeX and the paper sources: fixtures are synthetic tables, not paper data."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from fixtures import (
    PAPER,
    ROOT,
    build_paper,
    chi_passes,
    defined_macros,
    empty_tables,
    generate,
    overfull,
    settings_dict,
    strip_comments,
    tex_sources,
    verification_row,
    write_selection,
    write_spec_stats,
    write_stability,
    write_stats,
    write_verification_stats,
)

from decodelab import studies
from decodelab.core import tables
from decodelab.paper.build import all_sections, merged, write_generated
from decodelab.report import figures, seed, tex
from decodelab.report import settings as paper_settings
from decodelab.report.section import Section
from decodelab.studies.speculative import figures as speculative_figures
from decodelab.studies.sweep import figures as sweep_figures
from decodelab.studies.verification import figures as verification_figures
from decodelab.studies.verification.paper import read_verification, standard_flags


@pytest.fixture
def stats(tmp_path) -> Path:
    return write_stats(tmp_path / "stats")


@pytest.fixture
def cpu_only(tmp_path) -> Path:
    """One backend, nothing flagged: the shape of a CPU-only CI host."""
    return write_stats(tmp_path / "stats_cpu", backends=("cpu",), spikes=False)


@pytest.fixture
def spec_stats(tmp_path) -> Path:
    """CPU and MPS with the speculative stage: three pairs ran, the two CUDA pairs skipped."""
    return write_spec_stats(write_stats(tmp_path / "stats_spec"))


@pytest.fixture
def spec_one_pair(tmp_path) -> Path:
    """A CPU-only host: only the CPU/CPU pair ran, and the HF table is header-only."""
    stats_dir = write_stats(tmp_path / "stats_spec_cpu", backends=("cpu",), spikes=False)
    return write_spec_stats(stats_dir, pairs=("cpu-cpu",), backends=("cpu",), hf=False)


@dataclass(frozen=True)
class Generated:
    """Stats tables and the TeX generated from them, once for the tests that only read both."""
    stats: Path
    gen: Path
    written: list[Path]
    macros: dict[str, str]


def generated(root: Path, stats: Path) -> Generated:
    written = write_generated(stats, settings_dict(), root / "gen")
    return Generated(stats, root / "gen", written,
                     defined_macros((root / "gen" / "macros.tex").read_text()))


@pytest.fixture(scope="module")
def stats_gen(tmp_path_factory) -> Generated:
    """`stats`, generated."""
    root = tmp_path_factory.mktemp("stats-gen")
    return generated(root, write_stats(root / "stats"))


@pytest.fixture(scope="module")
def spec_gen(tmp_path_factory) -> Generated:
    """`spec_stats`, generated."""
    root = tmp_path_factory.mktemp("spec-gen")
    return generated(root, write_spec_stats(write_stats(root / "stats_spec")))


# -----------------------------------------------------------------------------
# figures

def assert_written(paths: list[Path]) -> None:
    assert sorted(p.suffix for p in paths) == [".pdf", ".png"]
    for p in paths:
        assert p.exists() and p.stat().st_size > 1000, p
    png = next(p for p in paths if p.suffix == ".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_figure_two_backends_with_spikes(stats, tmp_path):
    latency, regimes = (pd.read_csv(stats / f"{n}.csv") for n in ("latency", "regimes"))
    assert figures.spike_budgets(regimes).shape[0] == 1
    assert_written(sweep_figures.latency_figure(latency, regimes, tmp_path / "fig" / "latency"))


def test_kv_figure(stats, tmp_path):
    kv = pd.read_csv(stats / "kv_speedup.csv")
    assert_written(sweep_figures.kv_figure(kv, tmp_path / "fig" / "kv_speedup"))


def test_figures_one_backend_zero_spikes(cpu_only, tmp_path):
    paths = sweep_figures.draw_all(cpu_only, tmp_path / "fig")
    assert_written(paths[:2])
    assert_written(paths[2:])


def test_figures_survive_empty_tables(stats, tmp_path):
    empty = {n: pd.read_csv(stats / f"{n}.csv").iloc[0:0] for n in ("latency", "regimes",
                                                                     "kv_speedup")}
    assert_written(sweep_figures.latency_figure(empty["latency"], empty["regimes"], tmp_path / "l"))
    assert_written(sweep_figures.kv_figure(empty["kv_speedup"], tmp_path / "k"))


SPEC_FIGURES = ["acceptance", "speedup", "parallelism", "theory"]


def assert_spec_figures(paths: list[Path]) -> None:
    assert [p.stem for p in paths[::2]] == SPEC_FIGURES
    for i in range(0, len(paths), 2):
        assert_written(paths[i:i + 2])


def test_speculative_figures(spec_stats, tmp_path):
    assert_spec_figures(speculative_figures.speculative_figures(spec_stats, tmp_path / "fig"))


def test_speculative_figures_one_pair_empty_hf(spec_one_pair, tmp_path):
    assert tables.read(spec_one_pair, "speculative_hf").empty
    assert_spec_figures(speculative_figures.speculative_figures(spec_one_pair, tmp_path / "fig"))


def test_speculative_figures_without_tables(stats, tmp_path):
    """No speculative table at all (or empty files): empty panels, not a traceback."""
    (stats / "speculative_hf.csv").write_text("")
    assert_spec_figures(speculative_figures.speculative_figures(stats, tmp_path / "fig"))


def test_hf_speedup_uses_the_greedy_baseline(spec_stats):
    t = tables.read_group(spec_stats, "speculative")
    hf = speculative_figures.hf_speedup(t["speedup"], t["hf"])
    assert set(hf["pair"]) == {"cpu-cpu", "mps-mps"}  # same-device pairs only
    row = hf[(hf["pair"] == "cpu-cpu") & (hf["k"] == 1)].iloc[0]
    assert row["speedup"] == pytest.approx(1.0 / row["hf_s"])


VERIFICATION_FIGURES = ["verification_tokens", "verification_pvalues"]


@pytest.fixture
def ver_stats(tmp_path) -> Path:
    """The speculative stage and the verification stage on two pairs."""
    stats_dir = write_spec_stats(write_stats(tmp_path / "stats_ver"))
    return write_verification_stats(stats_dir, pairs=("cpu-cpu", "cpu-mps"))


@pytest.fixture(scope="module")
def ver_gen(tmp_path_factory) -> Generated:
    """`ver_stats`, generated."""
    root = tmp_path_factory.mktemp("ver-gen")
    stats_dir = write_spec_stats(write_stats(root / "stats_ver"))
    return generated(root, write_verification_stats(stats_dir, pairs=("cpu-cpu", "cpu-mps")))


def assert_verification_figures(paths: list[Path]) -> None:
    assert [p.stem for p in paths[::2]] == VERIFICATION_FIGURES
    for i in range(0, len(paths), 2):
        assert_written(paths[i:i + 2])


def test_verification_figures(ver_stats, tmp_path):
    drawn = verification_figures.verification_figures(ver_stats, tmp_path / "fig")
    assert_verification_figures(drawn)
    panels = verification_figures.pvalue_panels(tables.read(ver_stats, "verification_pvalues"))
    assert len(panels) == 6 and panels[0] == (2, "Monte Carlo, one step", "")
    assert [p[2] for p in panels[2:]] == ["cpu-cpu", "cpu-cpu", "cpu-mps", "cpu-mps"]


def test_verification_figures_without_tables(stats, tmp_path):
    """No verification table, or empty / header-only ones: empty panels, not a traceback."""
    drawn = verification_figures.verification_figures(stats, tmp_path / "none")
    assert_verification_figures(drawn)
    (stats / "verification_tokens.csv").write_text("")
    pd.DataFrame(columns=["level", "check", "pair", "sampler", "seed", "p_value"]).to_csv(
        stats / "verification_pvalues.csv", index=False)
    drawn = verification_figures.verification_figures(stats, tmp_path / "empty")
    assert_verification_figures(drawn)


def test_backend_colors_are_stable():
    assert figures.backend_color("mps") == figures.BACKEND_COLORS["mps"]
    assert len(set(figures.BACKEND_COLORS.values())) == len(figures.BACKEND_COLORS)


# -----------------------------------------------------------------------------
# generated TeX

def test_tex_escape():
    assert tex.tex_escape("gpt2_tiny & 100% #1 {x} $y ~z ^w \\") == (
        r"gpt2\_tiny \& 100\% \#1 \{x\} \$y \textasciitilde{}z \textasciicircum{}w "
        r"\textbackslash{}")
    assert tex.tex_escape("a-b_c", breakable=True) == r"a-\allowbreak{}b\_\allowbreak{}c"


@pytest.mark.parametrize("value, text", [
    (0.000123456, "0.000123"), (0.5699, "0.570"), (5.7351, "5.74"), (9.996, "10.0"),
    (123.44, "123"), (1234.5, "1,230"), (0, "0"), (float("nan"), "--"), (None, "--"),
])
def test_sig(value, text):
    assert tex.sig(value) == text


def test_macro_names_are_letters_only():
    with pytest.raises(ValueError):
        tex.newcommand("Kv2Max", "1")
    with pytest.raises(ValueError):
        tex.newif("Spec_Ready", False)


@pytest.mark.parametrize("fraction, fmt, text", [
    (0.697, tex.sig, r"69.7\%"), (0.12345, tex.sig, r"12.3\%"), (1, tex.sig, r"100\%"),
    (0.995, tex.plain, r"99.5\%"), (0.12345, tex.plain, r"12.345\%"), (0.95, tex.plain, r"95\%"),
    (float("nan"), tex.sig, "--"), (None, tex.plain, "--"), ("n/a", tex.sig, "--"),
])
def test_percent(fraction, fmt, text):
    assert tex.percent(fraction, fmt) == text


def test_camel_makes_macro_name_fragments():
    assert [tex.camel(n) for n in ("cuda", "resample_from_p", "accept_all", "cpu2x")] == [
        "Cuda", "ResampleFromP", "AcceptAll", "CpuX"]


def test_two_sections_may_not_define_the_same_name():
    one, other = Section({"KvNumConfigs": "1"}, {}), Section({"KvNumConfigs": "2"}, {})
    with pytest.raises(ValueError, match="KvNumConfigs"):
        merged([one, other])
    with pytest.raises(ValueError, match="tab_kv.tex"):
        merged([Section({}, {}, {"tab_kv.tex": "a"}), Section({}, {}, {"tab_kv.tex": "b"})])
    both = merged([one, Section({"NumSpikes": "0"}, {"AnySpikes": False})])
    assert both.macros == {"KvNumConfigs": "1", "NumSpikes": "0"}


def test_each_section_defines_the_same_names_whether_its_stage_ran_or_not(stats, tmp_path):
    ran = write_verification_stats(write_spec_stats(write_stats(tmp_path / "ran")))
    for section in all_sections():
        without, with_ = (section.parts(d, settings_dict()) for d in (stats, ran))
        assert set(without.macros) == set(with_.macros), section.__name__
        assert set(without.flags) == set(with_.flags), section.__name__
        assert set(without.files) == set(with_.files), section.__name__
    ready = {name: flag for s in all_sections() for name, flag in s.parts(ran, {}).flags.items()
             if name.endswith("Ready")}
    assert ready == {"SpeculativeReady": True, "VerificationReady": True,
                     "RegimeDepthReady": False, "BenchmarksReady": False,
                     "QuantizedReady": False, "QuantRefReady": False, "LongReady": False,
                     "LongRefReady": False, "BatchedReady": False, "SpecPaysReady": False}


def test_write_generated_all_files(stats_gen):
    written = stats_gen.written
    names = {p.name for p in written}
    assert names == {"macros.tex", "studies.tex", "tab_environment.tex", "tab_kv.tex",
                     "tab_regimes.tex", "tab_skipped.tex", "tab_settings.tex", "tab_spec_pairs.tex",
                     "tab_spec_hf.tex", "tab_models.tex", "tab_verification.tex",
                     "tab_power.tex", "tab_hosts.tex", "tab_reference.tex",
                     "tab_benchmarks.tex", "tab_regime_depth.tex", "tab_quantized.tex",
                     "tab_quantized_peer.tex", "tab_long.tex", "tab_batched.tex",
                     "tab_spec_pays.tex", "tab_spec_floor.tex"}
    for p in written:
        text = p.read_text()
        assert "nan" not in text.lower().replace("nonstopmode", ""), p.name
        if p.name.startswith("tab_"):
            assert r"\toprule" in text and r"\bottomrule" in text


def test_macros_with_spikes(stats_gen):
    m = stats_gen.macros
    assert m["MaxSpikeRatio"] == "5.85" and m["MaxSpikeBudget"] == "96"
    assert m["MaxSpikeBackend"] == "MPS" and m["MaxSpikeModel"] == r"\texttt{gpt2-tiny}"
    assert m["MaxSpikeDecodeRatio"] == "6.00" and m["MaxSpikePrefillRatio"] == "1.00"
    assert m["NumSpikes"] == "1" and m["NumSpikesMps"] == "1" and m["NumSpikesCpu"] == "0"
    assert m["ifAnySpikes"] == "true" and m["ifMpsRan"] == "true"
    assert m["ifCudaRan"] == "false" and "no\\_gpu \\& 100\\% CPU" in m["CudaSkipReason"]
    assert m["HostName"] == r"ci\_runner-01"
    assert m["BackendsRun"] == "CPU and MPS" and m["NumBackendsRun"] == "2"
    assert m["ifSpeculativeReady"] == "false"
    assert float(m["KvSpeedupMin"]) < 1 < float(m["KvSpeedupMax"])
    assert m["KvMinBudget"] == "96"
    assert m["Confidence"] == r"95\%" and m["RegimeThreshold"] == "1.5"
    assert m["GitCommit"] == r"\texttt{0123456789ab-dirty}"


def test_macros_one_backend_no_spikes(cpu_only, tmp_path):
    m = generate(cpu_only, tmp_path / "gen")
    assert m["MaxSpikeRatio"] == "--" and m["ifAnySpikes"] == "false"
    assert m["NumSpikes"] == "0" and m["NumSpikesMps"] == "--"
    assert m["ifMpsRan"] == "false" and m["ifCudaRan"] == "false" and m["ifCpuRan"] == "true"
    assert m["BackendsRun"] == "CPU" and m["NumBackendsRun"] == "1"
    skipped = (tmp_path / "gen" / "tab_skipped.tex").read_text()
    assert skipped.count("skipped") == 2 and "CPU & yes & ran" in skipped


def test_speculative_flag_false_without_tables(stats_gen):
    m = stats_gen.macros
    assert m["ifSpeculativeReady"] == "false" and m["SpecBestSpeedupSampled"] == "--"
    assert m["SeedSpeedup"] == "1.61"  # the seed's claim is defined either way
    for name in ("tab_spec_pairs.tex", "tab_spec_hf.tex", "tab_models.tex", "tab_spec_floor.tex"):
        assert r"\emph{" in (stats_gen.gen / name).read_text(), name
    assert m["ifSpecFloorRan"] == "false"


def test_speculative_macros(spec_gen):
    m = spec_gen.macros
    assert m["ifSpeculativeReady"] == "true"
    assert m["ifVerificationReady"] == "false"
    assert m["SpecNumPairsRequested"] == "5" and m["SpecNumPairsRun"] == "3"
    assert m["SpecNumPairsSkipped"] == "2" and m["ifSpecAnySkipped"] == "true"
    assert m["SpecPairsSkipped"] == (r"\texttt{cuda-cuda} (needs CUDA) and "
                                     r"\texttt{cpu-cuda} (needs CUDA)")
    assert m["SpecBestPair"] == r"\texttt{cpu-mps}"
    assert (m["SpecBestDraftDevice"], m["SpecBestTargetDevice"]) == ("CPU", "MPS")
    assert m["SpecBestKSampled"] == "4" and m["SpecBestSpeedupSampled"] == "1.45"
    assert m["SpecBestCISampled"] == "[1.35, 1.54]"
    assert m["SpecBestSpeedupGreedy"] == "1.52" and m["SpecBestKGreedy"] == "4"
    assert m["SpecFirstKSampled"] == "1" and m["SpecAlphaFirstKSampled"] == r"72.0\%"
    assert m["SpecAlphaBestKSampled"] == r"57.0\%" and m["SpecAlphaBestKGreedy"] == r"67.0\%"
    # per proposal, (tokens per call - 1) / K: equal to alpha at K = 1, below it beyond
    assert m["SpecPropAccFirstKSampled"] == r"72.0\%"
    assert m["SpecPropAccBestKSampled"] == r"29.6\%"
    assert m["SpecNumSlowerSampled"] == "2"
    assert m["SpecSlowerPairsSampled"] == r"\texttt{cpu-cpu} and \texttt{mps-mps}"
    summary = m["SpecParallelSummary"]
    assert "MPS 8.20" in summary and "$K=8$ (serial: 9)" in summary and "CUDA" not in summary
    assert m["SpecParallelSummary"].startswith(r"CPU 1.64\x{} [1.56, 1.72] at $K=8$")
    assert m["SpecHfNumPairs"] == "2" and m["ifSpecHfRan"] == "true"
    assert m["SpecHfOverMin"] == "1.35" and m["SpecHfMinK"] == "1"
    assert m["SpecHfOverMax"] == "1.70" and m["SpecHfMaxK"] == "8"
    assert m["SpecAgreeOurs"] == r"100\%" and m["SpecAgreeHf"] == r"100\%"
    assert m["SpecBestAlpha"] == "0.570" and m["SpecBestPredicted"] == "1.21"
    assert m["SpecTheoryPoints"] == "36"
    assert m["SpecDraftHeldoutLoss"] == "3.24"
    assert m["SpecBeta"] == "0.710" and m["SpecDraftGreedyAgreement"] == r"62.0\%"
    assert m["SpecCorpusHash"] == r"\texttt{9f2c4e1ab37d}"
    assert m["ifSpecTrainedPair"] == "true" and m["ifSpecDraftDistilled"] == "true"
    assert m["SpecKs"] == "1, 2, 3, 4, 6, 8" and m["SpecTopK"] == "off"


def test_the_host_gap_sentence_gives_way_where_the_best_pair_is_pipelined(spec_gen, tmp_path):
    """The pipelined loop has no host turn between iterations (its host gap is NaN): the paper
    says so instead of printing the gap as missing."""
    assert spec_gen.macros["ifSpecBestPipelined"] == "false"
    settings = settings_dict()
    settings["speculative"]["pairs"]["cpu-mps"]["engine"] = "pipelined"  # the best pair
    write_generated(spec_gen.stats, settings, tmp_path / "gen")
    assert defined_macros((tmp_path / "gen" / "macros.tex").read_text())[
        "ifSpecBestPipelined"] == "true"


def test_speculative_tables(spec_gen):
    pairs = (spec_gen.gen / "tab_spec_pairs.tex").read_text()
    assert r"\texttt{cpu-mps} & CPU & MPS & sampled & 4 & 1.45 & [1.35, 1.54]" in pairs
    assert pairs.count("skipped") == 2 and pairs.count("& ran") == 3
    floor = (spec_gen.gen / "tab_spec_floor.tex").read_text()
    assert (r"\texttt{cpu-mps} & target & \texttt{target} & mps, eager & 400 & 10.0 & 120 & "
            r"40.0 & 3.00$\times$") in floor
    assert spec_gen.macros["ifSpecFloorRan"] == "true"
    hf = (spec_gen.gen / "tab_spec_hf.tex").read_text()
    assert hf.count(r"\texttt{") == 2 and "cpu-mps" not in hf
    models = (spec_gen.gen / "tab_models.tex").read_text()
    assert r"\texttt{draft} & \texttt{target} & 1 $\times$ 128 & 1.26M & 3.02 & 3.24" in models
    assert "gpt2-tiny" not in models  # init models are not trained here
    settings = (spec_gen.gen / "tab_settings.tex").read_text()
    assert (r"Speculative pair \texttt{cpu-mps} & draft \texttt{draft} on CPU, target "
            r"\texttt{target} on MPS, \texttt{float32}") in settings


def test_speculative_one_pair_without_hf(spec_one_pair, tmp_path):
    m = generate(spec_one_pair, tmp_path / "gen")
    assert m["SpecNumPairsRun"] == "1" and m["SpecBestPair"] == r"\texttt{cpu-cpu}"
    assert m["SpecNumSlowerSampled"] == "1" and m["SpecNumPairsSkipped"] == "4"
    assert "needs MPS" in m["SpecPairsSkipped"] and "needs CUDA" in m["SpecPairsSkipped"]
    assert m["ifSpecHfRan"] == "false" and m["SpecHfOverMin"] == "--"
    assert m["SpecAgreeOurs"] == "--" and "MPS" not in m["SpecParallelSummary"]
    assert "no Hugging Face" in (tmp_path / "gen" / "tab_spec_hf.tex").read_text()


def test_speculative_stage_ran_but_no_pair_could(spec_stats, tmp_path):
    """Header-only speculative tables: the flag is true, every pair is skipped, nothing crashes."""
    for name in tables.names("speculative"):
        path = spec_stats / f"{name}.csv"
        pd.read_csv(path).iloc[0:0].to_csv(path, index=False)
    m = generate(spec_stats, tmp_path / "gen")
    assert m["ifSpeculativeReady"] == "true" and m["SpecNumPairsRun"] == "0"
    assert m["SpecNumPairsSkipped"] == "5" and m["SpecBestPair"] == "--"
    # CPU and MPS ran the sweep, so their pairs are missing, not skipped for want of a device
    assert m["SpecPairsSkipped"].count("needs CUDA") == 2
    assert m["SpecPairsSkipped"].count("no result reached the statistics") == 3
    assert_spec_figures(speculative_figures.speculative_figures(spec_stats, tmp_path / "fig"))


def test_models_csv_with_flat_columns(spec_stats, tmp_path):
    """models.csv may already be flat (train_loss, corpus_sha256, wall_s); missing -> '--'."""
    pd.DataFrame([
        {"model": "target", "source": "train", "parameters": 4e6, "train_loss": 2.5,
         "heldout_loss": 2.9, "corpus_sha256": "abcdef0123456789", "wall_s": 12.0},
        {"model": "draft", "source": "train", "parameters": 1e6, "train_loss": 3.1,
         "heldout_loss": 3.3, "teacher": "target", "corpus_sha256": "abcdef0123456789"},
    ]).to_csv(spec_stats / "models.csv", index=False)
    m = generate(spec_stats, tmp_path / "gen")
    assert m["SpecBeta"] == "--"
    assert m["SpecCorpusHash"] == r"\texttt{abcdef012345}" and m["SpecCorpusMiB"] == "--"
    models = (tmp_path / "gen" / "tab_models.tex").read_text()
    assert r"\texttt{target} & -- & -- & 4.00M & 2.50 & 2.90 & -- & -- & 12.0" in models


@pytest.mark.parametrize("section", ["speculative", "verification", "long", "batched"])
def test_seed_claims_are_labelled_in_the_text(section):
    """The seed's numbers reach the paper only as Seed* macros, in a sentence naming the seed."""
    text = strip_comments((studies.HERE / section / "section.tex").read_text())
    uses = [m.start() for m in re.finditer(r"\\Seed[A-Z]", text)]
    assert uses, "the seed's claims are not quoted"
    start = text.index(r"\paragraph{Against the seed.}")
    end = text.index("\n\n", start)
    assert all(start <= u < end for u in uses), "a Seed* macro outside the seed paragraph"
    para = " ".join(text[start:end].split())
    assert "seed study's own reported values" in para and "not measurements of this build" in para
    assert set(seed.speculative_claims()) == {f"Seed{n}" for n in (
        "Speedup", "BestK", "FirstK", "AccFirstK", "AccBestK", "NumConfigs", "NumSlower")}
    assert set(seed.verification_claims()) == {"SeedChi", "SeedChiDof", "SeedChiP",
                                                     "SeedChiTokens"}


def test_seed_macros_only_in_their_sections():
    for path in tex_sources():
        study = path.parent.name if path.name == "section.tex" else path.stem
        if study not in ("speculative", "verification", "long", "batched"):
            assert not re.search(r"\\Seed[A-Z]", strip_comments(path.read_text())), path


def test_regimes_table_phase_attribution(stats_gen):
    rows = (stats_gen.gen / "tab_regimes.tex").read_text().splitlines()
    mps_gpt2 = next(r for r in rows if r.startswith(r"MPS & \texttt{gpt2-tiny}"))
    assert mps_gpt2.split(" & ")[-2:] == ["1.00", r"6.00 \\"]


def test_verification_flag_false_without_tables(spec_gen):
    m = spec_gen.macros
    assert m["ifVerificationReady"] == "false"
    assert m["VerChiPCorrect"] == "--" and m["VerPowerLogRatioAcceptAll"] == "--"
    assert m["ifChiMeetsStandard"] == "false" and m["ifLogRatioMeetsStandard"] == "false"
    assert m["SeedChi"] == "162.5" and m["SeedChiTokens"] == "9,200"
    for name in ("tab_verification.tex", "tab_power.tex"):
        assert r"\emph{no " in (spec_gen.gen / name).read_text(), name


def test_verification_macros(ver_gen):
    m = ver_gen.macros
    assert m["ifVerificationReady"] == "true" and m["VerPair"] == r"\texttt{cpu-cpu}"
    assert m["VerNumPairsRun"] == "2" and m["ifVerMultiPair"] == "true"
    assert m["VerExactErrCorrect"] == r"\ensuremath{2.2\times10^{-16}}"
    assert m["VerExactErrWrongMin"] == "0.0157"
    assert m["VerExactTol"] == r"\ensuremath{1\times10^{-9}}"
    assert m["ifVerExactPasses"] == "true" and m["ifVerExactRejectsWrong"] == "true"
    assert m["VerMcSinglePCorrect"] == "0.530"
    assert m["VerMcSinglePAcceptAll"] == r"\ensuremath{<10^{-300}}"
    assert m["VerMcBlockPResampleFromP"] == r"\ensuremath{2.2\times10^{-17}}"
    assert m["VerChiStatCorrect"] == "188" and m["VerChiDofCorrect"] == "200"
    assert m["VerChiPCorrect"] == "0.720" and m["VerChiPAcceptAll"] == "0.0410"
    assert m["VerChiNCorrect"] == "9,216" and "VerLogRatioStatAcceptAll" not in m  # not quoted
    assert m["VerLogRatioPResampleFromP"] == r"\ensuremath{2.1\times10^{-6}}"
    assert m["VerPowerChiAcceptAll"] == r"40.0\%" and m["VerRejectionsChiCorrect"] == "2 of 10"
    assert m["VerPowerLogRatioResampleFromP"] == r"100\%"
    assert m["VerPowerSeeds"] == "10" and m["VerPowerAlpha"] == "0.01"
    assert m["VerPowerN"] == "2,000" and m["VerRealTop"] == "200"
    assert m["VerGreedyFraction"] == r"96.9\%" and m["VerGreedyMinMargin"] == "0.0123"
    assert m["ifVerGreedyAllEqual"] == "false" and m["ifVerGreedyNearTie"] == "false"
    # the finding: the chi-square misses the wrong samplers and is liberal; the t-test does not
    assert m["ifChiRejectsWrong"] == "false" and m["ifChiFullPower"] == "false"
    assert m["ifChiLiberal"] == "true" and m["ifChiMeetsStandard"] == "false"
    log_ratio = standard_flags(read_verification(ver_gen.stats), "cpu-cpu", "LogRatio")
    assert log_ratio["LogRatioRejectsWrong"] and log_ratio["LogRatioFullPower"]
    assert not log_ratio["LogRatioLiberal"] and m["ifLogRatioMeetsStandard"] == "true"
    assert m["ifVerLevelTwoAsExpected"] == "true" and m["ifVerLevelThreeRan"] == "true"


def test_verification_without_a_real_pair(stats, tmp_path):
    m = generate(write_verification_stats(stats, pairs=()), tmp_path / "gen")
    assert m["ifVerificationReady"] == "true" and m["ifVerLevelThreeRan"] == "false"
    assert m["VerPair"] == "--" and m["VerChiPCorrect"] == "--" and m["VerPowerSeeds"] == "--"
    assert m["ifVerLevelTwoAsExpected"] == "true" and m["ifVerGreedyRan"] == "false"
    assert m["ifChiMeetsStandard"] == "false" and m["ifLogRatioMeetsStandard"] == "false"
    assert_verification_figures(verification_figures.verification_figures(stats, tmp_path / "fig"))


def test_verification_flags_flip(ver_stats, tmp_path):
    m = generate(chi_passes(ver_stats), tmp_path / "gen")
    assert m["ifChiRejectsWrong"] == "true" and m["ifChiFullPower"] == "true"
    assert m["ifChiLiberal"] == "false" and m["ifChiMeetsStandard"] == "true"
    log_ratio = standard_flags(read_verification(chi_passes(ver_stats)), "cpu-cpu", "LogRatio")
    assert not log_ratio["LogRatioFullPower"] and m["ifLogRatioMeetsStandard"] == "false"


def test_verification_tables(ver_gen):
    levels = (ver_gen.gen / "tab_verification.tex").read_text()
    assert levels.count(r"\texttt{resample\_from\_p}") == 12  # 6 level-1, 2 level-2, 4 level-3
    assert r"\textbf{kept} & rejected" in levels  # the chi-square missed a negative control
    assert r"$\chi^2 = 1{,}450$ & 7 & \ensuremath{<10^{-300}}" in levels
    assert levels.count(r"\midrule") == 3  # header, then between the three levels
    assert r"\emph{Level 3: real models, two samples}" in levels
    power = (ver_gen.gen / "tab_power.tex").read_text()
    assert "rejected at 0.01" in power and "4 / 10 & 40.0\\% & power" in power
    assert power.count("false rejections") == 6


LONG_PAIR = "long:self"
LONG_P = {  # check -> sampler -> p-value of the long pair's full-size rows
    "Monte Carlo, one step, long-context pair": {"correct": 0.53, "accept_all": 1e-200,
                                                 "resample_from_p": 2e-20},
    "two-sample chi-square": {"correct": 0.95, "accept_all": 0.36, "resample_from_p": 0.30},
    "log-ratio t-test": {"correct": 0.36, "accept_all": 6.4e-6, "resample_from_p": 3.5e-5},
}


def with_long_pair(stats_dir: Path) -> Path:
    """The verification tables with a long-context pair's rows added: every level, the
    chi-square missing both wrong rules and the log-ratio test rejecting them."""
    def add(name: str, rows: list[dict]) -> None:
        path = stats_dir / f"verification_{name}.csv"
        pd.concat([pd.read_csv(path), pd.DataFrame(rows)]).to_csv(path, index=False)

    samplers = ("correct", "accept_all", "resample_from_p")
    levels = [verification_row(1, "one step, long-context pairs", s, e, 300, pair=LONG_PAIR)
              for s, e in zip(samplers, (1.1e-16, 0.36, 0.18), strict=True)]
    levels += [verification_row(2 if "Monte" in check else 3, check, s, 1.0, 3072, p=p,
                                pair=LONG_PAIR)
               for check, ps in LONG_P.items() for s, p in ps.items()]
    add("levels", levels)
    add("power", [{"level": 3, "check": check, "pair": LONG_PAIR, "sampler": s, "seeds": 5,
                   "alpha": 0.01, "rejections": r, "rate": r / 5, "n": 1024}
                  for check in ("two-sample chi-square", "log-ratio t-test")
                  for s, r in zip(samplers, (0, 5, 4) if "log" in check else (0, 1, 0),
                                  strict=True)])
    add("greedy", [{"pair": LONG_PAIR, "prompts": 4, "fraction_equal": 1.0, "divergences": 0,
                    "min_margin": None}])
    return stats_dir


def test_the_long_pair_has_its_own_macros_and_leaves_the_standard_ones(ver_stats, tmp_path):
    before = generate(ver_stats, tmp_path / "before")
    check = {"length": 128, "policy": "retrieval", "kv_budget": 32, "drafter": "self", "k": 3,
             "documents": 4, "tokens": 3072, "power_tokens": 1024, "seeds": 5}
    write_generated(with_long_pair(ver_stats), {**settings_dict(), "long_verification": check},
                    tmp_path / "after")
    m = defined_macros((tmp_path / "after" / "macros.tex").read_text())
    standard = {k: v for k, v in before.items() if not k.startswith(("LongVer", "ifLongVer"))}
    assert {k: m[k] for k in standard} == standard  # VerNumPairsRun, VerExactErr... unchanged
    assert before["ifLongVerRan"] == "false" and before["LongVerChiPCorrect"] == "--"
    assert m["ifLongVerRan"] == "true" and m["LongVerPair"] == r"\texttt{long:self}"
    assert m["LongVerLength"] == "128" and m["LongVerPolicy"] == r"\texttt{retrieval}"
    assert m["LongVerExactErrCorrect"] == r"\ensuremath{1.1\times10^{-16}}"
    assert m["LongVerExactErrWrongMin"] == "0.180" and m["ifLongVerExactPasses"] == "true"
    assert m["LongVerMcSinglePResampleFromP"] == r"\ensuremath{2.0\times10^{-20}}"
    assert m["LongVerChiPAcceptAll"] == "0.360" and m["ifLongVerChiRejectsWrong"] == "false"
    assert m["LongVerLogRatioPAcceptAll"] == r"\ensuremath{6.4\times10^{-6}}"
    assert m["ifLongVerLogRatioRejectsWrong"] == "true" and m["ifLongVerKeepsCorrect"] == "true"
    assert m["LongVerRejectionsLogRatioResampleFromP"] == "4 of 5"
    assert m["LongVerPowerSeeds"] == "5" and m["LongVerPowerN"] == "1,024"
    assert m["LongVerGreedyFraction"] == r"100\%"
    table = (tmp_path / "after" / "tab_verification.tex").read_text()
    assert table.count(r"\texttt{long:self}") == 4  # one per check, on its first sampler


@pytest.mark.parametrize("value, text", [
    (0.976, "0.976"), (0.0012, "0.00120"), (3.1e-16, r"\ensuremath{3.1\times10^{-16}}"),
    (0.0, r"\ensuremath{<10^{-300}}"), (float("nan"), "--"),
    (9.96e-5, r"\ensuremath{1.0\times10^{-4}}"),
])
def test_pval(value, text):
    assert tex.pval(value) == text


# -----------------------------------------------------------------------------
# the paper sources: macros defined, inputs produced, no hand-typed numbers

LATEX_UPPERCASE = {"TeX", "LaTeX", "S", "P", "AA", "O", "L", "Huge", "LARGE", "Large"}
LENGTH = r"[-+]?\d*\.?\d+\s*(?:pt|em|ex|in|cm|mm|bp|sp|pc)\b"
REL_LENGTH = r"\d*\.?\d+\s*\\(?:linewidth|textwidth|textheight|columnwidth|fboxsep|fboxrule)"
STRUCTURAL = ("label", "ref", "eqref", "cite", "citep", "citet", "input", "include",
              "includegraphics", "usepackage", "documentclass", "bibliography",
              "bibliographystyle", "url", "href", "setlength", "vspace", "hspace", "multicolumn")
ALLOWED_TOKENS = (r"GPT-2|\^\{?2\}?|b?float(?:16|32|64)|int[48]\b|chi2\\?_contingency"
                  r"|\\(?:min|max)\\\{[01],"  # names, and min{1, p/q} / max{0, p-q}
                  r"|\bK\s*c?\s*\+\s*1\b|\b1\s*-\s*\\alpha\b")  # K+1 positions, Kc+1, 1-alpha


def hand_typed_numbers(text: str) -> list[str]:
    """Digits left in a TeX source once comments, lengths and structural arguments are gone.

    In a paper whose results are all macros, a digit in prose is a typed number: `21x`, `3.5 ms`,
    `95\\%`, `on 3 models`, `[0.51, 0.63]` all count. Not counted: comments; lengths (`4pt`,
    `0.8\\textheight`); optional arguments right after a command (`[width=...]`, `[1]`);
    the arguments of \\label, \\ref, \\cite..., \\input, \\includegraphics and friends;
    `\\cmidrule(lr){3-5}`; macro parameters (`#1`); and a few names (GPT-2, x^2, float32).
    """
    text = strip_comments(text)
    text = re.sub(r"(\\[A-Za-z]+\*?|\\\\)\s*\[[^\]]*\]", r"\1", text)
    text = re.sub(r"(newcommand\*?\s*\{?\\[A-Za-z]+\}?)\s*\[\d\]", r"\1", text)
    names = "|".join(STRUCTURAL)
    text = re.sub(rf"\\(?:{names})\*?\s*\{{(?:[^{{}}]|\{{[^{{}}]*\}})*\}}", " ", text)
    text = re.sub(r"\\cmidrule(?:\([a-z]*\))?\{[^}]*\}", " ", text)
    for pattern in (REL_LENGTH, LENGTH, r"#\d", ALLOWED_TOKENS):
        text = re.sub(pattern, " ", text)
    return [m.group(0) for m in re.finditer(r"\S*\d\S*", text)]


@pytest.mark.parametrize("snippet", [
    r"latency spikes of up to 21x at nearby budgets", r"a 1.61$\times$ speedup",
    r"acceptance 69.7\% at $K=1$", r"each step takes 3.2~ms", r"on 3 models",
    r"from \KvSpeedupMin{} [0.512, 0.626]", r"\section{Results for 2026}",
    r"chi2 = 162.5, dof = 200", r"\caption{Speedup of 4$\times$ at budget 96.}",
    r"$\min\{2, x\}$", r"$\max\{0.5, x\}$", r"a speedup at $K=6$", r"$K+2$ tokens",
    r"$1-\beta$", r"at $K=\SpecFirstK$ from 69.7\% at $K+1$",
])
def test_number_rule_flags_typed_results(snippet):
    assert hand_typed_numbers(snippet), snippet


@pytest.mark.parametrize("snippet", [
    r"\includegraphics[width=0.9\linewidth,height=0.78\textheight]{figures/latency.pdf}",
    r"% up to 21x in a comment", r"GPT-2, OPT and BLOOM", r"\vspace{2pt} \\[4pt]",
    r"\label{sec:s3} \ref{tab:kv2} \citep{leviathan2023fast,chen2023accelerating}",
    r"\setlength{\tabcolsep}{4pt}", r"\newcommand{\madeby}[1]{rule \cmd{#1}}",
    r"$\chi^2$ and $x^{2}$", r"\cmidrule(lr){3-5}", r"\documentclass[10pt,letterpaper]{article}",
    r"\parbox{\dimexpr\linewidth-2\fboxsep-2\fboxrule\relax}{x}", r"\KvSpeedupMax\x{} in \Dtype",
    r"\input{generated/tab_kv.tex}", r"\usepackage[margin=1in]{geometry}",
    r"$\min\{1, p(t)/q(t)\}$ and $\max\{0, p - q\}$", r"\cmd{scipy.stats.chi2\_contingency}",
    r"\[ \frac{1-\alpha^{K+1}}{(1-\alpha)(Kc+1)} \]", r"scores $K+1$ tokens",
    r"\madeby{speculative\_figures}",
])
def test_number_rule_ignores_structure(snippet):
    assert not hand_typed_numbers(snippet), snippet


def test_paper_sources_have_no_hand_typed_numbers():
    assert tex_sources(), "no paper/*.tex sources"
    found = {p.relative_to(ROOT).as_posix(): hand_typed_numbers(p.read_text())
             for p in tex_sources()}
    assert not {k: v for k, v in found.items() if v}, found


@pytest.mark.parametrize("scenario", ["without_speculative", "with_speculative",
                                      "with_verification"])
def test_every_macro_used_in_paper_is_defined(scenario, tmp_path):
    stats = write_stats(tmp_path / "stats")
    if scenario != "without_speculative":
        write_spec_stats(stats)
    if scenario == "with_verification":
        write_verification_stats(stats)
    m = generate(stats, tmp_path / "gen")
    text = "\n".join(strip_comments(p.read_text()) for p in tex_sources())
    local = set(re.findall(r"\\(?:re)?newcommand\*?\{?\\([A-Za-z]+)", text))
    used = set(re.findall(r"\\([A-Z][A-Za-z]*)", text)) - LATEX_UPPERCASE - local
    assert not used - set(m), f"used in paper/ but not generated: {sorted(used - set(m))}"
    flags = {"if" + f for f in re.findall(r"\\if([A-Z][A-Za-z]*)", text)}
    assert not flags - set(m), f"\\if flags not generated: {sorted(flags - set(m))}"


def shown_by_the_settings_table() -> set[str]:
    """Macros the protocol table shows (whether or not the text quotes them): those whose
    sentinel value appears in the table built from sentinels."""
    settings = settings_dict()
    names = {**paper_settings.settings_macros(settings),
             **paper_settings.spec_settings_macros(settings)}
    table = paper_settings.settings_table(settings, {n: f"<{n}>" for n in names})
    return {n for n in names if f"<{n}>" in table}


def test_the_settings_table_shows_the_settings_macros():
    shown = shown_by_the_settings_table()
    assert {"HostName", "Budgets", "RegimeMetric", "SpecKs", "SpecParallelInner"} <= shown
    assert "NumBudgets" not in shown and "SpecParallelKRef" not in shown


@pytest.mark.parametrize("scenario", ["with_verification", "with_spikes"])
def test_every_generated_macro_is_used_in_the_paper(scenario, tmp_path):
    stats = write_stats(tmp_path / "stats", spikes=scenario == "with_spikes")
    write_spec_stats(stats)
    write_verification_stats(stats)
    m = generate(stats, tmp_path / "gen")
    text = "\n".join(strip_comments(p.read_text()) for p in tex_sources())
    unused = sorted(name for name in m if not re.search(rf"\\{name}(?![A-Za-z])", text)
                    and name not in shown_by_the_settings_table())
    assert not unused, f"generated but never used: {unused}"


def test_every_generated_input_is_produced(stats_gen):
    produced = {p.name for p in stats_gen.written}
    text = "\n".join(strip_comments(p.read_text()) for p in tex_sources())
    wanted = set(re.findall(r"\\input\{generated/([^}]+)\}", text))
    assert wanted, "paper/ inputs nothing from generated/"
    assert wanted <= produced, sorted(wanted - produced)
    assert {n for n in produced if n.startswith("tab_")} <= wanted, "a table is never shown"


def test_paper_includes_all_figures_with_provenance():
    text = "\n".join(strip_comments(p.read_text()) for p in tex_sources())
    made_by = {"latency": "figures", "kv_speedup": "figures", "regime_depth": "figures",
               "changepoints": "figures", "quantized": r"quantized\_figures",
               **{f: r"long\_figures" for f in ("long_acceptance", "long_speedup", "long_cost")},
               **{f: r"batched\_figures" for f in ("batched_speedup", "batched_overhead")},
               **{f: r"speculative\_figures" for f in SPEC_FIGURES},
               **{f: r"verification\_figures" for f in VERIFICATION_FIGURES}}
    captions = dict(re.findall(r"\\includegraphics(?:\[[^\]]*\])?\{figures/([a-z_]+)\.pdf\}"
                               r".*?\\caption\{(.*?)\\label\{fig:", text, flags=re.S))
    assert set(captions) == set(made_by)
    for fig, rule in made_by.items():
        assert rf"\madeby{{{rule}}}" in captions[fig], fig
    assert "snakemake -{}-forcerun #1" in text


# -----------------------------------------------------------------------------
# the real thing: compile the paper

@pytest.mark.skipif(shutil.which("latexmk") is None,
                    reason="latexmk not on PATH: install TeX Live (latexmk, pdflatex, bibtex)")
@pytest.mark.parametrize("scenario", ["two_backends_spikes", "two_backends_speculative",
                                      "cpu_only_speculative_one_pair", "nothing_ran",
                                      "two_backends_speculative_verification",
                                      "cpu_only_speculative_verification_chi_passes",
                                      "cpu_only_speculative_verification_no_pair",
                                      "two_backends_speculative_noisy"])
def test_paper_compiles(scenario, tmp_path):
    backends, spikes = (("cpu", "mps"), True) if scenario.startswith("two") else (("cpu",), False)
    stats_dir = write_stats(tmp_path / "stats", backends=backends, spikes=spikes)
    if scenario == "nothing_ran":
        empty_tables(stats_dir)
    if scenario.startswith("two_backends_speculative"):
        write_spec_stats(stats_dir)
    if scenario.startswith("cpu_only_speculative"):
        write_spec_stats(stats_dir, pairs=("cpu-cpu",), backends=("cpu",), hf=False)
    verified = "verification" in scenario
    if scenario == "two_backends_speculative_verification":
        write_verification_stats(stats_dir, pairs=("cpu-cpu", "cpu-mps"))
    if scenario.endswith("chi_passes"):
        chi_passes(write_verification_stats(stats_dir))
    if scenario.endswith("no_pair"):  # levels 1 and 2 only: no pair could run level 3
        write_verification_stats(stats_dir, pairs=())
    if scenario.endswith("noisy"):
        write_selection(write_stability(stats_dir, backends, NOISY_JOBS), distinguishable=False)
    pdf, log = build_paper(stats_dir, tmp_path)
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 50_000
    built = (tmp_path / "build" / "generated" / "macros.tex").read_text()
    ready = "speculative" in scenario
    assert (r"\SpeculativeReadytrue" in built) == ready
    assert ("figures/acceptance.pdf" in log) == ready  # the figure was actually included
    assert (r"\VerificationReadytrue" in built) == verified
    for fig in VERIFICATION_FIGURES:  # both belong to the real-model level
        assert (f"figures/{fig}.pdf" in log) == (verified and not scenario.endswith("no_pair"))
    assert not overfull(log), f"overfull boxes (pt): {overfull(log)}"
    assert not re.search(r"LaTeX Warning: (Reference|Citation) .* undefined", log)


def test_write_generated_survives_empty_tables(stats, tmp_path):
    """A host where nothing ran still gets a paper that says so, not a traceback."""
    empty_tables(stats)
    m = generate(stats, tmp_path / "gen")
    assert m["NumBackendsRun"] == "0" and m["BackendsRun"] == "none"
    assert m["KvSpeedupMin"] == "--" and m["MaxTrendRatio"] == "--" and m["NumSpikes"] == "0"
    assert "no KV-cache ablation" in (tmp_path / "gen" / "tab_kv.tex").read_text()


# -----------------------------------------------------------------------------
# noise: the verdict said first, and every quoted best without the winner's curse

NOISY_JOBS = {"results/ci_runner-01/mps/sweep/gpt2-tiny/rep1.parquet": 7,
              "results/ci_runner-01/cpu/sweep/opt-tiny/rep0.parquet": 2}


def test_a_noisy_build_says_so_first_with_its_noisiest_jobs_and_the_remeasure_command(
        stats, tmp_path):
    write_stability(stats, ("cpu", "mps"), NOISY_JOBS)
    verdict = generate(stats, tmp_path / "gen")["NoiseVerdict"]
    assert verdict.startswith(r"\textbf{This build was noisy:}")
    assert r"15.0\% of its 60 measured configurations (9)" in verdict
    assert verdict.index("gpt2-") < verdict.index("opt-")  # the noisiest first
    assert r"\cmd{make remeasure}" in verdict
    abstract = (PAPER / "paper.tex").read_text().split(r"\begin{abstract}")[1]
    assert abstract.split()[0] == r"\NoiseVerdict{}"  # the abstract's first sentence
    claims = (PAPER / "sections" / "introduction.tex").read_text().split(r"\begin{enumerate}")[1]
    assert claims.split(r"\item")[1].count(r"\NoiseVerdict") == 1  # and its first claim


def test_a_quiet_build_says_it_was_quiet_and_how_that_was_judged(stats_gen):
    macros = stats_gen.macros
    assert macros["NoiseVerdict"].startswith("This build was quiet: 60 of 60 measured")
    assert r"background CPU $\le$ 10\%" in macros["NoiseVerdict"]
    assert "noisy" not in macros["NoiseVerdict"] and "remeasure" not in macros["NoiseVerdict"]
    assert macros["NoiseJudgedBy"].startswith(r"cv between processes $\le$ 10\%")


def test_a_build_from_before_the_verdicts_says_it_carries_none(stats, tmp_path):
    for name in ("stability", "stability_summary", "selection"):
        (stats / f"{name}.csv").unlink()
    macros = generate(stats, tmp_path / "gen")
    assert "carries no stability verdict" in macros["NoiseVerdict"]
    assert macros["SelSpecFinding"] == macros["SelKvFinding"] == "not measured in this build"
    assert macros["NoiseJudgedBy"].startswith(r"cv between processes $\le$")  # the settings'


def test_each_quoted_best_comes_from_the_selection_table(spec_gen):
    macros = spec_gen.macros
    assert macros["SelSpecFinding"].startswith("cpu-mps, sampled, K = 4 (chosen on processes "
                                               "1, 3, 5, 7, measured on processes 0, 2, 4, 6)")
    assert macros["SelSpecFinding"].endswith(r"1.38\x{} [1.21, 1.52]")
    assert macros["SelKvFinding"].endswith(r"5.60\x{} [4.90, 6.30]")
    assert macros["SelSpikeFinding"].endswith(r"5.20\x{} [4.10, 6.00]")


def test_a_best_whose_interval_includes_1_is_no_configuration_distinguishable(spec_stats,
                                                                              tmp_path):
    write_selection(spec_stats, distinguishable=False)
    macros = generate(spec_stats, tmp_path / "gen")
    for name in ("SelSpecFinding", "SelKvFinding", "SelSpikeFinding"):
        assert macros[name].startswith(r"no configuration distinguishable from 1\x{}"), name
        assert "is not a finding" in macros[name]  # the naive maximum, for contrast only
    text = "\n".join(strip_comments(p.read_text()) for p in tex_sources())
    assert r"\SpecBestSpeedupSampled" not in text.split(r"\end{abstract}")[0]


def test_too_few_processes_to_split_are_said_instead_of_a_speedup(spec_stats, tmp_path):
    table = pd.read_csv(spec_stats / "selection.csv")
    table[["estimate", "ci_low", "ci_high"]] = float("nan")
    table["reason"] = ("3 processes per configuration, fewer than the 8 needed to choose on "
                       "one half and estimate on the other")
    table.to_csv(spec_stats / "selection.csv", index=False)
    finding = generate(spec_stats, tmp_path / "gen")["SelSpecFinding"]
    assert finding.startswith(r"no configuration distinguishable from 1\x{} (3 processes per")
    assert r"1.52\x, is not a finding" in finding


def test_spikes_in_unstable_configurations_are_counted_apart_never_as_claims(stats, tmp_path):
    regimes = pd.read_csv(stats / "regimes.csv", keep_default_na=False)
    spiked = regimes["spike"] & regimes["use_cache"]
    regimes["stable"] = ~spiked
    regimes["unstable_reason"] = regimes["unstable_reason"].where(~spiked, "background CPU 41%")
    regimes.to_csv(stats / "regimes.csv", index=False)
    macros = generate(stats, tmp_path / "gen")
    assert macros["NumSpikes"] == "1" and macros["NumSpikesUnstable"] == "1"
    assert macros["NumSpikesMps"] == "0" and macros["ifAnyUnstableSpikes"] == "true"
