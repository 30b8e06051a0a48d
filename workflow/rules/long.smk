# The long-context study (decodelab.studies.long.run, config 'long'): one process per repeat on the
# configured device, each the whole L x KV budget x policy x drafter x mode x K grid over
# held-out documents with the target alone beside it; then its tables (its figures are in
# figures.smk). Without config 'long', or on a host without its device, long_stats writes the
# tables empty.
rule long:
    input:
        target=lambda wc: f"results/models/{LONG.target}",
        drafters=lambda wc: [f"results/models/{d}" for d in long_drafters()],
    output:
        "results/{host}/long/{backend}/rep{repeat}.parquet",
    log:
        "logs/{host}/long/{backend}/rep{repeat}.log",
    benchmark:
        "benchmarks/{host}/long/{backend}/rep{repeat}.tsv"
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
        spec=lambda wc: as_arg(LONG.job_spec()),
        target=lambda wc: LONG.target,
        drafters=lambda wc: " ".join(
            f"--drafter-dir {d}=results/models/{d}" for d in long_drafters()
        ),
    shell:
        "decodelab long --target-dir {input.target} --target {params.target} {params.drafters}"
        " --backend {wildcards.backend} --spec {params.spec} --repeat {wildcards.repeat}"
        " --threads {threads} --out {output} 2> {log}"


rule long_stats:
    input:
        long_runs,
    output:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("long")),
    log:
        "logs/{host}/long_stats.log",
    conda:
        job_conda_env
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.stats.job_spec()),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab long-stats --spec {params.spec} --out {params.out} --runs {input} 2> {log}"
