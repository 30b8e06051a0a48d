rule settings:
    output:
        f"results/{HOST}/settings.json",
    params:
        spec=as_arg(paper_settings()),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        f"logs/{HOST}/settings.log",
    shell:
        "decodelab settings --spec {params.spec} --out {output} 2> {log}"


rule paper:
    input:
        sources=sorted(str(p) for p in Path("paper").rglob("*") if p.is_file()),
        settings=rules.settings.output,
        stats=expand(
            "results/{host}/stats/{table}.csv",
            host=HOST,
            table=["latency", "kv_speedup", "regimes", "environment", "skipped", "models"]
            + [f"speculative_{t}" for t in ("acceptance", "speedup", "theory", "hf", "parallelism")]
            + [f"verification_{t}" for t in ("levels", "power", "pvalues", "tokens", "greedy")]
            + [f"regime_{t}" for t in REGIME_DEPTH_TABLES],
        ),
        figures=expand(
            "results/{host}/figures/{fig}.pdf",
            host=HOST,
            fig=["latency", "kv_speedup", "regime_depth", "changepoints", "acceptance", "speedup", "parallelism", "theory"]
            + ["verification_tokens", "verification_pvalues"],
        ),
    output:
        "results/paper/paper.pdf",
    params:
        stats=lambda wc, input: os.path.dirname(input.stats[0]),
        figures=lambda wc, input: os.path.dirname(input.figures[0]),
    conda:
        "../../envs/decodelab.yaml"
    container:
        None  # latexmk is on the host (`make tex`); the images carry no TeX
    log:
        "logs/paper.log",
    shell:
        "decodelab paper --sources paper --stats {params.stats} --figures {params.figures}"
        " --settings {input.settings} --build-dir results/paper/build --out {output} > {log} 2>&1"
