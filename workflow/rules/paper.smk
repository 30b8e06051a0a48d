# The tables and figures the paper reads. merge_hosts writes the tables of this host and of
# every imported one (config 'hosts') to results/combined/stats/; the figure rules draw
# results/combined/figures/ from them.
LOCAL_TABLES = (
    ["latency", "kv_speedup", "regimes", "environment", "skipped", "models"]
    + [f"speculative_{t}" for t in ("acceptance", "speedup", "theory", "hf", "parallelism")]
    + [f"verification_{t}" for t in ("levels", "power", "pvalues", "tokens", "greedy")]
    + [f"regime_{t}" for t in REGIME_DEPTH_TABLES]
    + ["reference_comparison", "benchmarks"]
)
PAPER_TABLES = LOCAL_TABLES + ["hosts"]
PAPER_FIGURES = [
    "latency",
    "kv_speedup",
    "regime_depth",
    "changepoints",
    "acceptance",
    "speedup",
    "parallelism",
    "theory",
] + [
    "verification_tokens",
    "verification_pvalues",
]


rule settings:
    output:
        f"results/{HOST}/settings.json",
    log:
        f"logs/{HOST}/settings.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=as_arg(paper_settings()),
    shell:
        "decodelab settings --spec {params.spec} --out {output} 2> {log}"


rule paper:
    input:
        sources=sorted(str(p) for p in Path("paper").rglob("*") if p.is_file()),
        settings=rules.settings.output,
        stats=expand("results/combined/stats/{table}.csv", table=PAPER_TABLES),
        figures=expand("results/combined/figures/{fig}.pdf", fig=PAPER_FIGURES),
    output:
        report("results/paper/paper.pdf", category="Paper", caption="../report/paper.rst"),
    log:
        "logs/paper.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        None  # latexmk is on the host (`make tex`); the images carry no TeX
    params:
        stats=lambda wc, input: os.path.dirname(input.stats[0]),
        figures=lambda wc, input: os.path.dirname(input.figures[0]),
    shell:
        "decodelab paper --sources paper --stats {params.stats} --figures {params.figures}"
        " --settings {input.settings} --build-dir results/paper/build --out {output} > {log} 2>&1"
