# Batched speculation without a shared schedule (decodelab.studies.batched.run, config 'batched'): one
# process per repeat on the configured device, each every batch size x context x mode over its
# rounds of held-out prompts, beside the forward timings its scheduler's cost model is fitted
# to; then its tables. Without config 'batched', or on a host without its device,
# batched_stats writes the tables empty.
rule batched:
    input:
        target=lambda wc: f"results/models/{BATCHED.target}",
        draft=lambda wc: f"results/models/{BATCHED.draft}",
    output:
        runs="results/{host}/batched/{backend}/rep{repeat}.parquet",
        costs="results/{host}/batched/{backend}/rep{repeat}_costs.parquet",
    log:
        "logs/{host}/batched/{backend}/rep{repeat}.log",
    benchmark:
        "benchmarks/{host}/batched/{backend}/rep{repeat}.tsv"
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
        spec=lambda wc: as_arg(BATCHED.job_spec()),
    shell:
        "decodelab batched --target-dir {input.target} --draft-dir {input.draft}"
        " --backend {wildcards.backend} --spec {params.spec} --repeat {wildcards.repeat}"
        " --threads {threads} --costs {output.costs} --out {output.runs} 2> {log}"


rule batched_stats:
    input:
        runs=batched_runs,
        costs=batched_costs,
    output:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("batched")),
    log:
        "logs/{host}/batched_stats.log",
    conda:
        job_conda_env
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.stats.job_spec()),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab batched-stats --spec {params.spec} --out {params.out} --runs {input.runs}"
        " --costs {input.costs} 2> {log}"
