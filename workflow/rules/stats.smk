rule collect:
    input:
        raw_runs,
    output:
        runs="results/{host}/runs.parquet",
        environment="results/{host}/stats/environment.csv",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/collect.log",
    shell:
        "decodelab collect --host {wildcards.host} --out {output.runs}"
        " --environment {output.environment} {input} 2> {log}"


rule skipped:
    output:
        "results/{host}/stats/skipped.csv",
    params:
        backends=" ".join(SKIPPED),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/skipped.log",
    shell:
        "decodelab skipped --host {wildcards.host} --out {output} {params.backends} 2> {log}"


rule statistics:
    input:
        "results/{host}/runs.parquet",
    output:
        latency="results/{host}/stats/latency.csv",
        kv="results/{host}/stats/kv_speedup.csv",
    params:
        spec=as_arg(config["stats"]),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/statistics.log",
    shell:
        "decodelab stats --runs {input} --spec {params.spec} --latency {output.latency}"
        " --kv {output.kv} 2> {log}"


rule regimes:
    input:
        "results/{host}/runs.parquet",
    output:
        "results/{host}/stats/regimes.csv",
    params:
        spec=as_arg(regime_rule_spec()),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/regimes.log",
    shell:
        "decodelab regimes --runs {input} --spec {params.spec} --out {output} 2> {log}"


rule regime_depth:
    input:
        runs="results/{host}/runs.parquet",
        regimes="results/{host}/stats/regimes.csv",
    output:
        expand("results/{{host}}/stats/regime_{table}.csv", table=REGIME_DEPTH_TABLES),
    params:
        spec=as_arg(config["regimes"]),
        out=lambda wc, output: os.path.dirname(output[0]),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    log:
        "logs/{host}/regime_depth.log",
    shell:
        "decodelab regime-depth --runs {input.runs} --regimes {input.regimes}"
        " --spec {params.spec} --out {params.out} 2> {log}"
