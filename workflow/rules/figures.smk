# Figures of this host (results/<host>/figures/) and of all hosts merged (results/combined/).
FIGURE_HOSTS = f"{re.escape(HOST)}|combined"


rule figures:
    input:
        "results/{host}/stats/latency.csv",
        "results/{host}/stats/kv_speedup.csv",
        "results/{host}/stats/regimes.csv",
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("regime_depth")),
    output:
        "results/{host}/figures/latency.pdf",
        report(
            "results/{host}/figures/latency.png",
            caption="../report/latency.rst",
            category="Decode regimes",
            subcategory="{host}",
        ),
        "results/{host}/figures/kv_speedup.pdf",
        report(
            "results/{host}/figures/kv_speedup.png",
            caption="../report/kv_speedup.rst",
            category="KV cache",
            subcategory="{host}",
        ),
        "results/{host}/figures/regime_depth.pdf",
        report(
            "results/{host}/figures/regime_depth.png",
            caption="../report/regime_depth.rst",
            category="Decode regimes",
            subcategory="{host}",
        ),
        "results/{host}/figures/changepoints.pdf",
        report(
            "results/{host}/figures/changepoints.png",
            caption="../report/changepoints.rst",
            category="Decode regimes",
            subcategory="{host}",
        ),
    log:
        "logs/{host}/figures.log",
    wildcard_constraints:
        host=FIGURE_HOSTS,
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab figures --stats {params.stats} --out {params.out} 2> {log}"


rule speculative_figures:
    input:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("speculative")),
    output:
        "results/{host}/figures/acceptance.pdf",
        report(
            "results/{host}/figures/acceptance.png",
            caption="../report/acceptance.rst",
            category="Speculative",
            subcategory="{host}",
        ),
        "results/{host}/figures/speedup.pdf",
        report(
            "results/{host}/figures/speedup.png",
            caption="../report/speedup.rst",
            category="Speculative",
            subcategory="{host}",
        ),
        "results/{host}/figures/parallelism.pdf",
        report(
            "results/{host}/figures/parallelism.png",
            caption="../report/parallelism.rst",
            category="Speculative",
            subcategory="{host}",
        ),
        "results/{host}/figures/theory.pdf",
        report(
            "results/{host}/figures/theory.png",
            caption="../report/theory.rst",
            category="Speculative",
            subcategory="{host}",
        ),
    log:
        "logs/{host}/speculative_figures.log",
    wildcard_constraints:
        host=FIGURE_HOSTS,
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab spec-figures --stats {params.stats} --out {params.out} 2> {log}"


rule verification_figures:
    input:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("verification")),
    output:
        "results/{host}/figures/verification_tokens.pdf",
        report(
            "results/{host}/figures/verification_tokens.png",
            caption="../report/verification_tokens.rst",
            category="Verification",
            subcategory="{host}",
        ),
        "results/{host}/figures/verification_pvalues.pdf",
        report(
            "results/{host}/figures/verification_pvalues.png",
            caption="../report/verification_pvalues.rst",
            category="Verification",
            subcategory="{host}",
        ),
    log:
        "logs/{host}/verification_figures.log",
    wildcard_constraints:
        host=FIGURE_HOSTS,
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab verify-figures --stats {params.stats} --out {params.out} 2> {log}"


rule quantized_figures:
    input:
        expand(
            "results/{{host}}/stats/{table}.csv",
            table=[*tables.names("quantized"), "speculative_parallelism"],
        ),
    output:
        "results/{host}/figures/quantized.pdf",
        report(
            "results/{host}/figures/quantized.png",
            caption="../report/quantized.rst",
            category="Quantized",
            subcategory="{host}",
        ),
    log:
        "logs/{host}/quantized_figures.log",
    wildcard_constraints:
        host=FIGURE_HOSTS,
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab quantized-figures --stats {params.stats} --out {params.out} 2> {log}"


rule long_figures:
    input:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("long")),
    output:
        "results/{host}/figures/long_acceptance.pdf",
        report(
            "results/{host}/figures/long_acceptance.png",
            caption="../report/long.rst",
            category="Long contexts",
            subcategory="{host}",
        ),
        "results/{host}/figures/long_speedup.pdf",
        report(
            "results/{host}/figures/long_speedup.png",
            caption="../report/long.rst",
            category="Long contexts",
            subcategory="{host}",
        ),
        "results/{host}/figures/long_cost.pdf",
        report(
            "results/{host}/figures/long_cost.png",
            caption="../report/long.rst",
            category="Long contexts",
            subcategory="{host}",
        ),
    log:
        "logs/{host}/long_figures.log",
    wildcard_constraints:
        host=FIGURE_HOSTS,
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab long-figures --stats {params.stats} --out {params.out} 2> {log}"


rule batched_figures:
    input:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("batched")),
    output:
        "results/{host}/figures/batched_speedup.pdf",
        report(
            "results/{host}/figures/batched_speedup.png",
            caption="../report/batched.rst",
            category="Batched speculation",
            subcategory="{host}",
        ),
        "results/{host}/figures/batched_overhead.pdf",
        report(
            "results/{host}/figures/batched_overhead.png",
            caption="../report/batched.rst",
            category="Batched speculation",
            subcategory="{host}",
        ),
    log:
        "logs/{host}/batched_figures.log",
    wildcard_constraints:
        host=FIGURE_HOSTS,
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        stats=lambda wc, input: os.path.dirname(input[0]),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab batched-figures --stats {params.stats} --out {params.out} 2> {log}"
