rule prepare_model:
    input:
        teacher=teacher_dir,
    output:
        directory("results/models/{model}"),
    log:
        "logs/prepare_model/{model}.log",
    benchmark:
        "benchmarks/prepare_model/{model}.tsv"
    conda:
        job_conda_env
    container:
        job_container
    threads: lambda wc: workflow.cores if SETTINGS.models[wc.model]["source"] == "train" else 1
    resources:
        gpu=uses("cuda"),
        mps=uses("mps"),
        gpu_model=job_gpu_model,
    params:
        spec=lambda wc: as_arg(SETTINGS.models[wc.model]),
        teacher=lambda wc, input: f"--teacher-dir {input.teacher}" if input.teacher else "",
        positions=lambda wc: POSITION_NEEDS.get(wc.model, (0, ""))[0],
    shell:
        "decodelab prepare-model --spec {params.spec} {params.teacher} --threads {threads}"
        " --positions-needed {params.positions} --out {output} 2> {log}"
