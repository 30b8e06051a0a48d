rule figures:
    input:
        "results/{host}/stats/latency.csv",
        "results/{host}/stats/kv_speedup.csv",
        "results/{host}/stats/regimes.csv",
        expand("results/{{host}}/stats/regime_{table}.csv", table=REGIME_DEPTH_TABLES),
    output:
        multiext("results/{host}/figures/latency", ".pdf", ".png"),
        multiext("results/{host}/figures/kv_speedup", ".pdf", ".png"),
        multiext("results/{host}/figures/regime_depth", ".pdf", ".png"),
        multiext("results/{host}/figures/changepoints", ".pdf", ".png"),
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/figures.log",
    shell:
        "decodelab figures --stats {params.stats} --out {params.out} 2> {log}"


rule speculative_figures:
    input:
        expand(
            "results/{{host}}/stats/speculative_{table}.csv",
            table=["acceptance", "speedup", "theory", "hf", "parallelism"],
        ),
    output:
        multiext("results/{host}/figures/acceptance", ".pdf", ".png"),
        multiext("results/{host}/figures/speedup", ".pdf", ".png"),
        multiext("results/{host}/figures/parallelism", ".pdf", ".png"),
        multiext("results/{host}/figures/theory", ".pdf", ".png"),
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/speculative_figures.log",
    shell:
        "decodelab spec-figures --stats {params.stats} --out {params.out} 2> {log}"


rule verification_figures:
    input:
        expand(
            "results/{{host}}/stats/verification_{table}.csv",
            table=["levels", "power", "pvalues", "tokens", "greedy"],
        ),
    output:
        multiext("results/{host}/figures/verification_tokens", ".pdf", ".png"),
        multiext("results/{host}/figures/verification_pvalues", ".pdf", ".png"),
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/verification_figures.log",
    shell:
        "decodelab verify-figures --stats {params.stats} --out {params.out} 2> {log}"
