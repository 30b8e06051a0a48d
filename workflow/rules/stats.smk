# The stability verdicts' limits (config stats.stability): every table with verdicts gets them.
STABILITY = as_arg(SETTINGS.stability.job_spec())


rule collect:
    input:
        raw_runs,
    output:
        runs="results/{host}/runs.parquet",
        environment="results/{host}/stats/environment.csv",
    log:
        "logs/{host}/collect.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    shell:
        "decodelab collect --host {wildcards.host} --out {output.runs}"
        " --environment {output.environment} {input} 2> {log}"


rule skipped:
    output:
        "results/{host}/stats/skipped.csv",
    log:
        "logs/{host}/skipped.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        backends=" ".join(SKIPPED),
    shell:
        "decodelab skipped --host {wildcards.host} --out {output} {params.backends} 2> {log}"


rule statistics:
    input:
        "results/{host}/runs.parquet",
    output:
        latency="results/{host}/stats/latency.csv",
        kv="results/{host}/stats/kv_speedup.csv",
    log:
        "logs/{host}/statistics.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.stats.job_spec()),
        stability=STABILITY,
    shell:
        "decodelab stats --runs {input} --spec {params.spec} --stability {params.stability}"
        " --latency {output.latency} --kv {output.kv} 2> {log}"


rule stability:
    input:
        runs="results/{host}/runs.parquet",
        speculative=speculative_runs,
        parallelism=parallelism_runs,
    output:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("stability")),
    log:
        "logs/{host}/stability.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=STABILITY,
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab stability --spec {params.spec} --runs {input.runs}"
        " --speculative {input.speculative} --parallelism {input.parallelism}"
        " --out {params.out} 2> {log}"


rule regimes:
    input:
        "results/{host}/runs.parquet",
    output:
        "results/{host}/stats/regimes.csv",
    log:
        "logs/{host}/regimes.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.regimes.rule_spec()),
        stability=STABILITY,
    shell:
        "decodelab regimes --runs {input} --spec {params.spec} --stability {params.stability}"
        " --out {output} 2> {log}"


rule selection:
    input:
        runs="results/{host}/runs.parquet",
        speculative=speculative_runs,
    output:
        "results/{host}/stats/selection.csv",
    log:
        "logs/{host}/selection.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.stats.job_spec()),
        regimes=as_arg(SETTINGS.regimes.rule_spec()),
    shell:
        "decodelab selection --runs {input.runs} --speculative {input.speculative}"
        " --spec {params.spec} --regimes {params.regimes} --out {output} 2> {log}"


rule regime_depth:
    input:
        runs="results/{host}/runs.parquet",
        regimes="results/{host}/stats/regimes.csv",
    output:
        expand("results/{{host}}/stats/{table}.csv", table=tables.names("regime_depth")),
    log:
        "logs/{host}/regime_depth.log",
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=as_arg(SETTINGS.regimes.job_spec()),
        out=lambda wc, output: os.path.dirname(output[0]),
    shell:
        "decodelab regime-depth --runs {input.runs} --regimes {input.regimes}"
        " --spec {params.spec} --out {params.out} 2> {log}"
