rule figures:
    input:
        "results/{host}/stats/latency.csv",
        "results/{host}/stats/kv_speedup.csv",
        "results/{host}/stats/regimes.csv",
    output:
        multiext("results/{host}/figures/latency", ".pdf", ".png"),
        multiext("results/{host}/figures/kv_speedup", ".pdf", ".png"),
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    conda:
        "../../envs/decodelab.yaml"
    log:
        "logs/{host}/figures.log",
    shell:
        "decodelab figures --stats {params.stats} --out {params.out} 2> {log}"
