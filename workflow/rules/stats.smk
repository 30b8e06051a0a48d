# The stability verdicts' limits (config stats.stability): the verdicts rule judges each study
# once; every table with verdicts reads its verdicts_<study>.csv.
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
        quantized=as_arg(QUANT_SKIPPED),
    shell:
        "decodelab skipped --host {wildcards.host} --out {output} --also {params.quantized}"
        " {params.backends} 2> {log}"


rule verdicts:
    input:
        lambda wc: STUDY_RUNS[wc.study](wc),
    output:
        "results/{host}/stats/verdicts_{study}.csv",
    log:
        "logs/{host}/verdicts_{study}.log",
    wildcard_constraints:
        study="|".join(STUDY_RUNS),
    conda:
        "../../envs/decodelab.yaml"
    container:
        job_container
    params:
        spec=STABILITY,
    shell:
        "decodelab verdicts --study {wildcards.study} --spec {params.spec} --out {output}"
        " {input} 2> {log}"


rule statistics:
    input:
        runs="results/{host}/runs.parquet",
        verdicts=verdict_tables("sweep"),
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
    shell:
        "decodelab stats --runs {input.runs} --spec {params.spec} --verdicts {input.verdicts}"
        " --latency {output.latency} --kv {output.kv} 2> {log}"


rule stability:
    input:
        runs="results/{host}/runs.parquet",
        speculative=speculative_runs,
        parallelism=verification_parallelism_runs,
        verdicts=verdict_tables("sweep", "speculative", "parallelism"),
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
        " --verdicts {input.verdicts} --out {params.out} 2> {log}"


rule regimes:
    input:
        runs="results/{host}/runs.parquet",
        verdicts=verdict_tables("sweep"),
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
    shell:
        "decodelab regimes --runs {input.runs} --spec {params.spec} --verdicts {input.verdicts}"
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
