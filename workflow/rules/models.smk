rule prepare_model:
    input:
        teacher=teacher_dir,
    output:
        directory("results/models/{model}"),
    params:
        spec=lambda wc: as_arg(config["models"][wc.model]),
        teacher=lambda wc, input: f"--teacher-dir {input.teacher}" if input.teacher else "",
    threads: lambda wc: workflow.cores if config["models"][wc.model]["source"] == "train" else 1
    resources:
        gpu=lambda wc: int(config["models"][wc.model].get("device") == "cuda"),
        mps=lambda wc: int(config["models"][wc.model].get("device") == "mps"),
        gpu_model=job_gpu_model,
    conda:
        job_conda_env
    container:
        job_container
    log:
        "logs/prepare_model/{model}.log",
    benchmark:
        "benchmarks/prepare_model/{model}.tsv"
    shell:
        "decodelab prepare-model --spec {params.spec} {params.teacher} --threads {threads}"
        " --out {output} 2> {log}"
