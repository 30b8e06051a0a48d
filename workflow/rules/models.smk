rule prepare_model:
    output:
        directory("results/models/{model}"),
    params:
        spec=lambda wc: as_arg(config["models"][wc.model]),
    conda:
        "../../envs/decodelab.yaml"
    log:
        "logs/prepare_model/{model}.log",
    shell:
        "decodelab prepare-model --spec {params.spec} --out {output} 2> {log}"
