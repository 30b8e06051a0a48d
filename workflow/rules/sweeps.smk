# One job per backend x experiment x model x repeat: each repeat is its own process.
# A CPU benchmark takes every core, so nothing else runs beside it; one job per device.


rule sweep:
    input:
        "results/models/{model}",
    output:
        "results/{host}/{backend}/{experiment}/{model}/rep{repeat}.parquet",
    log:
        "logs/{host}/{backend}/{experiment}/{model}/rep{repeat}.log",
    benchmark:
        "benchmarks/{host}/{backend}/{experiment}/{model}/rep{repeat}.tsv"
    wildcard_constraints:
        backend="cpu|cuda|mps",
        experiment="sweep|ablation",
        repeat=r"\d+",
    conda:
        job_conda_env
    container:
        job_container
    threads: job_threads
    resources:
        **MEASURING_RESOURCES,
    params:
        spec=as_arg(SWEEP.job_spec()),
    shell:
        "decodelab sweep --model-dir {input} --model {wildcards.model}"
        " --backend {wildcards.backend} --experiment {wildcards.experiment}"
        " --repeat {wildcards.repeat} --threads {threads} --spec {params.spec}"
        " --out {output} 2> {log}"
