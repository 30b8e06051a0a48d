# The speculative-decoding study: one job per draft/target configuration x repeat, the target's
# verification parallelism per backend, then the study's statistics.


rule speculative:
    input:
        target=lambda wc: f"results/models/{PAIRS[wc.pair].target}",
        draft=lambda wc: f"results/models/{PAIRS[wc.pair].draft}",
        target_gguf=pair_gguf("target"),
        draft_gguf=pair_gguf("draft"),
    output:
        "results/{host}/speculative/{pair}/rep{repeat}.parquet",
    log:
        "logs/{host}/speculative/{pair}/rep{repeat}.log",
    benchmark:
        "benchmarks/{host}/speculative/{pair}/rep{repeat}.tsv"
    wildcard_constraints:
        repeat=r"\d+",
    conda:
        job_conda_env
    container:
        job_container
    threads: job_threads
    resources:
        **MEASURING_RESOURCES,
    params:
        spec=as_arg(SPEC.job_spec()),
        pair=lambda wc: as_arg(PAIRS[wc.pair].job_spec()),
        gguf=gguf_args,
    shell:
        "decodelab speculative --target-dir {input.target} --draft-dir {input.draft}"
        " --pair {wildcards.pair} --pair-spec {params.pair} --spec {params.spec} {params.gguf}"
        " --repeat {wildcards.repeat} --threads {threads} --out {output} 2> {log}"


rule parallelism:
    input:
        "results/models/{model}",
    output:
        "results/{host}/{backend}/parallelism/{model}/rep{repeat}.parquet",
    log:
        "logs/{host}/{backend}/parallelism/{model}/rep{repeat}.log",
    benchmark:
        "benchmarks/{host}/{backend}/parallelism/{model}/rep{repeat}.tsv"
    wildcard_constraints:
        backend="cpu|cuda|mps",
        repeat=r"\d+",
    conda:
        job_conda_env
    container:
        job_container
    threads: job_threads
    resources:
        **MEASURING_RESOURCES,
    params:
        spec=lambda wc: as_arg(parallelism_spec(wc.backend, wc.model)),
    shell:
        "decodelab parallelism --model-dir {input} --model {wildcards.model}"
        " --backend {wildcards.backend} --spec {params.spec} --repeat {wildcards.repeat}"
        " --threads {threads} --out {output} 2> {log}"


rule speculative_stats:
    input:
        runs=speculative_runs,
        parallelism=parallelism_runs,
        verdicts=verdict_tables("speculative"),
    output:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("speculative")),
    log:
        "logs/{host}/speculative_stats.log",
    conda:
        job_conda_env
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.stats.job_spec()),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab spec-stats --spec {params.spec} --verdicts {input.verdicts}"
        " --out {params.out} --runs {input.runs} --parallelism {input.parallelism} 2> {log}"


rule model_table:
    input:
        expand("results/models/{model}", model=list(SETTINGS.models)),
    output:
        "results/{host}/stats/models.csv",
    log:
        "logs/{host}/model_table.log",
    conda:
        job_conda_env
    container:
        job_container
    shell:
        "decodelab model-table --out {output} {input} 2> {log}"
