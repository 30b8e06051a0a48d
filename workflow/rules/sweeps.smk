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
    threads: lambda wc: workflow.cores if wc.backend == "cpu" else 1
    resources:
        bench_cpu=lambda wc: int(wc.backend == "cpu"),
        gpu=lambda wc: int(wc.backend == "cuda"),
        gpu_model=job_gpu_model,
        mps=lambda wc: int(wc.backend == "mps"),
    params:
        spec=as_arg(sweep_spec()),
    shell:
        "decodelab sweep --model-dir {input} --model {wildcards.model}"
        " --backend {wildcards.backend} --experiment {wildcards.experiment}"
        " --repeat {wildcards.repeat} --threads {threads} --spec {params.spec}"
        " --out {output} 2> {log}"
